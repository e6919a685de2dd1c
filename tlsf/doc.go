// Package tlsf is a two-level segregated fit (TLSF) index over abstract
// address ranges: O(1) allocation and free with immediate coalescing, all
// metadata kept out of band.
//
// # The algorithm
//
// TLSF (Masmano, Ripoll, Crespo, Real, "TLSF: a new dynamic memory allocator
// for real-time systems", ECRTS 2004, §3–4; and Real-Time Systems 2008)
// keeps free blocks in segregated lists. A size maps to a first-level index
// fl (the power of two below it) and a second-level index sl (one of 2^SLLog2
// equal slices of that power of two). One bit per non-empty list, in a
// first-level bitmap (FL bitmap) and one second-level bitmap (SL bitmap) per
// fl, lets find-first-set locate the smallest non-empty suitable list in two
// steps, whatever the number of blocks.
//
// Mapping insert puts a free block of size s in the list whose size class
// contains s. Mapping search rounds a request up to the next class boundary
// first ("good fit"), so any block in the list it finds is large enough
// without scanning. This index then keeps the allocated block at that
// rounded size rather than the requested one: a block freed and requested
// again at the same size is found again, in the very list it went back to
// (the failure where a freed block of exactly the right size sits one list
// below the search is a known TLSF bug class). The cost is internal
// fragmentation below 1/2^SLLog2 of a block (3.1% at the default 32 lists).
//
// Freeing merges the block with its free physical neighbours at once
// (block_merge_prev / block_merge_next), so no two adjacent blocks are ever
// both free.
//
// # Out-of-band metadata
//
// Device memory cannot be read by the CPU, so unlike C implementations that
// write headers into the heap, every block is a record in one slice and
// links are uint32 indexes into it: the Go garbage collector scans no
// per-block pointers, and records of merged blocks are recycled. Allocated
// blocks are found by address through an open-addressing hash table.
//
// # Regions
//
// The index manages regions: disjoint address ranges added with AddRegion,
// grown at their end with GrowRegion (a pool's virtual heap is one range
// that grows), and removed with RemoveRegion once wholly free. Blocks never
// merge across regions, even adjacent ones. A split or merge that changes a
// region's top block finds the region by binary search, O(log regions):
// O(1) for a pool's one growing heap, and a few steps for a chunk pool's
// chunks.
//
// # Rules for callers
//
// Addresses and sizes are bytes. Regions and blocks are multiples of the
// granularity (default 256 bytes, the alignment cudaMalloc guarantees),
// which is also the minimum block. The largest block is MaxSize (2^48
// bytes). Every error is an errors.Is sentinel and leaves the index
// unchanged. An Index is not safe for concurrent use: callers serialise
// access (the pool holds a mutex). Check verifies every invariant and is
// meant for tests.
package tlsf
