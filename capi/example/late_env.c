/*
 * late_env.c: TLSF_ALLOC_CONF set by the program after libtlsf.so was
 * loaded (setenv, as Python's os.environ does) is read at the first use
 * that makes a pool, and tlsf_set_memory_fraction keeps a configured
 * max_bytes as its ceiling. Run with TLSF_ALLOC_CONF unset (make capi-example does).
 * Exits 0 when every check passed, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "tlsf.h"

static uint64_t cap_of(int device) {
  tlsf_stats s;
  memset(&s, 0, sizeof s);
  s.size = sizeof s;
  if (tlsf_get_stats(device, &s) != 0) {
    fprintf(stderr, "tlsf_get_stats: %s\n", tlsf_last_error());
    return 0;
  }
  return s.cap;
}

int main(void) {
  if (getenv("TLSF_ALLOC_CONF") != NULL) {
    fprintf(stderr, "late_env: run with TLSF_ALLOC_CONF unset\n");
    return 1;
  }
  /* Set after the library was loaded, before its first use. A first use
   * that fails (device:sim has ordinals 0 to 3) leaves the configuration
   * open: it is read again at the next. */
  setenv("TLSF_ALLOC_CONF", "device:sim,sim_capacity:1GiB,max_bytes:32MiB", 1);
  void* none = tlsf_malloc(1 << 20, 7, NULL);
  CHECK(none == NULL && strstr(tlsf_last_error(), "ordinal") != NULL, "device 7 under device:sim: %p, %s",
        none, tlsf_last_error());
  setenv("TLSF_ALLOC_CONF", "device:sim,sim_capacity:1GiB,max_bytes:64MiB", 1);

  void* p = tlsf_malloc(1 << 20, 0, NULL);
  CHECK(p != NULL, "tlsf_malloc on the simulated device: %s", tlsf_last_error());
  CHECK(cap_of(0) == 64u << 20, "cap %llu, want max_bytes 64 MiB", (unsigned long long)cap_of(0));
  void* big = tlsf_malloc(128u << 20, 0, NULL);
  CHECK(big == NULL && strstr(tlsf_last_error(), "out of memory") != NULL,
        "128 MiB above a 64 MiB cap: %p, %s", big, tlsf_last_error());

  /* A fraction above max_bytes leaves it as the ceiling; one below lowers the cap. */
  tlsf_set_memory_fraction(1.0, 0);
  CHECK(tlsf_last_error()[0] == 0, "tlsf_set_memory_fraction(1.0): %s", tlsf_last_error());
  CHECK(cap_of(0) == 64u << 20, "cap %llu after a fraction of 1, want 64 MiB", (unsigned long long)cap_of(0));
  tlsf_set_memory_fraction(1.0 / 32, 0);
  CHECK(cap_of(0) == 32u << 20, "cap %llu after a fraction of 1/32 of 1 GiB, want 32 MiB", (unsigned long long)cap_of(0));

  tlsf_free(p, 1 << 20, 0, NULL);
  CHECK(tlsf_last_error()[0] == 0, "tlsf_free: %s", tlsf_last_error());
  if (failures == 0) {
    printf("late_env: all checks passed\n");
  }
  return failures == 0 ? 0 : 1;
}
