// cub.cu: CUB's CachingDeviceAllocator behind a PeerAdapter (adapter.h),
// built by nvcc as an extension of its own (peers.py), so that a CUB that
// is missing or fails to compile costs only the CUB rows. The bindings are
// in cub_bind.cpp; the replay loop is replay.cpp's.
#include <cub/util_allocator.cuh>
#include <cub/version.cuh>
#include <cstdint>
#include <string>

namespace {

thread_local cudaError_t cub_last = cudaSuccess;

void* cub_alloc(void* ctx, size_t bytes, cudaStream_t s) {
  void* p = nullptr;
  cudaError_t e = static_cast<cub::CachingDeviceAllocator*>(ctx)->DeviceAllocate(&p, bytes, s);
  if (e != cudaSuccess) {
    cub_last = e;
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void cub_release(void* ctx, void* p, size_t, cudaStream_t) {
  static_cast<cub::CachingDeviceAllocator*>(ctx)->DeviceFree(p);
}

const char* cub_error(void*) { return cudaGetErrorString(cub_last); }

}  // namespace

// cub_create makes a CachingDeviceAllocator behind a new PeerAdapter and
// returns the adapter's address. bin_growth 0 means CUB's default
// configuration (bin growth 8, bins 8^3 = 512 B to 8^7 = 2 MiB, at most
// 6 MiB - 1 cached; larger blocks are allocated and freed directly);
// otherwise bins grow by bin_growth from the first power of it >= 512 B
// to the first >= 2^36 bytes, with no limit on cached bytes.
uintptr_t cub_create(unsigned bin_growth) {
  cub::CachingDeviceAllocator* a;
  if (bin_growth == 0) {
    a = new cub::CachingDeviceAllocator();
  } else {
    unsigned min_bin = 0;
    size_t b = 1;
    while (b < 512) {
      b *= bin_growth;
      min_bin++;
    }
    unsigned max_bin = min_bin;
    size_t top = b;
    while (top < (size_t(1) << 36)) {
      top *= bin_growth;
      max_bin++;
    }
    a = new cub::CachingDeviceAllocator(bin_growth, min_bin, max_bin, size_t(-1));
  }
  return reinterpret_cast<uintptr_t>(new PeerAdapter{cub_alloc, cub_release, a, cub_error});
}

// cub_destroy deletes the allocator (which frees every cached block) and
// its adapter.
void cub_destroy(uintptr_t h) {
  auto* ad = reinterpret_cast<PeerAdapter*>(h);
  cudaDeviceSynchronize();
  delete static_cast<cub::CachingDeviceAllocator*>(ad->ctx);
  delete ad;
  cudaGetLastError();
}

int cub_version() { return CUB_VERSION; }
