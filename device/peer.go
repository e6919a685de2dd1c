package device

// PeerAccessor is implemented by devices that share memory with other
// devices of one host (cuda.Device; sim.Device from a sim.Host). With
// unified addressing a pointer names its device, but device B may touch
// device A's memory only where access was granted: A's linear memory
// once B's context enabled peer access to A's (cuCtxEnablePeerAccess);
// memory mapped with cuMemMap only where a cuMemSetAccess named B. A copy
// issued on B that B may not reach fails with CUDA_ERROR_INVALID_VALUE
// (ErrInvalidValue). Ordinals are the driver's. Safe for concurrent use.
type PeerAccessor interface {
	// CanAccessPeer reports whether device peer can access this device's
	// memory (cuDeviceCanAccessPeer); a device reaches its own. Errors:
	// ErrNoDevice for an unknown ordinal.
	CanAccessPeer(peer int) (bool, error)
	// EnablePeerAccess lets device peer access this device's linear
	// memory, present and future (cuCtxEnablePeerAccess in peer's context
	// with this one's as argument). Again, or for this device: a no-op.
	// Errors: ErrNoDevice; ErrNotSupported when the pair has no peer path.
	EnablePeerAccess(peer int) error
	// MemSetAccessPeers grants this device and each of peers read-write
	// access to the mapped range [ptr, ptr+size) (cuMemSetAccess, one
	// CUmemAccessDesc per device). Errors: as MemSetAccess; ErrNoDevice
	// for an unknown ordinal. For a peer that cannot reach this device the
	// answer depends on the implementation: sim.Device returns
	// ErrNotSupported and grants nothing; cuda.Device does not ask
	// cuDeviceCanAccessPeer first and returns cuMemSetAccess's own error,
	// whatever its code. Callers that need one answer check CanAccessPeer
	// first, as package pool does.
	MemSetAccessPeers(ptr uintptr, size uint64, peers []int) error
	// MemcpyDtoDAsync copies n bytes from src to dst on stream s of this
	// device (cuMemcpyDtoDAsync_v2); either side may be a peer's memory
	// this device was granted. Errors: ErrInvalidValue for memory it may
	// not reach or a bad stream; ErrIllegalAddress for unmapped bytes.
	MemcpyDtoDAsync(dst, src uintptr, n uint64, s Stream) error
}
