// replay.cpp: the replay loop of the peers harness and the adapters of
// every allocator that needs no nvcc: PyTorch's caching allocator (through
// c10::cuda::CUDACachingAllocator::raw_alloc_with_stream / raw_delete),
// the driver's stream-ordered pool (cudaMallocFromPoolAsync /
// cudaFreeAsync), plain cudaMalloc / cudaFree, and any allocator with the
// C ABI of libtlsf.so (tlsf_malloc / tlsf_free, whose addresses peers.py
// finds with dlopen/dlsym through ctypes). peers.py builds it with
// torch.utils.cpp_extension.load_inline (adapter.h is prepended) and
// drives it; no Python runs inside the timed loop.
//
// An op list is what `tlsf-stress export` writes (see its help):
//
//   tlsf-ops 1 OPS SLOTS STREAMS PEAK_LIVE
//   a SLOT SIZE STREAM
//   f SLOT
//
// Handles passed to and from Python are addresses (uintptr_t) of objects
// this module allocates; they live until the process exits, or until the
// matching *_destroy / adapter_destroy call.
#include <pybind11/pybind11.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

namespace py = pybind11;

namespace {

// Op is one record of an op list, packed to 16 bytes.
struct Op {
  uint64_t size;    // bytes, allocations only
  uint32_t slot;    // dense block slot
  uint16_t stream;  // dense stream index, allocations only
  uint8_t free;     // 1: free, 0: allocate
};

struct Ops {
  std::vector<Op> ops;
  uint32_t slots = 0;
  uint32_t nstreams = 0;
  uint64_t peak_live = 0;
  std::vector<cudaStream_t> streams;  // index 0: the legacy default stream
};

std::runtime_error fail(const std::string& msg) { return std::runtime_error(msg); }

uintptr_t load_ops(const std::string& path) {
  FILE* f = std::fopen(path.c_str(), "r");
  if (!f) throw fail("cannot open op list " + path + ": " + std::strerror(errno));
  auto* o = new Ops();
  unsigned long long n = 0, slots = 0, nstreams = 0, peak = 0;
  int version = 0;
  if (std::fscanf(f, " tlsf-ops %d %llu %llu %llu %llu", &version, &n, &slots, &nstreams, &peak) != 5 ||
      version != 1 || slots > 0xffffffffULL || nstreams < 1 || nstreams > 0xffffULL) {
    std::fclose(f);
    delete o;
    throw fail(path + ": not a version 1 op list (tlsf-stress export writes them)");
  }
  o->slots = uint32_t(slots);
  o->nstreams = uint32_t(nstreams);
  o->peak_live = peak;
  o->ops.reserve(std::min(n, 1ULL << 24));  // n is read, not trusted
  std::vector<uint8_t> full(slots, 0);
  for (unsigned long long i = 0; i < n; i++) {
    char kind = 0;
    unsigned long long slot = 0, size = 0, stream = 0;
    Op op{};
    bool ok = std::fscanf(f, " %c %llu", &kind, &slot) == 2 && slot < slots;
    if (ok && kind == 'a') {
      ok = std::fscanf(f, " %llu %llu", &size, &stream) == 2 && size > 0 && stream < nstreams && !full[slot];
      op.size = size;
      op.stream = uint16_t(stream);
      if (ok) full[slot] = 1;
    } else if (ok && kind == 'f') {
      ok = full[slot];
      op.free = 1;
      full[slot] = 0;
    } else {
      ok = false;
    }
    if (!ok) {
      std::fclose(f);
      delete o;
      throw fail(path + ": record " + std::to_string(i + 1) + " is malformed");
    }
    op.slot = uint32_t(slot);
    o->ops.push_back(op);
  }
  std::fclose(f);
  o->streams.assign(o->nstreams, nullptr);
  for (uint32_t s = 1; s < o->nstreams; s++) {
    cudaError_t e = cudaStreamCreateWithFlags(&o->streams[s], cudaStreamNonBlocking);
    if (e != cudaSuccess) throw fail(std::string("cudaStreamCreateWithFlags: ") + cudaGetErrorString(e));
  }
  return reinterpret_cast<uintptr_t>(o);
}

py::dict ops_info(uintptr_t h) {
  auto* o = reinterpret_cast<Ops*>(h);
  py::dict d;
  d["ops"] = o->ops.size();
  d["slots"] = o->slots;
  d["streams"] = o->nstreams;
  d["peak_live_bytes"] = o->peak_live;
  return d;
}

uint64_t device_used() {
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return uint64_t(total - free);
}

// replay drives the op list through the adapter once: the timed loop,
// then (untimed) the frees of the blocks the trace leaves live, then a
// synchronisation of every stream. With sample, cudaMemGetInfo is read
// after every successful allocation and the peak of device memory in use
// returned (the loop's time is then meaningless).
py::dict replay(uintptr_t ops_h, uintptr_t adapter_h, bool sample) {
  const Ops& o = *reinterpret_cast<Ops*>(ops_h);
  const PeerAdapter a = *reinterpret_cast<PeerAdapter*>(adapter_h);
  std::vector<void*> ptr(o.slots, nullptr);
  std::vector<uint64_t> size(o.slots, 0);
  std::vector<uint16_t> stream(o.slots, 0);
  const cudaStream_t* streams = o.streams.data();
  uint64_t done = 0, failed = 0, peak_used = 0;
  std::string first_error;
  auto t0 = std::chrono::steady_clock::now();
  for (const Op& op : o.ops) {
    if (!op.free) {
      void* p = a.alloc(a.ctx, op.size, streams[op.stream]);
      if (p == nullptr) {
        if (failed++ == 0 && a.error) first_error = a.error(a.ctx);
        continue;
      }
      ptr[op.slot] = p;
      size[op.slot] = op.size;
      stream[op.slot] = op.stream;
      done++;
      if (sample) peak_used = std::max(peak_used, device_used());
      continue;
    }
    void* p = ptr[op.slot];
    if (p == nullptr) continue;  // its allocation failed
    a.release(a.ctx, p, size[op.slot], streams[stream[op.slot]]);
    ptr[op.slot] = nullptr;
    done++;
  }
  auto t1 = std::chrono::steady_clock::now();
  uint64_t left = 0;
  for (uint32_t s = 0; s < o.slots; s++) {
    if (ptr[s] == nullptr) continue;
    a.release(a.ctx, ptr[s], size[s], streams[stream[s]]);
    ptr[s] = nullptr;
    left++;
  }
  for (cudaStream_t s : o.streams) cudaStreamSynchronize(s);
  cudaGetLastError();
  double ns = double(std::chrono::duration_cast<std::chrono::nanoseconds>(t1 - t0).count());
  py::dict d;
  d["elapsed_ns"] = ns;
  d["ops"] = done;
  d["ns_per_op"] = done ? ns / double(done) : 0.0;
  d["failed"] = failed;
  d["left"] = left;
  d["peak_device_used"] = peak_used;
  d["first_error"] = first_error;
  return d;
}

// ---- PyTorch's caching allocator --------------------------------------

std::string torch_last_error;

void* torch_alloc(void*, size_t bytes, cudaStream_t s) {
  try {
    return c10::cuda::CUDACachingAllocator::raw_alloc_with_stream(bytes, s);
  } catch (const std::exception& e) {
    torch_last_error = e.what();
    auto nl = torch_last_error.find('\n');
    if (nl != std::string::npos) torch_last_error.resize(nl);
    return nullptr;
  }
}

void torch_release(void*, void* p, size_t, cudaStream_t) {
  try {
    c10::cuda::CUDACachingAllocator::raw_delete(p);
  } catch (const std::exception& e) {
    torch_last_error = e.what();
  }
}

const char* torch_error(void*) { return torch_last_error.c_str(); }

// ---- plain cudaMalloc / cudaFree ---------------------------------------

thread_local cudaError_t cuda_last = cudaSuccess;

const char* cuda_error(void*) { return cudaGetErrorString(cuda_last); }

void* cuda_alloc(void*, size_t bytes, cudaStream_t) {
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cuda_last = e;
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void cuda_release(void*, void* p, size_t, cudaStream_t) { cudaFree(p); }

// ---- the driver's stream-ordered pool -----------------------------------

void* async_alloc(void* ctx, size_t bytes, cudaStream_t s) {
  void* p = nullptr;
  cudaError_t e = cudaMallocFromPoolAsync(&p, bytes, static_cast<cudaMemPool_t>(ctx), s);
  if (e != cudaSuccess) {
    cuda_last = e;
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

void async_release(void*, void* p, size_t, cudaStream_t s) { cudaFreeAsync(p, s); }

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    cudaGetLastError();
    throw fail(std::string(what) + ": " + cudaGetErrorString(e));
  }
}

// async_pool returns the device's default pool (max_size 0) or a new pool
// of at most max_size bytes (cudaMemPoolProps.maxSize), with its release
// threshold at the maximum so that it keeps freed memory as a caching
// allocator does.
uintptr_t async_pool(uint64_t max_size) {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaMemPool_t pool;
  if (max_size == 0) {
    check(cudaDeviceGetDefaultMemPool(&pool, dev), "cudaDeviceGetDefaultMemPool");
  } else {
    cudaMemPoolProps props;
    std::memset(&props, 0, sizeof props);
    props.allocType = cudaMemAllocationTypePinned;
    props.location.type = cudaMemLocationTypeDevice;
    props.location.id = dev;
#if CUDART_VERSION >= 12020
    props.maxSize = max_size;  // cudaMemPoolProps.maxSize appeared in CUDA 12.2
#else
    throw fail("a capped cudaMemPool needs cudaMemPoolProps.maxSize (CUDA 12.2 or later)");
#endif
    check(cudaMemPoolCreate(&pool, &props), "cudaMemPoolCreate");
  }
  uint64_t threshold = std::numeric_limits<uint64_t>::max();
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold), "cudaMemPoolSetAttribute");
  return reinterpret_cast<uintptr_t>(pool);
}

void async_pool_destroy(uintptr_t h) {
  auto pool = reinterpret_cast<cudaMemPool_t>(h);
  cudaDeviceSynchronize();
  cudaMemPoolTrimTo(pool, 0);
  int dev = 0;
  cudaGetDevice(&dev);
  cudaMemPool_t def;
  if (cudaDeviceGetDefaultMemPool(&def, dev) == cudaSuccess && def != pool) cudaMemPoolDestroy(pool);
  cudaGetLastError();
}

py::dict async_pool_stats(uintptr_t h) {
  auto pool = reinterpret_cast<cudaMemPool_t>(h);
  uint64_t v = 0;
  py::dict d;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &v), "cudaMemPoolGetAttribute");
  d["peak_reserved"] = v;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &v), "cudaMemPoolGetAttribute");
  d["peak_used"] = v;
  check(cudaMemPoolGetAttribute(pool, cudaMemPoolAttrReservedMemCurrent, &v), "cudaMemPoolGetAttribute");
  d["reserved"] = v;
  return d;
}

void async_pool_reset_peaks(uintptr_t h) {
  auto pool = reinterpret_cast<cudaMemPool_t>(h);
  uint64_t zero = 0;
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReservedMemHigh, &zero), "cudaMemPoolSetAttribute");
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrUsedMemHigh, &zero), "cudaMemPoolSetAttribute");
}

// ---- the C ABI of libtlsf.so ------------------------------------------

struct CABI {
  void* (*malloc)(size_t, int, void*);
  void (*free)(void*, size_t, int, void*);
  const char* (*last_error)();
  int device;
};

void* cabi_alloc(void* ctx, size_t bytes, cudaStream_t s) {
  auto* c = static_cast<CABI*>(ctx);
  return c->malloc(bytes, c->device, s);
}

void cabi_release(void* ctx, void* p, size_t bytes, cudaStream_t s) {
  auto* c = static_cast<CABI*>(ctx);
  c->free(p, bytes, c->device, s);
}

const char* cabi_error(void* ctx) {
  auto* c = static_cast<CABI*>(ctx);
  return c->last_error ? c->last_error() : "";
}

// ---- adapters -----------------------------------------------------------

uintptr_t make(PeerAdapter a) { return reinterpret_cast<uintptr_t>(new PeerAdapter(a)); }

uintptr_t torch_adapter() { return make({torch_alloc, torch_release, nullptr, torch_error}); }
uintptr_t cuda_adapter() { return make({cuda_alloc, cuda_release, nullptr, cuda_error}); }
uintptr_t async_adapter(uintptr_t pool) {
  return make({async_alloc, async_release, reinterpret_cast<void*>(pool), cuda_error});
}
// cabi_adapter wraps the addresses of tlsf_malloc, tlsf_free and
// tlsf_last_error (0: none) of a library with the C ABI of capi/tlsf.h.
uintptr_t cabi_adapter(uintptr_t malloc_fn, uintptr_t free_fn, uintptr_t error_fn, int device) {
  auto* c = new CABI();
  c->malloc = reinterpret_cast<void* (*)(size_t, int, void*)>(malloc_fn);
  c->free = reinterpret_cast<void (*)(void*, size_t, int, void*)>(free_fn);
  c->last_error = reinterpret_cast<const char* (*)()>(error_fn);
  c->device = device;
  return make({cabi_alloc, cabi_release, c, cabi_error});
}

py::dict versions() {
  int drv = 0, rt = 0;
  cudaDriverGetVersion(&drv);
  cudaRuntimeGetVersion(&rt);
  py::dict d;
  d["cuda_driver_api"] = drv;
  d["cuda_runtime"] = rt;
  d["cudart_headers"] = CUDART_VERSION;
  return d;
}

void synchronize() { cudaDeviceSynchronize(); }

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "tlsf peers harness: one replay loop, every allocator behind a PeerAdapter";
  m.def("load_ops", &load_ops, "parse an op list (tlsf-stress export); returns a handle");
  m.def("ops_info", &ops_info);
  m.def("replay", &replay, py::arg("ops"), py::arg("adapter"), py::arg("sample") = false);
  m.def("device_used", &device_used, "device bytes in use (cudaMemGetInfo total - free)");
  m.def("torch_adapter", &torch_adapter);
  m.def("cuda_adapter", &cuda_adapter);
  m.def("async_adapter", &async_adapter);
  m.def("async_pool", &async_pool, py::arg("max_size") = 0);
  m.def("async_pool_destroy", &async_pool_destroy);
  m.def("async_pool_stats", &async_pool_stats);
  m.def("async_pool_reset_peaks", &async_pool_reset_peaks);
  m.def("cabi_adapter", &cabi_adapter);
  m.def("versions", &versions);
  m.def("synchronize", &synchronize);
}
