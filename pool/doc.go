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
//  1. the current P's cache (cache.go): small blocks (4 KiB and below by
//     default) on the default stream, without the pool's lock, once
//     goroutines contend for that lock (CacheOptions.Eager: from the
//     start; one goroutine's blocks go to the index, where they merge with
//     their free neighbours at once); an empty
//     cache refills from central per-class lists of blocks other Ps shed
//     (mcentral) before the index, the caches of Ps that stopped
//     allocating are adopted by the current P, and the central lists go
//     back to the index before the heap grows; a free first checks a VMM
//     pool's filter of the 64 KiB granules where a cached block ever
//     started (a chunk pool probes the P's table), which a sized free
//     (FreeSizedOn; tlsf_free with PyTorch's size) skips: a large size
//     goes to the lock, a small one to the P's table;
//  2. the TLSF index (package tlsf), under the pool's lock (biased toward
//     a goroutine that uses the pool alone, which then takes it with no
//     locked instruction: bias.go): best fit
//     within the request's own second-level list (tlsf.Index.AllocFit,
//     at most tlsf.FitScan blocks read, the rest of the list only where
//     no later list has a block), else the O(1) good fit of TLSF
//     §3.3 (Options.GoodFit for good fit alone), and immediate coalescing,
//     with all metadata on the CPU; a VMM heap's free top is kept for
//     requests no other block holds once fragmentation is severe, until
//     every block is freed (severeFragmentation; Options.Wilderness: from
//     the start). Small and large blocks share one heap: small ones fill
//     the gaps large ones leave. Giving blocks of up to 1 MiB a heap of
//     their own, as PyTorch's small pool does, was measured on the nine
//     traces (simulated H200, 2026-12-04, peak reserved over peak live,
//     two pools on one device): lstm 1.120 against 1.032 (PyTorch's
//     expandable segments: 1.120), tdnn 1.203 against 1.193, llama-bf16
//     1.067 against 1.059, better only on deeplab (1.035 against 1.040),
//     resnet50-infer (1.145 against 1.151) and bert; and taking the
//     smallest block of the next non-empty list rather than its head,
//     lstm 1.057;
//  3. the heap (heap.go), which adds device memory to the index: a VMM
//     range whose pages are mapped on demand, one physical allocation per
//     growth (vmm.go), or cuMemAlloc'd chunks (chunks.go).
//
// A passthrough pool (passthrough.go) skips all three and calls the driver
// for every request, so that compute-sanitizer sees each allocation.
// Pooled blocks are shown to compute-sanitizer through the NVTX memory API
// when the tool is attached (nvtx.go), and guard mode (Options.Guard,
// guard.go) catches overruns without it; both live in the debug layer
// (debug.go), which costs one nil test per Alloc and Free when off.
//
// # Policy
//
// The knobs are fractions, not byte counts, so that one setting fits a
// big job and many small ones (options.go): growth takes GrowFraction of
// the device's free memory at once, reserved memory is capped by
// MaxFraction of the device's total memory and by MaxBytes, and unused
// memory is returned when the device runs low (FreeFloorFraction of
// total; a background scavenger, scavenge.go, checks even while the pool
// is idle), by a pool idle for IdleRelease (500 ms) once another process
// started or grew, or recycled rather than added when the pool must map
// more (ReleaseFraction).
//
// # Sharing a GPU
//
// MaxFraction is a fraction of the device's total memory T (cuMemGetInfo
// at New), the process's CUDA context counted in: a pool's cap is
// c = MaxFraction × T − C, where C is what the share leaves for the
// process's own context: the device's memory in use at New (T − free: the
// contexts, and whatever was allocated before), at most T/256 and at most
// half the share (contextShareDivisor in pool.go). On an H200 (T = 143156
// MiB as cuMemGetInfo reports it) T/256 is 559 MiB, and a context holds
// 526 MiB (sim.H200ContextBytes); on GPUs below about 132 GiB T/256 is
// less than a context. So the cap does not depend on how much other
// processes hold, and on who started first only by what a first
// process's context held below the bound (33 MiB on an H200). With K
// processes, on a GPU whose contexts hold at most T/256 each:
//
//   - Started together, each with MaxFraction 1/K: the caps add up to
//     T − ΣC, and each context holds no more than its C, so every process
//     can reach its cap while the others hold theirs, and K identical
//     jobs end with equal shares, T/K − C each (max share / min share =
//     1, to the page, where each found another context in use at New;
//     else within the 33 MiB above). On an H200 and K = 2, 3, 4: 71019,
//     47159, 35230 MiB each (T/K − T/256; the caps tlsf-stress multi
//     reported there).
//   - Started one after another: when job j starts, jobs 1..j−1 hold at
//     most (j−1)·(T/K − C) beside their contexts, so at least T/K − C is
//     free for job j beside its own, and job j reaches its cap too: the
//     order changes the caps by the 33 MiB above at most.
//   - Fractions adding up to more than 1 promise more than there is: each
//     pool still stops at its cap, but the device serves whoever maps
//     first, and a late job gets what is free. Σ MaxFraction ≤ 1 is the
//     condition for predictable shares.
//
// On a GPU whose contexts hold more than T/256, the caps at 1/K add up to
// a little more than the device holds beside the contexts: MaxFraction =
// 1/K − 1% leaves the room (below).
//
// The rule it replaces, a fraction of what is available at each decision
// (free plus the pool's own), makes the cap a race: with two jobs at 1/2,
// one holding a leaves the other (T − a)/2, so the first to grow takes
// more (1.44× apart on an H200), and two jobs that both sit at their caps
// leave a third of the GPU unused (a = b = T/3).
//
// "A fraction of free memory" keeps its meaning where it matters for a
// job that starts on a busy GPU: growth steps are GrowFraction of what is
// free when the pool grows (small steps on a full GPU), the floor
// (FreeFloorFraction) watches free memory, and a pool never holds more
// than the device can give: on a GPU where others hold U, it reaches
// min(c, T − U). A job that wants "half of what is free now" computes
// MaxFraction = 0.5 × free / total from cuMemGetInfo before New.
//
// Why the context counts: every CUDA context holds device memory of its
// own, and caps of T/K each could not all be held at once. The device ran
// out for one process before its cap, leaving it less room than the
// others above its 90% line, and it moved pages for its requests more
// often: on the H200 (tlsf-stress multi, K = 4), 1.2 to 1.5 driver calls
// per operation against 0.7 to 0.9 for the others (contextShareDivisor
// says more). Memory used outside the pools beyond a
// context (cuBLAS workspaces, other programs), and a context larger than
// the bound, still count against no cap: a job that must never meet a
// full device leaves room for them, e.g. MaxFraction = 1/K − 1% (1.4 GiB
// on an H200).
//
// A job that asks for more than its share gets ErrOutOfMemory; for 256
// allocations after a failure, a request that would take it above 90% of
// its cap fails at once, without gathering free pages. A job idle for
// IdleRelease (500 ms by default) gives its unused memory back once
// another process started or grew, so a job started after it gets it
// within about a second; FreeFloorFraction makes a job, idle or not,
// keep a fraction of the device free. Through the C
// ABI the cap is max_fraction in TLSF_ALLOC_CONF, or
// torch.cuda.set_per_process_memory_fraction (which sets a byte cap,
// MaxBytes: it counts no context and declares no share, below).
//
// There is nothing else to set: a capped pool maps one-page physical
// allocations, so that its memory can move 2 MiB at a time to fit its
// cap, but a MaxFraction of at most one half, which leaves room for
// another job as large, declares the device shared, and its growths map
// each block's interior in handles of up to a 2048th of its cap from the
// start (jobs started together each grow alone at first; alone on its
// GPU, such a job's smallest feasible cap rises by up to 0.6% of peak
// live on the nine traces: declaredShareFraction in pool.go); and while
// other processes hold a sixteenth of the device or more,
// or a 128th (and 1 GiB) more than the least they held since New (so that
// jobs started together, which each see the others hold little at
// first, find out soon), as its last growth found, its growths, and its
// mappings of released pages under a block, map each block's interior in
// larger ones (up to a 1024th of its cap; below a cap of 8 GiB, 8 MiB or
// a 256th of it), as moving memory between processes page by page costs
// a driver call per 2 MiB (Pool.setShared in pool.go).
//
// # Out of memory
//
// A request that can never succeed (its block above the device's total
// memory or the cap) fails at once with ErrOutOfMemory, releasing nothing.
// Otherwise, when memory runs out, the pool flushes the caches, waits for
// pending stream-ordered frees and searches again; where the block found
// lies on released pages, it moves just the pages the block lacks from
// under other free blocks (cuMemUnmap and cuMemMap of kept physical
// memory, no cuMemRelease or cuMemCreate), else it moves what the request
// needs and grows once more (for a request within 90% of its cap keeping
// all of that memory, so that no other process can take it in between);
// then it fails with ErrOutOfMemory. It remembers the failure, so that
// until it next frees a block, a request at least as large fails without
// repeating the work; and for 256 allocations after a failure (those made
// under the pool's lock: the per-P caches' are not counted) it gathers
// no scattered pages above 90% of its cap, so that a job asking for more
// than its share fails fast instead of thrashing. Once the driver refuses
// it a cuMemCreate for want of memory, the memory it holds becomes a
// limit: it backs released pages with its own memory, moved as above, and
// maps new memory past the limit only where cuMemGetInfo (one call)
// reports room: for every request within 90% of its cap (all of them
// without a cap), which then raises the limit to what it maps, and for one
// in 16 of the others, which lifts the limit when it finds room. Unused
// memory goes back to other processes through FreeFloorFraction,
// IdleRelease or Trim, not on every error (share.go).
//
// # Stream order
//
// A block freed on a stream is reusable at once on that stream and by
// others only after an event recorded at the free (streams.go). Alloc and
// Free use stream 0, the legacy default stream: memory used on other
// streams must be freed with FreeOn on the stream of its last use, or
// after synchronizing. Memory is returned to the driver only after the
// streams that freed it are synchronized: cuMemUnmap does not wait for
// the GPU. RecordStream marks a block as used by another stream too, as
// PyTorch's Tensor.record_stream: its free then waits for events on every
// recorded stream (record.go). Call ForgetStream before destroying a
// stream: see "Destroyed streams" in streams.go.
//
// # Watching a pool
//
// Stats (stats.go) gives the counters, peaks (ResetPeaks) and allocation
// counts by size; Size a live block's usable size. With Options.History
// the pool records its last events (history.go), and Snapshot
// (snapshot.go) gives every segment of device memory with its blocks and
// that history, written by Snapshot.WritePickle in the format of
// torch.cuda.memory._snapshot() for PyTorch's memory viewer.
// Options.OnOutOfMemory runs before an out-of-memory failure, without the
// pool's lock, and the pool retries once; Options.Logger receives growth,
// release, trim and out-of-memory events (observe.go). Package
// pool/poolmetrics exports Stats to Prometheus.
//
// # Rules for callers
//
// All methods of a Pool are safe for concurrent use. A pointer is freed
// once, with the pool that returned it (Free(0) is a no-op, as
// cudaFree(NULL) is); errors are errors.Is sentinels
// (errors.go). After an error every live allocation is as it was and so
// are the pool's state and statistics, with the exceptions listed at the
// top of errors.go: the counters of device calls, out-of-memory events
// and retries; caches emptied and memory released or moved by the
// out-of-memory path before it fails; the growth kept by a guard-mode
// red-zone fill that failed; and what a Trim failing midway did before
// the failure. Close returns all memory, live allocations included.
// Check verifies every invariant and is meant for tests.
package pool
