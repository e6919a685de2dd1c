package sim

// Host: several simulated GPUs in one process, and peer access between
// them (device.PeerAccessor).
//
// NewHost makes n GPUs, each with its own capacity and its own first
// process, which is the Host's process on it: Host.Device(k) is that
// process's view of GPU k, with Ordinal k. The n Devices share what a
// process's contexts share on a real host: one address space (unified
// virtual addressing: their address windows are disjoint, so a pointer
// names its GPU) and, in Sim, one mutex, so that a copy between GPUs is
// atomic like every other call.
//
// Peer access follows the driver (device/peer.go):
//   - linear memory of GPU a is reachable from GPU b once
//     Device(a).EnablePeerAccess(b) ran (cuCtxEnablePeerAccess in b's
//     context);
//   - a mapping on GPU a is reachable from GPU b only if
//     MemSetAccessPeers named b for it;
//   - MemcpyDtoDAsync issued on GPU b whose source or destination b may
//     not reach fails with ErrInvalidValue (CUDA_ERROR_INVALID_VALUE), and
//     changes nothing.
//
// Every pair of GPUs may enable peer access unless SetCanAccessPeer says
// otherwise (a host whose GPUs share no NVLink or PCIe switch): then
// EnablePeerAccess and MemSetAccessPeers fail with ErrNotSupported.
//
// Simplifications: a copy runs when it is issued, after the work queued
// before it on its stream (it lifts a hold, as a synchronize would), and
// its source, destination and size must be multiples of 4 bytes, which
// the shadow contents need (pool blocks are 256-byte aligned); a
// mapping's peers are granted together with the owner's own access.

import (
	"errors"
	"fmt"

	"github.com/gpumem/tlsf/device"
)

// simMaxGPUs bounds NewHost: a mapping's peers are bits of a uint64.
const simMaxGPUs = 64

// simHost is what the GPUs of one Host share. Guarded by the shared mutex.
type simHost struct {
	devs   []*Device // the Host's process on each GPU, by ordinal
	noPeer [][]bool  // noPeer[a][b]: GPU b cannot reach GPU a's memory
}

// Host is several simulated GPUs used by one process. Its methods are
// safe for concurrent use.
type Host struct {
	h *simHost
}

// NewHost returns a host with n simulated GPUs, each configured by cfg
// (its own Capacity) and with ordinals 0 to n-1 (cfg.Ordinal is ignored).
// Every pair can enable peer access until SetCanAccessPeer says otherwise.
// It panics if n is not in [1, 64] or cfg is inconsistent (see New).
func NewHost(n int, cfg Config) *Host {
	if n < 1 || n > simMaxGPUs {
		panic(fmt.Sprintf("sim: NewHost: %d GPUs, want 1 to %d", n, simMaxGPUs))
	}
	first := New(cfg) // validates cfg and makes the shared mutex
	h := &simHost{devs: make([]*Device, n), noPeer: make([][]bool, n)}
	mu := first.g.mu
	mu.Lock()
	defer mu.Unlock()
	for k := range n {
		d := first
		if k > 0 {
			g := &simGPU{mu: mu, capacity: first.cfg.Capacity, index: k, ngpus: n}
			c := first.cfg
			c.Ordinal = k
			d = g.newProcess(c)
		} else {
			first.cfg.Ordinal = 0
			first.g.ngpus = n
			// Process 0 of GPU 0 keeps window 0: w = 0·n + 0.
		}
		d.onHost = h
		h.devs[k] = d
		h.noPeer[k] = make([]bool, n)
	}
	return &Host{h: h}
}

// Len returns the number of GPUs.
func (h *Host) Len() int { return len(h.h.devs) }

// Device returns the host process's view of GPU ordinal. It panics if the
// ordinal is out of range.
func (h *Host) Device(ordinal int) *Device {
	return h.h.devs[ordinal]
}

// Open returns the host process's view of GPU ordinal as a
// device.Device, as Device does, or, for an ordinal out of range, an error
// wrapping device.ErrNoDevice (as cuda.Open answers it), never a panic.
// Its signature is that of an opener for pool.NewDevicesOn. Closing the
// device it returns closes that GPU's Device for the host.
func (h *Host) Open(ordinal int) (device.Device, error) {
	if ordinal < 0 || ordinal >= len(h.h.devs) {
		return nil, fmt.Errorf("device: sim host ordinal %d of %d GPUs: %w", ordinal, len(h.h.devs), device.ErrNoDevice)
	}
	return h.h.devs[ordinal], nil
}

// Devices returns the host's Devices by ordinal.
func (h *Host) Devices() []*Device {
	return append([]*Device(nil), h.h.devs...)
}

// SetCanAccessPeer sets whether GPU peer can reach GPU owner's memory
// (what cuDeviceCanAccessPeer(peer, owner) reports). Access enabled or
// granted before is kept, as the driver keeps it. It panics on an ordinal
// out of range.
func (h *Host) SetCanAccessPeer(owner, peer int, ok bool) {
	mu := h.h.devs[0].g.mu
	mu.Lock()
	defer mu.Unlock()
	h.h.noPeer[owner][peer] = !ok
}

var _ device.PeerAccessor = (*Device)(nil)

// peerCheck validates that GPU peer may reach s's memory, for the driver
// call named call (its errors name it). g.mu held.
func (s *Device) peerCheck(call string, peer int) error {
	if peer == s.cfg.Ordinal {
		return nil
	}
	if s.onHost == nil || peer < 0 || peer >= len(s.onHost.devs) {
		return fmt.Errorf("device: sim %s: no device %d on the host of device %d: %w", call, peer, s.cfg.Ordinal, device.ErrNoDevice)
	}
	if s.onHost.noPeer[s.cfg.Ordinal][peer] {
		return fmt.Errorf("device: sim %s: device %d cannot access device %d (no peer path): %w", call, peer, s.cfg.Ordinal, device.ErrNotSupported)
	}
	return nil
}

// CanAccessPeer reports whether GPU peer can reach this GPU's memory
// (cuDeviceCanAccessPeer). It is not a counted call. Errors: ErrNoDevice
// for an ordinal not on this Device's host (a Device from New has no
// peers).
func (s *Device) CanAccessPeer(peer int) (bool, error) {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	err := s.peerCheck("cuDeviceCanAccessPeer", peer)
	if errorsIsNotSupported(err) {
		return false, nil
	}
	return err == nil, err
}

// EnablePeerAccess lets GPU peer reach this GPU's linear memory
// (cuCtxEnablePeerAccess). Enabling it again, or for this GPU, does
// nothing. Errors: ErrNoDevice (unknown ordinal), ErrNotSupported (the
// pair has no peer path).
func (s *Device) EnablePeerAccess(peer int) error {
	const c = device.CallCtxEnablePeerAccess
	return s.do(c, func() (uint64, error) {
		if err := s.peerCheck(c.String(), peer); err != nil {
			return 0, err
		}
		if peer != s.cfg.Ordinal {
			s.peerLinear |= 1 << uint(peer)
		}
		return 0, nil
	})
}

// MemSetAccessPeers grants this GPU and every GPU in peers read-write
// access to [ptr, ptr+size), which must consist of whole, adjacent
// mappings (cuMemSetAccess with one CUmemAccessDesc per device). Errors:
// as MemSetAccess; ErrNoDevice or ErrNotSupported for a peer (nothing
// granted).
func (s *Device) MemSetAccessPeers(ptr uintptr, size uint64, peers []int) error {
	const c = device.CallMemSetAccess
	return s.do(c, func() (uint64, error) {
		if err := s.vmm(c); err != nil {
			return 0, err
		}
		var bits uint64
		for _, p := range peers {
			if err := s.peerCheck(c.String(), p); err != nil {
				return 0, err
			}
			if p != s.cfg.Ordinal {
				bits |= 1 << uint(p)
			}
		}
		r, i, j, err := s.wholeMappings(c, ptr, size)
		if err != nil {
			return 0, err
		}
		for _, m := range r.maps[i:j] {
			m.access = true
			m.peers |= bits
		}
		return size, nil
	})
}

// owner returns the Device of s's host whose memory holds addr: s itself
// when s has no host or addr is in none of its GPUs' regions. g.mu held.
func (s *Device) owner(addr uintptr) *Device {
	if s.onHost == nil {
		return s
	}
	if r, _ := s.regionAt(addr); r != nil {
		return s
	}
	for _, d := range s.onHost.devs {
		if r, _ := d.regionAt(addr); r != nil {
			return d
		}
	}
	return s
}

// resolveFrom resolves [ptr, ptr+n) as GPU s reaches it: its own memory,
// or a peer's where access was enabled (linear) or granted (mappings).
// It returns the spans and the Device owning them. g.mu held.
func (s *Device) resolveFrom(c device.Call, ptr uintptr, n uint64) ([]simSpan, *Device, error) {
	o := s.owner(ptr)
	spans, err := o.resolve(c, ptr, n)
	if err != nil || o == s {
		return spans, o, err
	}
	bit := uint64(1) << uint(s.cfg.Ordinal)
	for _, sp := range spans {
		if sp.m == nil && o.peerLinear&bit == 0 {
			return nil, o, simErr(c, device.ErrInvalidValue,
				"device %d has no peer access to device %d: %#x is device %d's linear memory and cuCtxEnablePeerAccess was not called",
				s.cfg.Ordinal, o.cfg.Ordinal, sp.addr, o.cfg.Ordinal)
		}
		if sp.m != nil && sp.m.peers&bit == 0 {
			return nil, o, simErr(c, device.ErrInvalidValue,
				"device %d has no access to device %d's mapping at %#x: cuMemSetAccess did not name device %d",
				s.cfg.Ordinal, o.cfg.Ordinal, sp.m.start, s.cfg.Ordinal)
		}
	}
	return spans, o, nil
}

// MemcpyDtoDAsync copies n bytes from src to dst on stream h of this GPU
// (cuMemcpyDtoDAsync_v2). Either side may be another GPU's memory that
// this GPU may reach (see the file comment). Within this GPU's memory the
// copy is queued on h as a memset is (a held stream keeps it queued;
// freeing memory it will read or write meanwhile is a violation); a copy
// from or to another GPU runs at once, after the work queued before it on
// h, ending a hold on h (a Sim limit). With Shadow the contents move;
// reading or writing bytes that other queued work will write records a
// race. Errors:
// an unknown stream, pointers or n not multiples of 4 (a Sim limit), or
// memory this GPU may not reach is ErrInvalidValue; bytes not allocated
// or not mapped are ErrIllegalAddress. n = 0 does nothing.
func (s *Device) MemcpyDtoDAsync(dst, src uintptr, n uint64, h device.Stream) error {
	const c = device.CallMemcpyDtoDAsync
	return s.do(c, func() (uint64, error) {
		st, err := s.stream(c, h)
		if err != nil {
			return 0, err
		}
		if dst%4 != 0 || src%4 != 0 || n%4 != 0 {
			return 0, simErr(c, device.ErrInvalidValue, "copy of %d bytes from %#x to %#x: Sim copies whole 4-byte words", n, src, dst)
		}
		if n == 0 {
			return 0, nil
		}
		from, fo, err := s.resolveFrom(c, src, n)
		if err != nil {
			return 0, err
		}
		to, to_, err := s.resolveFrom(c, dst, n)
		if err != nil {
			return 0, err
		}
		if fo == s && to_ == s {
			// Queued behind the stream's work, as a memset is: a hold
			// keeps it queued.
			s.enqueue(st, &simItem{kind: simItemCopy, ptr: dst, from: src, words: n, spans: to, src: from})
			return n, nil
		}
		// Another GPU's memory: after the stream's work, at once (a Sim
		// limit: its queues are that GPU's).
		s.complete(st, func() bool { return len(st.queue) == 0 })
		fo.hostRace(c, from, "read")
		to_.hostRace(c, to, "wrote")
		if s.cfg.Shadow {
			copySpans(to, from)
		}
		return n, nil
	})
}

// copySpans copies the contents of the spans from to the spans to, which
// cover as many bytes; offsets are multiples of 4.
func copySpans(to, from []simSpan) {
	type piece struct {
		at, n uint64 // bytes from the copy's start
		v     uint32
	}
	var pieces []piece
	var at uint64
	for _, sp := range from {
		pos := sp.off
		end := sp.off + sp.n
		for _, sg := range sp.ph.mem.segs {
			if sg.hi <= pos || sg.lo >= end {
				continue
			}
			lo, hi := max(sg.lo, pos), min(sg.hi, end)
			if lo > pos {
				pieces = append(pieces, piece{at + pos - sp.off, lo - pos, Uninitialized})
			}
			pieces = append(pieces, piece{at + lo - sp.off, hi - lo, sg.v})
			pos = hi
		}
		if pos < end {
			pieces = append(pieces, piece{at + pos - sp.off, end - pos, Uninitialized})
		}
		at += sp.n
	}
	at = 0
	for _, sp := range to {
		for _, pc := range pieces {
			lo, hi := max(pc.at, at), min(pc.at+pc.n, at+sp.n)
			if lo < hi {
				sp.ph.mem.fill(sp.off+lo-at, sp.off+hi-at, pc.v)
			}
		}
		at += sp.n
	}
}

func errorsIsNotSupported(err error) bool { return errors.Is(err, device.ErrNotSupported) }
