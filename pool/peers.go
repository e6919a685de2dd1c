package pool

// Peer access: letting other GPUs of the host use the pool's memory.
//
// Memory mapped with cuMemMap is reachable only from the devices a
// cuMemSetAccess named for it; cuCtxEnablePeerAccess does not cover it
// (allocators that forgot this hang or fault when another GPU copies from
// their memory). So a VMM pool keeps the list of peer devices and names
// them, with its own device, in the cuMemSetAccess of every new mapping
// (vmmHeap.setAccess, the one place the heap grants access); granting a
// new peer later walks the mapped pages once. Linear memory (chunk and
// passthrough pools) needs cuCtxEnablePeerAccess once per device pair,
// which covers present and future allocations.

import (
	"fmt"
	"slices"

	"github.com/gpumem/tlsf/device"
)

// DeviceSet is a set of device ordinals 0 to 63, bit k standing for
// ordinal k; a bit set keeps Options comparable. The zero value is empty.
type DeviceSet uint64

// DeviceSetOf returns the set of the given ordinals. Errors: ErrBadOptions
// for an ordinal outside [0, 63].
func DeviceSetOf(ordinals ...int) (DeviceSet, error) {
	var s DeviceSet
	for _, k := range ordinals {
		if k < 0 || k > 63 {
			return 0, fmt.Errorf("%w: device ordinal %d outside [0, 63]", ErrBadOptions, k)
		}
		s |= 1 << uint(k)
	}
	return s, nil
}

// Has reports whether ordinal k is in the set.
func (s DeviceSet) Has(k int) bool { return k >= 0 && k < 64 && s&(1<<uint(k)) != 0 }

// Ordinals returns the ordinals in the set, in increasing order.
func (s DeviceSet) Ordinals() []int {
	var out []int
	for k := range 64 {
		if s.Has(k) {
			out = append(out, k)
		}
	}
	return out
}

// peerAccessor returns the pool's device as a PeerAccessor, or an
// ErrNoPeerAccess error naming the pair for peer.
func (p *Pool) peerAccessor(peer int) (device.PeerAccessor, error) {
	pa, ok := p.dev.Device.(device.PeerAccessor)
	if !ok {
		return nil, fmt.Errorf("%w: device %d cannot access device %d: %s has no peer access (not a device.PeerAccessor)",
			ErrNoPeerAccess, peer, p.dev.Ordinal(), p.dev.Name())
	}
	can, err := pa.CanAccessPeer(peer)
	if err != nil {
		return nil, fmt.Errorf("pool: peer access of device %d to device %d: %w", peer, p.dev.Ordinal(), err)
	}
	if !can {
		return nil, fmt.Errorf("%w: device %d cannot access device %d (cuDeviceCanAccessPeer)", ErrNoPeerAccess, peer, p.dev.Ordinal())
	}
	return pa, nil
}

// setupPeers grants the devices of Options.PeerAccess access at New.
func (p *Pool) setupPeers(peers []int) error {
	for _, peer := range peers {
		if err := p.grantPeerLocked(peer); err != nil {
			return err
		}
	}
	return nil
}

// GrantPeerAccess lets device ordinal (of the same host) read and write
// all of the pool's memory, present and future: a VMM pool grants it
// access to every mapped page now (cuMemSetAccess, one call per run of
// mapped pages) and names it in every later mapping's cuMemSetAccess; a
// chunk or passthrough pool enables peer access on the context
// (cuCtxEnablePeerAccess). Granting the pool's own device, or a device
// granted already, does nothing. Safe for concurrent use.
//
// Errors: ErrClosed; ErrNoPeerAccess naming the pair when the device
// cannot access the pool's device; device errors (ErrNoDevice for an
// unknown ordinal) wrapped with the pair. After an error the device is
// not in the pool's peer list, though pages granted before the failure
// keep their access (harmless: nothing else changes).
func (p *Pool) GrantPeerAccess(ordinal int) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	return p.grantPeerLocked(ordinal)
}

// PeerAccess returns the devices granted access to the pool's memory
// besides its own, in the order granted.
func (p *Pool) PeerAccess() []int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.peers)
}

func (p *Pool) grantPeerLocked(peer int) error {
	if peer == p.dev.Ordinal() || slices.Contains(p.peers, peer) {
		return nil
	}
	pa, err := p.peerAccessor(peer)
	if err != nil {
		return err
	}
	h := p.vmm
	if h == nil {
		p.dev.count(device.CallCtxEnablePeerAccess)
		if err := pa.EnablePeerAccess(peer); err != nil {
			return fmt.Errorf("pool: enabling access by device %d to device %d: %w", peer, p.dev.Ordinal(), err)
		}
		p.peers = append(p.peers, peer)
		return nil
	}
	grant := append(slices.Clone(h.peers), peer)
	for _, r := range runs(h.mapped, 0, uint64(len(h.mapped)), true) {
		// Strays have no access and are unmapped before the next mapping:
		// leave them.
		for _, s := range runs(h.stray, r[0], r[0]+r[1], false) {
			p.dev.count(device.CallMemSetAccess)
			if err := pa.MemSetAccessPeers(uintptr(h.pageAddr(s[0])), s[1]*h.gran, grant); err != nil {
				return fmt.Errorf("pool: granting device %d access to device %d's pages [%#x, +%d): %w",
					peer, p.dev.Ordinal(), h.pageAddr(s[0]), s[1]*h.gran, err)
			}
		}
	}
	h.peers = grant
	p.peers = append(p.peers, peer)
	return nil
}

// setAccess grants read-write access to the mapped range [ptr, ptr+size)
// to the pool's device and its peers: cuMemSetAccess with one
// CUmemAccessDesc per device.
func (h *vmmHeap) setAccess(ptr uintptr, size uint64) error {
	if len(h.peers) == 0 {
		return h.dev.MemSetAccess(ptr, size)
	}
	h.dev.count(device.CallMemSetAccess)
	return h.dev.Device.(device.PeerAccessor).MemSetAccessPeers(ptr, size, h.peers)
}
