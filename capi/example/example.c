/*
 * example.c: a C program on the pool through libtlsf.so (make capi builds
 * both). It allocates and frees, shows the error contract on bad input,
 * runs several threads at once, prints the statistics, and times a
 * malloc+free pair from one thread (median of 7 runs, warm).
 *
 * On the simulated device (no GPU needed):
 *     TLSF_ALLOC_CONF=device:sim bin/tlsf-example
 * On a GPU:
 *     bin/tlsf-example
 * Exits 0 when every check passed, 1 otherwise.
 */
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check.h"
#include "tlsf.h"

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

/* Each thread allocates and frees, and checks that its own error message
 * is its own. */
static void* worker(void* arg) {
  long id = (long)arg;
  void* ptrs[64];
  for (int round = 0; round < 200; round++) {
    for (int i = 0; i < 64; i++) {
      size_t size = (size_t)(256 + ((i * 7919 + round * 31 + id * 104729) % 65536));
      ptrs[i] = tlsf_malloc(size, 0, NULL);
      if (ptrs[i] == NULL) {
        fprintf(stderr, "thread %ld: tlsf_malloc(%zu): %s\n", id, size, tlsf_last_error());
        return (void*)1;
      }
    }
    for (int i = 0; i < 64; i++) {
      tlsf_free(ptrs[i], 0, 0, NULL);
      if (tlsf_last_error()[0] != 0) {
        fprintf(stderr, "thread %ld: tlsf_free: %s\n", id, tlsf_last_error());
        return (void*)1;
      }
    }
    /* A bad free on this thread sets this thread's message only (an
     * unaligned pointer: never another thread's block), and the next call
     * clears it. */
    if (round % 50 == 0) {
      char want[64];
      snprintf(want, sizeof want, "%#lx", 0x11 + id);
      tlsf_free((void*)(0x11 + id), 0, 0, NULL);
      if (strstr(tlsf_last_error(), "unknown pointer") == NULL || strstr(tlsf_last_error(), want) == NULL) {
        fprintf(stderr, "thread %ld: bad free gave \"%s\"\n", id, tlsf_last_error());
        return (void*)1;
      }
    }
  }
  return NULL;
}

int main(void) {
  tlsf_stats st;

  /* Which build is loaded, and whether it speaks this header's ABI. */
  int abi = 0;
  printf("library: %s\n", tlsf_version(&abi));
  CHECK(abi == TLSF_ABI_VERSION, "libtlsf.so implements ABI %d, tlsf.h declares %d", abi, TLSF_ABI_VERSION);

  /* Allocate, write nothing (the pointer is a device pointer), free. */
  void* p = tlsf_malloc(1 << 20, 0, NULL);
  CHECK(p != NULL, "tlsf_malloc(1 MiB): %s", tlsf_last_error());
  CHECK(((uintptr_t)p & 255) == 0, "pointer %p not 256-byte aligned", p);
  void* q = tlsf_malloc(100 << 20, 0, NULL);
  CHECK(q != NULL, "tlsf_malloc(100 MiB): %s", tlsf_last_error());
  printf("allocated %p (1 MiB) and %p (100 MiB)\n", p, q);

  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK(tlsf_get_stats(0, &st) == 0, "tlsf_get_stats: %s", tlsf_last_error());
  CHECK(st.size == sizeof st, "size %zu", st.size);
  CHECK(st.allocated >= (101u << 20), "allocated %llu", (unsigned long long)st.allocated);
  CHECK(st.reserved >= st.allocated, "reserved %llu below allocated", (unsigned long long)st.reserved);
  tlsf_free(p, 1 << 20, 0, NULL);
  tlsf_free(q, 100 << 20, 0, NULL);
  CHECK(tlsf_last_error()[0] == 0, "tlsf_free: %s", tlsf_last_error());

  /* Bad input: NULL or -1 and a message, never a crash. */
  CHECK(tlsf_malloc(0, 0, NULL) == NULL && tlsf_last_error()[0] == 0, "size 0: %s", tlsf_last_error());
  CHECK(tlsf_malloc((size_t)1 << 62, 0, NULL) == NULL, "4 EiB allocated");
  printf("4 EiB: %s\n", tlsf_last_error());
  CHECK(tlsf_malloc(4096, -1, NULL) == NULL && strstr(tlsf_last_error(), "device") != NULL,
        "device -1: %s", tlsf_last_error());
  tlsf_free(q, 0, 0, NULL);
  printf("double free: %s\n", tlsf_last_error());
  CHECK(strstr(tlsf_last_error(), "double free") != NULL, "double free: %s", tlsf_last_error());
  tlsf_free((void*)0x1234, 0, 0, NULL);
  CHECK(strstr(tlsf_last_error(), "unknown pointer") != NULL, "unknown pointer: %s", tlsf_last_error());
  tlsf_free(NULL, 0, 0, NULL);
  CHECK(tlsf_last_error()[0] == 0, "free(NULL): %s", tlsf_last_error());
  CHECK(tlsf_configure("backend:vmm") == -1, "tlsf_configure after first use succeeded");
  printf("late configure: %s\n", tlsf_last_error());
  CHECK(tlsf_configure("colour:blue") == -1 && strstr(tlsf_last_error(), "colour") != NULL,
        "unknown key: %s", tlsf_last_error());
  CHECK(tlsf_get_stats(0, NULL) == -1, "tlsf_get_stats(NULL) succeeded");
  tlsf_record_stream((void*)0x1234, NULL);
  CHECK(tlsf_last_error()[0] != 0, "record_stream of a foreign pointer: no message");

  /* Several threads at once. */
  enum { nthreads = 4 };
  pthread_t th[nthreads];
  for (long i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, worker, (void*)i);
  for (int i = 0; i < nthreads; i++) {
    void* rc;
    pthread_join(th[i], &rc);
    CHECK(rc == NULL, "thread %d failed", i);
  }

  /* A malloc+free pair from one thread, warm: the first pairs fill the
   * caches. */
  enum { pairs = 200000, runs = 7 };
  double ns[runs];
  for (int i = 0; i < 10000; i++) tlsf_free(tlsf_malloc(4096, 0, NULL), 4096, 0, NULL);
  for (int r = 0; r < runs; r++) {
    double t0 = now_ns();
    for (int i = 0; i < pairs; i++) {
      void* x = tlsf_malloc(4096, 0, NULL);
      tlsf_free(x, 4096, 0, NULL);
    }
    ns[r] = (now_ns() - t0) / pairs;
  }
  qsort(ns, runs, sizeof ns[0], cmp_double);
  printf("malloc+free pair (4 KiB, one thread, warm): median %.0f ns (min %.0f, max %.0f) over %d runs of %d\n",
         ns[runs / 2], ns[0], ns[runs - 1], runs, pairs);

  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK(tlsf_get_stats(0, &st) == 0, "tlsf_get_stats: %s", tlsf_last_error());
  CHECK(st.allocated == 0, "allocated %llu after freeing everything", (unsigned long long)st.allocated);
  printf("stats: allocated %llu, reserved %llu, active %llu, cached %llu, peak allocated %llu, "
         "peak reserved %llu, allocs %llu, frees %llu, ooms %llu, device calls %llu, cap %llu\n",
         (unsigned long long)st.allocated, (unsigned long long)st.reserved, (unsigned long long)st.active,
         (unsigned long long)st.cached, (unsigned long long)st.peak_allocated,
         (unsigned long long)st.peak_reserved, (unsigned long long)st.num_allocs,
         (unsigned long long)st.num_frees, (unsigned long long)st.num_ooms,
         (unsigned long long)st.device_calls, (unsigned long long)st.cap);
  size_t released = tlsf_trim(0);
  CHECK(tlsf_last_error()[0] == 0, "tlsf_trim: %s", tlsf_last_error());
  printf("trim released %zu bytes\n", released);

  /* Where the driver calls came from: by path, and one entry point. */
  static const char* const paths[TLSF_NUM_PATHS] = {"other", "setup", "alloc", "out_of_memory", "scavenge", "trim"};
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  CHECK(tlsf_get_stats(0, &st) == 0, "tlsf_get_stats: %s", tlsf_last_error());
  uint64_t sum = 0;
  printf("device calls by path:");
  for (int i = 0; i < TLSF_NUM_PATHS; i++) {
    sum += st.device_calls_by_path[i];
    printf(" %s %llu", paths[i], (unsigned long long)st.device_calls_by_path[i]);
  }
  printf("; released %llu bytes\n", (unsigned long long)st.released);
  CHECK(sum == st.device_calls, "calls by path sum to %llu, not %llu", (unsigned long long)sum,
        (unsigned long long)st.device_calls);
  CHECK(st.device_calls_by_path[TLSF_PATH_TRIM] > 0, "the trim made no driver call");
  uint64_t maps = 0;
  CHECK(tlsf_get_device_calls(0, TLSF_PATH_ALL, "cuMemMap", &maps) == 0, "tlsf_get_device_calls: %s",
        tlsf_last_error());
  printf("cuMemMap calls: %llu\n", (unsigned long long)maps);
  CHECK(tlsf_get_device_calls(0, TLSF_PATH_ALL, "cuMemMapp", &maps) == -1, "a misspelt entry point was accepted");

  if (failures) {
    printf("example: %d checks FAILED\n", failures);
    return 1;
  }
  printf("example: all checks passed\n");
  return 0;
}
