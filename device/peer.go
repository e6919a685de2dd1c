package device

// Several GPUs of one host, an optional interface.
//
// With unified virtual addressing every device pointer of a process is
// unique across its GPUs, so a copy names its bytes by pointer alone, but
// a GPU may touch another GPU's memory only where access was granted:
//
//   - linear memory (cuMemAlloc) of device A is reachable from device B
//     once B's context has enabled peer access to A's context
//     (cuCtxEnablePeerAccess, one call per ordered pair, for all present
//     and future allocations of A);
//   - memory mapped with cuMemMap is not covered by that: each mapping is
//     reachable only from the devices named in a cuMemSetAccess on it.
//
// A copy issued on B (cuMemcpyDtoDAsync in B's context) whose source or
// destination B may not reach fails with CUDA_ERROR_INVALID_VALUE
// (ErrInvalidValue): the driver cannot map the pointer for B's copy
// engine. (A kernel on B touching it instead faults with
// CUDA_ERROR_ILLEGAL_ADDRESS; the pool issues no kernels.)

// PeerAccessor is implemented by devices that can share memory with other
// devices of the same host: cuda.Device and sim.Device (a Device of a
// sim.Host). Ordinals are the driver's device ordinals. Every method is
// safe for concurrent use.
type PeerAccessor interface {
	// CanAccessPeer reports whether device peer can access this device's
	// memory (cuDeviceCanAccessPeer(peer, this)). A device always reaches
	// its own memory. Errors: ErrNoDevice for an unknown ordinal.
	CanAccessPeer(peer int) (bool, error)
	// EnablePeerAccess lets device peer access this device's linear
	// memory, present and future (cuCtxEnablePeerAccess, called in peer's
	// context with this device's context as the argument). Enabling it
	// again, or for the device itself, does nothing. Errors: ErrNoDevice
	// for an unknown ordinal; ErrNotSupported when the pair has no peer
	// path (CUDA_ERROR_PEER_ACCESS_UNSUPPORTED).
	EnablePeerAccess(peer int) error
	// MemSetAccessPeers grants read-write access to the mapped range
	// [ptr, ptr+size) to this device and to each device in peers
	// (cuMemSetAccess with one CUmemAccessDesc per device). An ordinal
	// may repeat or be this device's. Errors: as MemSetAccess, and
	// ErrNoDevice for an unknown ordinal, ErrNotSupported for a peer that
	// cannot access this device.
	MemSetAccessPeers(ptr uintptr, size uint64, peers []int) error
	// MemcpyDtoDAsync copies n bytes from device address src to dst on
	// stream s of this device (cuMemcpyDtoDAsync_v2, in this device's
	// context). Either side may be another device's memory that this
	// device was granted access to. Errors: ErrInvalidValue for bytes
	// this device may not access (another device's memory without
	// access, unknown pointers) or an unknown stream.
	MemcpyDtoDAsync(dst, src uintptr, n uint64, s Stream) error
}
