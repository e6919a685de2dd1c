package sim

// The stream-ordered allocator on Sim: cuMemAllocAsync, cuMemFreeAsync
// and the default pool's trim and attributes (AsyncAllocator).
//
// What is modelled. Each process has one default pool. It holds capacity
// in whole granules (Config.Granularity, 2 MiB by default), counted in
// Used and taken from the GPU's free memory like any allocation. An
// allocation is a region of addresses of its own, rounded up to 512 bytes
// like MemAlloc's, with its own contents (Shadow); when the pool's live
// bytes would exceed what it holds, it grows by the granules missing, and
// fails with ErrOutOfMemory when the GPU has not that much free. A free
// gives the bytes back to the pool, not to the GPU. At StreamSynchronize
// and EventSynchronize the pool returns to the GPU what it holds beyond
// max(live bytes rounded up to a granule, release threshold rounded down
// to a granule); at MemPoolTrimTo, beyond max(live bytes, trim target),
// each rounded up to a granule, so that a trim keeps at least its target,
// as cuMemPoolTrimTo promises.
//
// What is not. The driver's pool places blocks in physical chunks and can
// return only chunks that are wholly free; Sim's pool never fragments, so
// its reserved memory and the cap under which a trace fits are lower
// bounds of the driver's. Reuse across streams is immediate in Sim (work
// runs when issued); the driver waits for the free's stream, or reuses
// opportunistically. A free is stream-ordered: queued work ordered before
// it (on its stream, or before it by events) is dropped silently when the
// block goes, unordered queued work that still writes the block is a
// violation (Violations), as a use after free would be.
//
// Latency: 1.1 µs per cuMemAllocAsync and 1.2 µs per cuMemFreeAsync, as
// measured on the H200 (H200Latency), plus, when the pool grows or
// releases memory, the cost of cuMemCreate or cuMemRelease of those
// bytes, charged to the call that caused it.

import (
	"slices"

	"github.com/gpumem/tlsf/device"
)

// simAsyncPool is a process's default memory pool. Guarded by g.mu.
type simAsyncPool struct {
	reserved  uint64 // capacity held, a multiple of the granularity; part of Sim.used
	live      uint64 // bytes of live allocations, each rounded up to 512
	allocs    int    // live allocations
	threshold uint64 // MemPoolReleaseThreshold
	// High-water marks of reserved and live since the last reset.
	reservedHigh, liveHigh uint64
}

var _ device.AsyncAllocator = (*Device)(nil)

// MemAllocAsync allocates size bytes from the process's default pool for
// stream h (cuMemAllocAsync), growing the pool by whole granules as
// needed. The pointer is 512-byte aligned; the memory is usable at once
// (Sim runs work when issued). Errors: size 0 or an unknown stream is
// ErrInvalidValue; too little free capacity or address space is
// ErrOutOfMemory, and then the pool is as before.
func (s *Device) MemAllocAsync(size uint64, h device.Stream) (ptr uintptr, err error) {
	const c = device.CallMemAllocAsync
	err = s.do(c, func() (uint64, error) {
		if _, err := s.stream(c, h); err != nil {
			return 0, err
		}
		if size == 0 {
			return 0, simErr(c, device.ErrInvalidValue, "size 0")
		}
		if size > s.g.capacity {
			return 0, simErr(c, device.ErrOutOfMemory, "%d bytes wanted, capacity %d", size, s.g.capacity)
		}
		p := &s.apool
		charge, _ := roundUp64(size, simLinearAlign) // no overflow: size ≤ capacity
		var grow uint64
		if need := p.live + charge; need > p.reserved {
			grow, _ = roundUp64(need-p.reserved, s.cfg.Granularity)
			if err := s.charge(c, grow); err != nil {
				return 0, err
			}
		}
		var ok bool
		ptr, ok = s.va.alloc(charge, simLinearAlign)
		if !ok {
			s.uncharge(grow)
			return 0, simErr(c, device.ErrOutOfMemory, "no %d bytes of address space left", charge)
		}
		s.insertRegion(&simRegion{start: ptr, size: charge, ph: &simPhys{size: size, charge: charge, async: true}})
		if grow > 0 {
			p.reserved += grow
			if f := s.lat.Cost[device.CallMemCreate]; f != nil {
				s.times[c] += f(grow)
			}
		}
		p.live += charge
		p.allocs++
		p.reservedHigh = max(p.reservedHigh, p.reserved)
		p.liveHigh = max(p.liveHigh, p.live)
		return size, nil
	})
	return ptr, err
}

// MemFreeAsync frees ptr, from MemAllocAsync, on stream h
// (cuMemFreeAsync): its bytes go back to the pool at once, and its
// addresses to the free list. Queued work ordered before the free that
// writes the block is dropped; unordered queued work that writes it is a
// violation (see the file comment). Errors: an unknown stream, or a ptr
// that is not the start of a live MemAllocAsync allocation, is
// ErrInvalidValue.
func (s *Device) MemFreeAsync(ptr uintptr, h device.Stream) error {
	const c = device.CallMemFreeAsync
	return s.do(c, func() (uint64, error) {
		st, err := s.stream(c, h)
		if err != nil {
			return 0, err
		}
		r, i := s.regionAt(ptr)
		switch {
		case r == nil || r.ph == nil || !r.ph.async:
			return 0, simErr(c, device.ErrInvalidValue, "%#x was not allocated by cuMemAllocAsync", ptr)
		case r.start != ptr:
			return 0, simErr(c, device.ErrInvalidValue, "%#x is inside the allocation at %#x, not its start", ptr, r.start)
		}
		// The free's place in the order: after everything issued on h so
		// far and everything the host has seen complete.
		at := slices.Clone(st.clock)
		at.join(s.host)
		s.eachQueued(func(it *simItem) {
			for _, side := range it.sides() {
				hit := false
				for k := range side.spans {
					sp := &side.spans[k]
					if !sp.live() || sp.ph != r.ph {
						continue
					}
					if !hit && at.at(it.st.idx) < it.seq {
						s.violate("%s: memory [%#x, +%d) freed on stream %#x while %s, %s and not ordered before the free, still %s it",
							c, sp.addr, sp.n, uintptr(h), it, it.st.state(), side.verb)
					}
					hit = true
					sp.dead = true
				}
			}
		})
		s.removeRegion(i)
		r.ph.freed = true
		s.apool.live -= r.ph.charge
		s.apool.allocs--
		return r.ph.size, nil
	})
}

// asyncRelease returns to the GPU what the pool holds beyond
// max(live rounded up to a granule, keep), keep a multiple of the
// granularity, and charges call c the cost of releasing it. g.mu held.
func (s *Device) asyncRelease(c device.Call, keep uint64) {
	p := &s.apool
	g := s.cfg.Granularity
	floor, _ := roundUp64(p.live, g) // no overflow: live ≤ capacity
	target := max(floor, keep)
	if target >= p.reserved {
		return
	}
	n := p.reserved - target
	p.reserved = target
	s.uncharge(n)
	if f := s.lat.Cost[device.CallMemRelease]; f != nil {
		s.times[c] += f(n)
	}
}

// MemPoolTrimTo returns to the GPU what the default pool holds beyond
// max(live bytes, keep), each rounded up to a granule (cuMemPoolTrimTo):
// it keeps at least keep bytes, and releases nothing of a pool holding
// no more. A keep within a granule of 2^64 wraps to 0 when rounded up,
// as driver 580's did on the H200 (2^64 − 1 released everything,
// 2026-12-07). Errors: after Close, ErrInvalidValue; else only injected
// faults.
func (s *Device) MemPoolTrimTo(keep uint64) error {
	const c = device.CallMemPoolTrimTo
	return s.do(c, func() (uint64, error) {
		g := s.cfg.Granularity
		up, ok := roundUp64(keep, g)
		if !ok {
			up = 0 // wraps, as the driver's rounding did
		}
		s.asyncRelease(c, up)
		return 0, nil
	})
}

// MemPoolGetAttribute returns an attribute of the default pool in bytes
// (cuMemPoolGetAttribute): the release threshold, the bytes held
// (reserved, rounded to granules) and live (each allocation rounded up to
// 512 bytes), and their high-water marks. Errors: an attribute not listed
// with MemPoolAttribute is ErrInvalidValue.
func (s *Device) MemPoolGetAttribute(attr device.MemPoolAttribute) (v uint64, err error) {
	const c = device.CallMemPoolGetAttribute
	err = s.do(c, func() (uint64, error) {
		p := &s.apool
		switch attr {
		case device.MemPoolReleaseThreshold:
			v = p.threshold
		case device.MemPoolReservedMemCurrent:
			v = p.reserved
		case device.MemPoolReservedMemHigh:
			v = p.reservedHigh
		case device.MemPoolUsedMemCurrent:
			v = p.live
		case device.MemPoolUsedMemHigh:
			v = p.liveHigh
		default:
			return 0, simErr(c, device.ErrInvalidValue, "attribute %v", attr)
		}
		return 0, nil
	})
	return v, err
}

// MemPoolSetAttribute sets the release threshold (any value, in bytes),
// or resets a high-water mark to the current value (value 0)
// (cuMemPoolSetAttribute). Errors: another attribute, or a non-zero value
// for a high-water mark, is ErrInvalidValue.
func (s *Device) MemPoolSetAttribute(attr device.MemPoolAttribute, value uint64) error {
	const c = device.CallMemPoolSetAttribute
	return s.do(c, func() (uint64, error) {
		p := &s.apool
		switch {
		case attr == device.MemPoolReleaseThreshold:
			p.threshold = value
		case attr == device.MemPoolReservedMemHigh && value == 0:
			p.reservedHigh = p.reserved
		case attr == device.MemPoolUsedMemHigh && value == 0:
			p.liveHigh = p.live
		default:
			return 0, simErr(c, device.ErrInvalidValue, "cannot set %v to %d", attr, value)
		}
		return 0, nil
	})
}
