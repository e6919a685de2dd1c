package pool

import "errors"

// Sentinel errors. Every error a Pool returns wraps one of these (test
// with errors.Is), or, where the driver failed for a reason other than
// memory, the driver's error (device.Err* sentinels, *device.Error).
// After an error every live allocation is as it was and
// so are the statistics, apart from the counters of device calls,
// out-of-memory events and retries, and except that the out-of-memory
// path, before it fails, may have emptied the caches and returned unused
// memory to the driver (Cached and Reserved then drop).
var (
	// ErrOutOfMemory: the request could not be met after flushing caches,
	// waiting for pending stream-ordered frees, releasing unused memory,
	// searching again and growing once more; or, at once and releasing
	// nothing, a request whose block exceeds the device's total memory or
	// the cap (MaxBytes, MaxFraction × total). The message gives the
	// request, allocated and reserved bytes, the largest free block and the
	// device's free and total memory. When the driver itself ran out, the
	// error also wraps device.ErrOutOfMemory.
	ErrOutOfMemory = errors.New("pool: out of memory")
	// ErrInvalidSize: a size of zero, or a pitch allocation with zero width
	// or height.
	ErrInvalidSize = errors.New("pool: invalid size")
	// ErrTooLarge: a size the pool can never serve: above tlsf.MaxSize,
	// above the virtual range of a VMM pool, or a pitch allocation whose
	// pitch × height overflows.
	ErrTooLarge = errors.New("pool: size too large")
	// ErrDoubleFree: the pointer was freed already. A pointer that lies
	// in the free space of a pooled backend's index may also be one the
	// pool never returned: that error matches ErrUnknownPointer too.
	ErrDoubleFree = errors.New("pool: double free")
	// ErrUnknownPointer: the pointer is not one the pool returned: foreign,
	// or inside an allocation but not its start (see ErrDoubleFree for
	// pointers into free space).
	ErrUnknownPointer = errors.New("pool: unknown pointer")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("pool: closed")
	// ErrBadOptions: an Options field out of range.
	ErrBadOptions = errors.New("pool: bad options")
)
