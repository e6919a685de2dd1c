package pool

import "errors"

// Sentinel errors. Every error a Pool returns wraps one of these (test
// with errors.Is), or, where the driver failed for a reason other than
// memory, the driver's error (device.Err* sentinels, *device.Error), or,
// for a broken invariant that Check found, tlsf.ErrCorrupt.
// After an error every live allocation is as it was and
// so are the statistics, apart from the counters of device calls,
// out-of-memory events and retries, and except that the out-of-memory
// path, before it fails, may have emptied the caches and returned unused
// memory to the driver (Cached and Reserved then drop), that a VMM pool,
// before it fails, may have moved unused memory from under free blocks
// to where the request would go (RecycledBytes, and Releases and
// ReleasedBytes for what it released instead, grow; a later request may
// find the moved memory where it needs it), that in guard mode a
// red-zone fill failing after the block was allocated (Options.Guard)
// leaves the switch its growth made (Stats.TopKept), and that a Trim
// failing midway keeps what it did before the failure (Pool.Trim).
var (
	// ErrOutOfMemory: the request could not be met after flushing caches,
	// waiting for pending stream-ordered frees, releasing unused memory,
	// searching again and growing once more (and, with
	// Options.OnOutOfMemory, after the hook and one more try); or, at once
	// and releasing nothing, a request whose block exceeds the device's
	// total memory or the cap (MaxBytes, Options.MaxFraction's). The message
	// gives the request, allocated and reserved bytes, the cap, the
	// largest block that could be allocated now (within the cap and the
	// device's free memory; a VMM pool also names its largest free block
	// of address space) and the device's free and total memory. When the
	// driver itself ran out, or the block exceeds the device's total memory
	// (the driver's answer, given without asking it), the error also wraps
	// device.ErrOutOfMemory. A request too large for any pool fails with
	// ErrTooLarge instead (below): on a VMM pool, one above its virtual
	// range (Options.VirtualSize) that neither the device's total memory
	// nor the cap excludes, which only a VirtualSize set below them
	// allows.
	ErrOutOfMemory = errors.New("pool: out of memory")
	// ErrInvalidSize: a size of zero, or a pitch allocation with zero width
	// or height.
	ErrInvalidSize = errors.New("pool: invalid size")
	// ErrTooLarge: a size the pool can never serve: above tlsf.MaxSize,
	// above the virtual range of a VMM pool (Options.VirtualSize) within
	// the device's total memory and the cap (beyond either, the request is
	// ErrOutOfMemory, as in every backend), or a
	// pitch allocation whose pitch × height overflows. It does not match
	// ErrOutOfMemory: a caller that shrinks its batch on a failure for
	// want of memory checks for both.
	ErrTooLarge = errors.New("pool: size too large")
	// ErrDoubleFree: the pointer was freed already. A pointer that lies
	// in the free space of a pooled backend's index may also be one the
	// pool never returned: that error matches ErrUnknownPointer too, and
	// the index's tlsf.ErrDoubleFree (Free, FreeOn, FreeSized, FreeSizedOn,
	// Size, RecordStream).
	ErrDoubleFree = errors.New("pool: double free")
	// ErrUnknownPointer: the pointer is not one the pool returned: foreign,
	// or inside an allocation but not its start (see ErrDoubleFree for
	// pointers into free space). Where a pooled backend's index found no
	// block there (outside its regions, or inside an allocated block), the
	// error also matches the index's tlsf.ErrUnknownAddress (Free, FreeOn,
	// FreeSized, FreeSizedOn, Size, RecordStream).
	ErrUnknownPointer = errors.New("pool: unknown pointer")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("pool: closed")
	// ErrBadOptions: an Options field out of range.
	ErrBadOptions = errors.New("pool: bad options")
	// ErrCorrupted: guard mode (Options.Guard) found a red zone changed:
	// something wrote past the end of a block. The message names the
	// block's address and size and the first changed byte. The block is
	// not freed; its red zone is filled again, so a second Free frees it.
	ErrCorrupted = errors.New("pool: memory corrupted")
	// ErrNoPeerAccess: a device named in Options.PeerAccess or
	// GrantPeerAccess cannot access the pool's device: the device is not
	// a device.PeerAccessor, or cuDeviceCanAccessPeer says no. The message
	// names the pair.
	ErrNoPeerAccess = errors.New("pool: no peer access")
)
