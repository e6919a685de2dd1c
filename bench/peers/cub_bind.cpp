// cub_bind.cpp: Python bindings of cub.cu (compiled by the host compiler
// with torch's headers, as load_inline requires).
#include <pybind11/pybind11.h>
#include <cstdint>

uintptr_t cub_create(unsigned bin_growth);
void cub_destroy(uintptr_t h);
int cub_version();

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tlsf peers harness: CUB's CachingDeviceAllocator behind a PeerAdapter";
  m.def("cub_create", &cub_create, "make a CachingDeviceAllocator (bin growth 0: CUB's defaults); returns an adapter handle");
  m.def("cub_destroy", &cub_destroy);
  m.def("cub_version", &cub_version);
}
