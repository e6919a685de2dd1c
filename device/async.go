package device

// The driver's stream-ordered allocator, an optional interface.
//
// cuMemAllocAsync and cuMemFreeAsync allocate from a memory pool the
// driver keeps per device (the default pool, cuDeviceGetDefaultMemPool):
// an allocation is usable by work issued on its stream after the call, a
// free takes effect when the stream reaches it, and the pool keeps freed
// memory for reuse up to its release threshold, returning the rest at the
// next synchronization (cuStreamSynchronize, cuEventSynchronize). It is
// the peer this project's pool is measured against (trace.PeerAsync), not
// something the pool uses; so it is an interface of its own, not part of
// Device, and a Device that lacks it is still a Device.

import "fmt"

// AsyncAllocator is implemented by devices that have the driver's
// stream-ordered allocator: cuda.Device (where the driver and device
// support memory pools) and sim.Device (an emulation). Sizes
// are bytes. Every method is safe for concurrent use.
type AsyncAllocator interface {
	// MemAllocAsync allocates size bytes from the device's default memory
	// pool for use by work on stream s (cuMemAllocAsync). Errors:
	// ErrInvalidValue (size 0, unknown stream), ErrOutOfMemory,
	// ErrNotSupported (no memory pools on this driver or device).
	MemAllocAsync(size uint64, s Stream) (uintptr, error)
	// MemFreeAsync frees ptr, from MemAllocAsync, once the work queued on
	// stream s before the call is done (cuMemFreeAsync); the memory goes
	// back to the pool, not to the device. Errors: ErrInvalidValue (a
	// pointer MemAllocAsync did not return, unknown stream),
	// ErrNotSupported.
	MemFreeAsync(ptr uintptr, s Stream) error
	// MemPoolTrimTo returns unused memory of the default pool to the
	// device, keeping at least keep bytes reserved (cuMemPoolTrimTo's
	// minBytesToKeep): a pool holding keep bytes or fewer is left as it
	// is, and memory that live allocations use is never released, so the
	// pool may keep more than keep. A keep within a granule of 2^64 wraps
	// to 0 (driver 580 on the H200 released everything for 2^64 − 1;
	// sim models it). Errors: ErrNotSupported; after Close,
	// ErrInvalidValue.
	MemPoolTrimTo(keep uint64) error
	// MemPoolGetAttribute reads a 64-bit attribute of the default pool
	// (cuMemPoolGetAttribute), in bytes. Errors: ErrInvalidValue for an
	// attribute not listed with MemPoolAttribute, ErrNotSupported.
	MemPoolGetAttribute(attr MemPoolAttribute) (uint64, error)
	// MemPoolSetAttribute sets a 64-bit attribute of the default pool
	// (cuMemPoolSetAttribute): the release threshold to any value, a
	// high-water mark only to 0 (which resets it to the current value).
	// Errors: ErrInvalidValue for any other attribute or value,
	// ErrNotSupported.
	MemPoolSetAttribute(attr MemPoolAttribute, value uint64) error
}

// MemPoolAttribute names a 64-bit attribute of a memory pool; the values
// are cuda.h's CUmemPool_attribute enumerators.
type MemPoolAttribute int

// The pool attributes whose values are 64-bit byte counts.
const (
	// MemPoolReleaseThreshold (CU_MEMPOOL_ATTR_RELEASE_THRESHOLD): the
	// bytes of unused memory the pool may keep across a synchronization.
	// Default 0: everything unused is returned at the next one.
	MemPoolReleaseThreshold MemPoolAttribute = 4
	// MemPoolReservedMemCurrent (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT):
	// the device memory the pool holds, bytes. Read-only.
	MemPoolReservedMemCurrent MemPoolAttribute = 5
	// MemPoolReservedMemHigh (CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH): the
	// high-water mark of MemPoolReservedMemCurrent; set to 0 to reset.
	MemPoolReservedMemHigh MemPoolAttribute = 6
	// MemPoolUsedMemCurrent (CU_MEMPOOL_ATTR_USED_MEM_CURRENT): the bytes
	// of the pool's live allocations. Read-only.
	MemPoolUsedMemCurrent MemPoolAttribute = 7
	// MemPoolUsedMemHigh (CU_MEMPOOL_ATTR_USED_MEM_HIGH): the high-water
	// mark of MemPoolUsedMemCurrent; set to 0 to reset.
	MemPoolUsedMemHigh MemPoolAttribute = 8
)

// String returns the cuda.h name, e.g. "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD".
func (a MemPoolAttribute) String() string {
	if a.Valid() {
		return "CU_MEMPOOL_ATTR_" + [...]string{"RELEASE_THRESHOLD", "RESERVED_MEM_CURRENT",
			"RESERVED_MEM_HIGH", "USED_MEM_CURRENT", "USED_MEM_HIGH"}[a-MemPoolReleaseThreshold]
	}
	return fmt.Sprintf("MemPoolAttribute(%d)", int(a))
}

// Valid reports whether a is one of the attributes above; implementations
// reject any other with ErrInvalidValue.
func (a MemPoolAttribute) Valid() bool {
	return a >= MemPoolReleaseThreshold && a <= MemPoolUsedMemHigh
}
