// Package pool is a device-memory allocator: a TLSF index (package tlsf)
// over memory taken from the CUDA driver in large pieces, with per-P
// caches for small blocks, growing and shrinking as a fraction of the
// GPU's free memory.
//
// # Three tiers
//
// Like the Go runtime's mcache → mcentral → mheap, a request goes to the
// first tier that can serve it:
//
//  1. the current P's cache (cache.go): small blocks (1 MiB and below by
//     default) on the default stream, without the pool's lock; an empty
//     cache refills from central per-class lists of blocks other Ps shed
//     (mcentral) before the index, and blocks cached by other Ps go back
//     to the index before the heap grows;
//  2. the TLSF index (package tlsf), under the pool's lock: O(1) good-fit
//     allocation and immediate coalescing, with all metadata on the CPU;
//  3. the heap (heap.go), which adds device memory to the index: a VMM
//     range whose pages are mapped on demand, one physical allocation per
//     growth (vmm.go), or cuMemAlloc'd chunks (chunks.go).
//
// A passthrough pool (passthrough.go) skips all three and calls the driver
// for every request, so that compute-sanitizer sees each allocation.
//
// # Policy
//
// Every knob is a fraction of the device's memory as cuMemGetInfo reports
// it when the decision is made (options.go): growth takes GrowFraction of
// the free memory at once, reserved memory is capped by MaxFraction of the
// memory available to the pool (free plus its own) and by MaxBytes, and
// unused memory is returned when the device runs low (FreeFloorFraction;
// a background scavenger, scavenge.go, checks even while the pool is
// idle) or recycled rather than added when the pool must map more
// (ReleaseFraction). A request that can never succeed (its block above
// the device's total memory or the cap) fails at once with
// ErrOutOfMemory, releasing nothing. Otherwise, when memory runs out, the
// pool flushes the caches, waits for pending stream-ordered frees,
// returns unused memory, searches again and grows once more before
// failing with ErrOutOfMemory; the cap is checked only after that
// release.
//
// # Stream order
//
// A block freed on a stream is reusable at once on that stream and by
// others only after an event recorded at the free (streams.go). Alloc and
// Free use stream 0, the legacy default stream: memory used on other
// streams must be freed with FreeOn on the stream of its last use, or
// after synchronizing. Memory is returned to the driver only after the
// streams that freed it are synchronized: cuMemUnmap does not wait for
// the GPU.
//
// # Rules for callers
//
// All methods of a Pool are safe for concurrent use. A pointer is freed
// once, with the pool that returned it; errors are errors.Is sentinels
// (errors.go), and after any error the pool's state and statistics are as
// before. Close returns all memory, live allocations included. Check
// verifies every invariant and is meant for tests.
package pool
