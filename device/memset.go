package device

// Byte fills, an optional interface.
//
// The pool's guard mode (pool.Options.Guard) writes a pattern into the
// red zone after every block: the zone starts where the caller's bytes
// end, at any byte address, so it needs a fill of single bytes, which
// MemsetD32 (4-byte aligned words) cannot do. Few callers need it, so it
// is an interface of its own, not part of Device.

// ByteSetter is implemented by devices that fill single bytes:
// cuda.Device and sim.Device. Safe for concurrent use.
type ByteSetter interface {
	// MemsetD8Async sets n bytes at ptr, which may have any alignment, to
	// value, queued on stream s (cuMemsetD8Async). n = 0 does nothing.
	// Errors: ErrInvalidValue (unknown stream), ErrIllegalAddress on the
	// simulated device (a byte not allocated or not mapped), the driver's
	// *Error.
	MemsetD8Async(ptr uintptr, value byte, n uint64, s Stream) error
}

// ByteStorer is implemented by devices that can make the GPU itself store
// a byte, as a kernel would: cuda.Device (a one-thread PTX kernel,
// cuLaunchKernel) and sim.Device (the store applied to its shadow
// memory). Tools that watch kernels' memory accesses (compute-sanitizer)
// see these stores, not those of memsets or copies. Safe for concurrent
// use.
type ByteStorer interface {
	// StoreByte queues on stream s a store of value at the device address
	// ptr. A store to memory not allocated or not mapped fails at once on
	// the simulated device (ErrIllegalAddress) and at the next
	// synchronization on a GPU. Errors: ErrNotSupported, ErrInvalidValue
	// (unknown stream), ErrIllegalAddress, the driver's *Error.
	StoreByte(ptr uintptr, value byte, s Stream) error
}
