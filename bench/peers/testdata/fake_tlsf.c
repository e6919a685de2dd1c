#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
typedef struct { size_t size; uint64_t allocated, reserved, active, cached, peak_allocated, peak_reserved, num_allocs, num_frees, num_ooms, device_calls, cap; } tlsf_stats;
static tlsf_stats st;
static const uint64_t total = 144ull << 30;
void* tlsf_malloc(size_t n, int d, void* s) {
  uint64_t r = (n + 255) / 256 * 256;
  if (st.cap && st.allocated + r > st.cap) { st.num_ooms++; return NULL; }
  st.allocated += r; if (st.allocated > st.reserved) st.reserved = st.allocated;
  if (st.reserved > st.peak_reserved) st.peak_reserved = st.reserved;
  st.num_allocs++;
  return malloc(1);
}
void tlsf_free(void* p, size_t n, int d, void* s) { st.allocated -= (n + 255) / 256 * 256; st.num_frees++; free(p); }
void tlsf_init(int d) {}
int tlsf_configure(const char* c) { return 0; }
int tlsf_get_stats(int d, tlsf_stats* o) { size_t sz = o->size; tlsf_stats c = st; c.size = sz; *o = c; return 0; }
size_t tlsf_trim(int d) { size_t r = st.reserved - st.allocated; st.reserved = st.allocated; return r; }
void tlsf_set_memory_fraction(double f, int d) { st.cap = f >= 1 ? 0 : (uint64_t)(f * 0.97 * total); }
const char* tlsf_last_error(void) { return "fake out of memory"; }
