// Package nvtx is a client of the NVTX memory API, in Go without cgo:
// it tells a memory checker (compute-sanitizer) which device memory a
// sub-allocator holds and which blocks of it are in use, so that an
// access outside a live block is reported even though the driver sees
// only the large pieces the allocator took.
//
// # How a tool attaches
//
// A tool that honours NVTX sets NVTX_INJECTION64_PATH to its injection
// library for the program it runs (compute-sanitizer 2025.3.1 sets
// libsanitizer-collection.so). NVTX's C headers compile a small loader
// into every program that uses them; this package is that loader:
//
//  1. dlopen the library (purego.Dlopen) and find its entry points
//     InitializeInjectionNvtx2 and InitializeInjectionNvtxExtension;
//  2. call InitializeInjectionNvtx2 with our nvtxGetExportTable, a
//     callback (purego.NewCallback) returning two export tables: the
//     callbacks table, whose GetModuleFunctionTable hands the tool one
//     function table per core module (core, CUDA, OpenCL, CUDA runtime,
//     core 2, sync; the tool checks each table's size and writes its
//     functions into our slots), and the version table (NVTX version 3);
//  3. create a domain through the core-2 slot nvtxDomainCreateA;
//  4. call InitializeInjectionNvtxExtension with the memory extension's
//     module info (module 1, compatibility 0x0102) and one segment of
//     function slots (segment ID 1, 63 slots) indexed by function ID as
//     the CUDA 13 toolkit's nvToolsExtMem.h numbers them, from 0
//     (nvtxMemHeapRegister 0, nvtxMemRegionsUnregister 5), which the
//     tool fills. Older NVTX releases on GitHub declare segment 0 with
//     17 slots and number from 1: compute-sanitizer 2025.3.1 fills no
//     slot of such a segment (checked on an H200; SegmentEnv overrides
//     the segment for trying other tools);
//  5. call those slots: heap register and unregister, regions register
//     and unregister (layout.go has the structures).
//
// The layouts are those of NVIDIA's nvToolsExtMem.h, nvtxDetail/
// nvtxTypes.h and nvtxDetail/nvtxExtTypes.h (NVTX 3), for 64-bit Linux;
// layout_test.go asserts every size and offset.
//
// # Memory
//
// The tool keeps pointers to the export tables, function tables, slot
// arrays and module info, and may read descriptors during a call: all of
// them live in one anonymous mapping (syscall.Mmap) that is never
// unmapped, outside the Go heap, so the garbage collector neither moves
// nor frees them. Calls are serialized by a mutex: they share the
// descriptor scratch space.
//
// # Cost
//
// Default returns nil when NVTX_INJECTION64_PATH is unset: callers test
// one pointer. With a tool attached each call is one C call into it.
package nvtx
