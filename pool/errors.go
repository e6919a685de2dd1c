package pool

import "errors"

// Sentinel errors. Every error a Pool returns wraps one of these (test
// with errors.Is); after any error the pool's state and statistics are as
// they were, apart from the counters of device calls, out-of-memory events
// and retries.
var (
	// ErrOutOfMemory: the request could not be met after flushing caches,
	// waiting for pending stream-ordered frees, releasing unused memory,
	// searching again and growing once more. The message gives the
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
	// ErrDoubleFree: the pointer was freed already.
	ErrDoubleFree = errors.New("pool: double free")
	// ErrUnknownPointer: the pointer is not one the pool returned: foreign,
	// or inside an allocation but not its start.
	ErrUnknownPointer = errors.New("pool: unknown pointer")
	// ErrClosed: the pool was closed.
	ErrClosed = errors.New("pool: closed")
	// ErrBadOptions: an Options field out of range.
	ErrBadOptions = errors.New("pool: bad options")
)
