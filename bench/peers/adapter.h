// adapter.h: one allocator behind plain function pointers. Every allocator
// the peers harness measures is wrapped in a PeerAdapter, so that all of
// them are driven by the same replay loop (replay.cpp) through the same
// indirect call. Shared by replay.cpp and cub.cu (which peers.py builds
// as two extensions, so that a CUB that fails to compile costs only the
// CUB rows).
#pragma once
#include <cstddef>
#include <cuda_runtime_api.h>

struct PeerAdapter {
  // alloc returns a device pointer to bytes bytes usable on stream, or
  // nullptr when the allocator refuses (out of memory, a cap); it must not
  // throw. release frees a pointer alloc returned, with its size and
  // stream; it must not throw.
  void* (*alloc)(void* ctx, size_t bytes, cudaStream_t stream);
  void (*release)(void* ctx, void* ptr, size_t bytes, cudaStream_t stream);
  void* ctx;
  // error, if not null, returns the allocator's message for its last
  // failure ("" if none); the replay reports the first.
  const char* (*error)(void* ctx);
};
