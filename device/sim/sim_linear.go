package sim

// Physical allocations, address regions, and linear memory (cuMemAlloc,
// cuMemAllocPitch, cuMemFree).
//
// A region is a range of one process's addresses: a linear allocation,
// which is addresses and physical memory at once, or a VMM reservation,
// which is addresses only, with mappings of physical handles inside. Every
// access (memset, copy) is resolved to spans of physical allocations
// through the regions; an address no region backs with accessible memory
// is ErrIllegalAddress.

import (
	"math/bits"
	"slices"
	"sort"

	"github.com/gpumem/tlsf/device"
)

// simPhys is one physical allocation: a linear allocation or a MemCreate
// handle.
type simPhys struct {
	handle   device.MemHandle // 0 for a linear allocation
	size     uint64           // bytes of contents: requested size, or handle size
	charge   uint64           // capacity consumed, bytes
	maps     int              // live mappings of a handle
	released bool             // MemRelease was called
	freed    bool             // the memory is gone
	async    bool             // from MemAllocAsync: charge counts in the async pool, not in Sim.used
	mem      simShadow        // contents, with Config.Shadow
}

// simRegion is a linear allocation or a reservation.
type simRegion struct {
	start uintptr
	size  uint64        // bytes of address space
	ph    *simPhys      // the linear allocation; nil for a reservation
	maps  []*simMapping // a reservation's mappings, sorted by start
}

func (r *simRegion) end() uintptr { return r.start + uintptr(r.size) }

// simMapping is one MemMap of a whole handle.
type simMapping struct {
	start  uintptr
	size   uint64
	ph     *simPhys
	access bool   // MemSetAccess granted read-write
	peers  uint64 // bit b: MemSetAccessPeers granted device b read-write (sim_host.go)
	gone   bool   // unmapped
}

// mappingAt returns the mapping of reservation r containing addr and its
// index, or nil.
func (r *simRegion) mappingAt(addr uintptr) (*simMapping, int) {
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].start > addr }) - 1
	if i >= 0 && addr-r.maps[i].start < uintptr(r.maps[i].size) {
		return r.maps[i], i
	}
	return nil, -1
}

// simSpan is a piece of an access: n bytes at addr, which are bytes
// [off, off+n) of ph, reached through mapping m (nil for linear memory).
type simSpan struct {
	addr uintptr
	n    uint64
	ph   *simPhys
	off  uint64
	m    *simMapping
	dead bool // its target was freed or unmapped while the access was queued
}

// live reports whether the span's memory is still reachable.
func (sp *simSpan) live() bool {
	return !sp.dead && !sp.ph.freed && (sp.m == nil || !sp.m.gone)
}

// overlaps reports whether two spans touch the same physical bytes.
func (sp *simSpan) overlaps(o *simSpan) bool {
	return sp.ph == o.ph && sp.off < o.off+o.n && o.off < sp.off+sp.n
}

// resolve splits the access [ptr, ptr+n) of call c into spans of
// physical memory. Every byte must be allocated linear memory (within the
// requested size) or mapped memory with access granted; otherwise the
// access is ErrIllegalAddress.
func (s *Device) resolve(c device.Call, ptr uintptr, n uint64) ([]simSpan, error) {
	if n == 0 {
		return nil, nil
	}
	if n-1 > uint64(^uintptr(0)-ptr) {
		return nil, simErr(c, device.ErrIllegalAddress, "[%#x, +%d) wraps around the address space", ptr, n)
	}
	var spans []simSpan
	addr, left := ptr, n
	for left > 0 {
		r, _ := s.regionAt(addr)
		var sp simSpan
		switch {
		case r == nil:
			return nil, simErr(c, device.ErrIllegalAddress, "%#x (in [%#x, +%d)) is not allocated", addr, ptr, n)
		case r.ph != nil:
			end := r.start + uintptr(r.ph.size)
			if addr >= end {
				return nil, simErr(c, device.ErrIllegalAddress, "%#x is past the end of the %d-byte allocation at %#x", addr, r.ph.size, r.start)
			}
			sp = simSpan{addr: addr, n: min(left, uint64(end-addr)), ph: r.ph, off: uint64(addr - r.start)}
		default:
			m, _ := r.mappingAt(addr)
			if m == nil {
				return nil, simErr(c, device.ErrIllegalAddress, "%#x is reserved (at %#x) but not mapped", addr, r.start)
			}
			if !m.access {
				return nil, simErr(c, device.ErrIllegalAddress, "%#x is mapped (at %#x) without access: MemSetAccess was not called", addr, m.start)
			}
			sp = simSpan{addr: addr, n: min(left, m.size-uint64(addr-m.start)), ph: m.ph, off: uint64(addr - m.start), m: m}
		}
		spans = append(spans, sp)
		addr += uintptr(sp.n)
		left -= sp.n
	}
	return spans, nil
}

// MemAlloc allocates size bytes of linear memory (cuMemAlloc_v2) and
// returns its address, aligned to 512 bytes. The allocation consumes size
// rounded up to 512 bytes of capacity (the driver consumes whole 2 MiB
// pages, packing small allocations; Sim keeps accounting per allocation).
// Addresses are the lowest free ones that fit. Errors: size 0 is
// ErrInvalidValue; too little free capacity (or address space) is
// ErrOutOfMemory.
func (s *Device) MemAlloc(size uint64) (ptr uintptr, err error) {
	err = s.do(device.CallMemAlloc, func() (uint64, error) {
		if size == 0 {
			return 0, simErr(device.CallMemAlloc, device.ErrInvalidValue, "size 0")
		}
		ptr, err = s.linearAlloc(device.CallMemAlloc, size)
		return size, err
	})
	return ptr, err
}

// MemAllocPitch allocates height rows of widthBytes each
// (cuMemAllocPitch_v2), every row padded to pitch bytes, widthBytes
// rounded up to Config.PitchAlignment (default 512, as the H200: width
// 4 gives 512, 2052 gives 2560). It consumes pitch×height bytes, freed by
// MemFree. Errors: a zero width or height, elementSize not 4, 8 or 16, or
// pitch×height overflowing 64 bits is ErrInvalidValue; too little free
// capacity is ErrOutOfMemory.
func (s *Device) MemAllocPitch(widthBytes, height uint64, elementSize uint32) (ptr uintptr, pitch uint64, err error) {
	const c = device.CallMemAllocPitch
	var size uint64
	err = s.do(c, func() (uint64, error) {
		switch {
		case elementSize != 4 && elementSize != 8 && elementSize != 16:
			return 0, simErr(c, device.ErrInvalidValue, "element size %d is not 4, 8 or 16", elementSize)
		case widthBytes == 0 || height == 0:
			return 0, simErr(c, device.ErrInvalidValue, "width %d, height %d", widthBytes, height)
		}
		p, ok := roundUp64(widthBytes, s.cfg.PitchAlignment)
		hi, lo := bits.Mul64(p, height)
		if !ok || hi != 0 {
			return 0, simErr(c, device.ErrInvalidValue, "width %d × height %d overflows", widthBytes, height)
		}
		ptr, err = s.linearAlloc(c, lo)
		if err == nil {
			pitch, size = p, lo
		}
		return size, err
	})
	return ptr, pitch, err
}

// linearAlloc allocates size (> 0) bytes of linear memory for call c.
func (s *Device) linearAlloc(c device.Call, size uint64) (uintptr, error) {
	if size > s.g.capacity {
		return 0, simErr(c, device.ErrOutOfMemory, "%d bytes wanted, capacity %d", size, s.g.capacity)
	}
	charge, _ := roundUp64(size, simLinearAlign) // no overflow: size ≤ capacity
	if err := s.charge(c, charge); err != nil {
		return 0, err
	}
	ptr, ok := s.va.alloc(charge, simLinearAlign)
	if !ok {
		s.uncharge(charge)
		return 0, simErr(c, device.ErrOutOfMemory, "no %d bytes of address space left", charge)
	}
	s.insertRegion(&simRegion{start: ptr, size: charge, ph: &simPhys{size: size, charge: charge}})
	return ptr, nil
}

// MemFree frees a linear allocation made by MemAlloc or MemAllocPitch
// (cuMemFree_v2). ptr 0 does nothing, as the driver answers it. Otherwise
// ptr must be the allocation's start: an unknown or interior pointer, a
// pointer into a reservation, or a second free is ErrInvalidValue. Freeing memory that queued work on a held stream still
// writes records a violation (see Violations): the driver would block
// until the work finished, and a pool must not lean on that.
func (s *Device) MemFree(ptr uintptr) error {
	const c = device.CallMemFree
	return s.do(c, func() (uint64, error) {
		if ptr == 0 {
			return 0, nil
		}
		r, i := s.regionAt(ptr)
		switch {
		case r == nil:
			return 0, simErr(c, device.ErrInvalidValue, "%#x is not allocated", ptr)
		case r.ph == nil:
			return 0, simErr(c, device.ErrInvalidValue, "%#x is inside a VMM reservation at %#x", ptr, r.start)
		case r.ph.async:
			return 0, simErr(c, device.ErrInvalidValue, "%#x was allocated by cuMemAllocAsync: free it with cuMemFreeAsync", ptr)
		case r.start != ptr:
			return 0, simErr(c, device.ErrInvalidValue, "%#x is inside the allocation at %#x, not its start", ptr, r.start)
		}
		s.killPending(c, "freed", func(sp *simSpan) bool { return sp.ph == r.ph })
		s.removeRegion(i)
		r.ph.freed = true
		s.uncharge(r.ph.charge)
		return r.ph.size, nil
	})
}

// insertMapping adds m to the sorted mappings of r.
func (r *simRegion) insertMapping(m *simMapping) {
	i := sort.Search(len(r.maps), func(i int) bool { return r.maps[i].start > m.start })
	r.maps = slices.Insert(r.maps, i, m)
}
