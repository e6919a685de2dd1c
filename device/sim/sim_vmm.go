package sim

// VMM emulation: cuMemAddressReserve/Free, cuMemCreate/Release,
// cuMemMap/Unmap, cuMemSetAccess.
//
// The driver's rules, as Sim enforces them (every breach is
// ErrInvalidValue and changes nothing):
//   - Sizes of reservations and handles are non-zero multiples of the
//     granularity; reservations consume address space only, handles
//     consume capacity (ErrOutOfMemory when it runs out).
//   - A handle is mapped whole, at offset 0, at a granularity-aligned
//     address inside one reservation, over addresses not already mapped.
//     Part of a handle is ErrNotSupported, as the H200's driver (580)
//     answers it (CUDA_ERROR_NOT_SUPPORTED; bench/multi/h200/2026-12-04).
//     A handle may be mapped at several places (aliases share contents).
//   - MemSetAccess and MemUnmap take ranges made of whole, adjacent
//     mappings (Sim keeps access per mapping); the H200's driver refused
//     cuMemSetAccess on the second half of a mapping too.
//   - A handle's memory is freed when it is released and its last mapping
//     is gone, in either order (the driver's reference count).
//   - AddressFree takes a whole reservation with nothing mapped in it.

import (
	"slices"

	"github.com/gpumem/tlsf/device"
)

// vmm fails call c with ErrNotSupported when VMM is off.
func (s *Device) vmm(c device.Call) error {
	if s.cfg.NoVMM {
		return simErr(c, device.ErrNotSupported, "virtual memory management is not supported (Config.NoVMM)")
	}
	return nil
}

// granular checks that size is a non-zero multiple of the granularity.
func (s *Device) granular(c device.Call, size uint64) error {
	if size == 0 || size%s.cfg.Granularity != 0 {
		return simErr(c, device.ErrInvalidValue, "size %d is not a non-zero multiple of the granularity %d", size, s.cfg.Granularity)
	}
	return nil
}

// AddressReserve reserves size bytes of address space aligned to alignment
// bytes (cuMemAddressReserve); alignment 0, or one below the granularity,
// means the granularity. It consumes no capacity. Errors: ErrNotSupported
// with NoVMM; size not a non-zero multiple of the granularity, or an
// alignment not a power of two, is ErrInvalidValue; no room left in the
// process's 4 TiB address window is ErrOutOfMemory.
func (s *Device) AddressReserve(size, alignment uint64) (ptr uintptr, err error) {
	const c = device.CallAddressReserve
	err = s.do(c, func() (uint64, error) {
		if err := s.vmm(c); err != nil {
			return 0, err
		}
		if err := s.granular(c, size); err != nil {
			return 0, err
		}
		if alignment != 0 && alignment&(alignment-1) != 0 {
			return 0, simErr(c, device.ErrInvalidValue, "alignment %d is not a power of two", alignment)
		}
		alignment = max(alignment, s.cfg.Granularity)
		p, ok := s.va.alloc(size, alignment)
		if !ok {
			return 0, simErr(c, device.ErrOutOfMemory, "no %d bytes of address space aligned to %d left", size, alignment)
		}
		s.insertRegion(&simRegion{start: p, size: size})
		ptr = p
		return size, nil
	})
	return ptr, err
}

// AddressFree frees the reservation [ptr, ptr+size) (cuMemAddressFree).
// Errors: ErrNotSupported with NoVMM; ptr and size not exactly a
// reservation, or anything still mapped in it, is ErrInvalidValue.
func (s *Device) AddressFree(ptr uintptr, size uint64) error {
	const c = device.CallAddressFree
	return s.do(c, func() (uint64, error) {
		if err := s.vmm(c); err != nil {
			return 0, err
		}
		r, i := s.regionAt(ptr)
		switch {
		case r == nil || r.ph != nil || r.start != ptr:
			return 0, simErr(c, device.ErrInvalidValue, "%#x is not the start of a reservation", ptr)
		case r.size != size:
			return 0, simErr(c, device.ErrInvalidValue, "size %d, but the reservation at %#x has %d bytes", size, ptr, r.size)
		case len(r.maps) > 0:
			return 0, simErr(c, device.ErrInvalidValue, "%d mappings remain in the reservation at %#x (first at %#x)", len(r.maps), ptr, r.maps[0].start)
		}
		s.removeRegion(i)
		return size, nil
	})
}

// MemCreate allocates size bytes of physical memory (cuMemCreate, pinned
// device memory) and returns its handle. Handles are never reused. Errors:
// ErrNotSupported with NoVMM; size not a non-zero multiple of the
// granularity is ErrInvalidValue; too little free capacity is
// ErrOutOfMemory.
func (s *Device) MemCreate(size uint64) (h device.MemHandle, err error) {
	const c = device.CallMemCreate
	err = s.do(c, func() (uint64, error) {
		if err := s.vmm(c); err != nil {
			return 0, err
		}
		if err := s.granular(c, size); err != nil {
			return 0, err
		}
		if err := s.charge(c, size); err != nil {
			return 0, err
		}
		s.nextHandle++
		h = device.MemHandle(s.simTag(simTagHandle, s.nextHandle))
		s.handles[h] = &simPhys{handle: h, size: size, charge: size}
		return size, nil
	})
	return h, err
}

// handle finds a live, unreleased handle for call c.
func (s *Device) handle(c device.Call, h device.MemHandle) (*simPhys, error) {
	ph := s.handles[h]
	if ph == nil || ph.released {
		return nil, simErr(c, device.ErrInvalidValue, "handle %#x is not a live handle of this process", uint64(h))
	}
	return ph, nil
}

// MemRelease releases handle h (cuMemRelease). Its memory, and the
// capacity it consumes, is freed now if h is not mapped, else at its last
// MemUnmap. Errors: ErrNotSupported with NoVMM; an unknown or already
// released handle is ErrInvalidValue.
func (s *Device) MemRelease(h device.MemHandle) error {
	const c = device.CallMemRelease
	return s.do(c, func() (uint64, error) {
		if err := s.vmm(c); err != nil {
			return 0, err
		}
		ph, err := s.handle(c, h)
		if err != nil {
			return 0, err
		}
		ph.released = true
		if ph.maps == 0 {
			s.freeHandle(c, ph)
		}
		return ph.size, nil
	})
}

// freeHandle frees the memory of a released, unmapped handle.
func (s *Device) freeHandle(c device.Call, ph *simPhys) {
	s.killPending(c, "freed", func(sp *simSpan) bool { return sp.ph == ph })
	ph.freed = true
	delete(s.handles, ph.handle)
	s.uncharge(ph.charge)
}

// MemMap maps the whole of handle h, size bytes, at ptr (cuMemMap with
// offset 0). Access is not granted: MemSetAccess must follow before memory
// operations touch it. Errors: ErrNotSupported with NoVMM, and for a size
// below h's (part of a handle, as the driver says it); an unknown or
// released handle, a size above h's, ptr not granularity-aligned, a range
// not inside one reservation, or one overlapping a mapping, is
// ErrInvalidValue.
func (s *Device) MemMap(ptr uintptr, size uint64, h device.MemHandle) error {
	const c = device.CallMemMap
	return s.do(c, func() (uint64, error) {
		if err := s.vmm(c); err != nil {
			return 0, err
		}
		ph, err := s.handle(c, h)
		if err != nil {
			return 0, err
		}
		if size < ph.size {
			return 0, simErr(c, device.ErrNotSupported, "size %d, but handle %#x has %d bytes: part of a handle (the driver maps whole handles)", size, uint64(h), ph.size)
		}
		if size > ph.size {
			return 0, simErr(c, device.ErrInvalidValue, "size %d, but handle %#x has %d bytes", size, uint64(h), ph.size)
		}
		if uint64(ptr)%s.cfg.Granularity != 0 {
			return 0, simErr(c, device.ErrInvalidValue, "%#x is not aligned to the granularity %d", ptr, s.cfg.Granularity)
		}
		r, _ := s.regionAt(ptr)
		if r == nil || r.ph != nil || uint64(r.end()-ptr) < size {
			return 0, simErr(c, device.ErrInvalidValue, "[%#x, +%d) is not inside one reservation", ptr, size)
		}
		i := 0
		for i < len(r.maps) && r.maps[i].start < ptr {
			i++
		}
		if i > 0 && r.maps[i-1].start+uintptr(r.maps[i-1].size) > ptr {
			return 0, simErr(c, device.ErrInvalidValue, "%#x is already mapped (mapping at %#x)", ptr, r.maps[i-1].start)
		}
		if i < len(r.maps) && uint64(r.maps[i].start-ptr) < size {
			return 0, simErr(c, device.ErrInvalidValue, "[%#x, +%d) overlaps the mapping at %#x", ptr, size, r.maps[i].start)
		}
		r.insertMapping(&simMapping{start: ptr, size: size, ph: ph})
		ph.maps++
		return size, nil
	})
}

// wholeMappings returns the index range [i, j) of r's mappings that
// exactly tile [ptr, ptr+size), or an ErrInvalidValue error for call c.
func (s *Device) wholeMappings(c device.Call, ptr uintptr, size uint64) (*simRegion, int, int, error) {
	r, _ := s.regionAt(ptr)
	if r == nil || r.ph != nil {
		return nil, 0, 0, simErr(c, device.ErrInvalidValue, "%#x is not in a reservation", ptr)
	}
	if size == 0 || uint64(r.end()-ptr) < size {
		return nil, 0, 0, simErr(c, device.ErrInvalidValue, "[%#x, +%d) is not inside the reservation at %#x", ptr, size, r.start)
	}
	m, i := r.mappingAt(ptr)
	if m == nil || m.start != ptr {
		return nil, 0, 0, simErr(c, device.ErrInvalidValue, "no mapping starts at %#x", ptr)
	}
	end, at, j := ptr+uintptr(size), ptr, i
	for j < len(r.maps) && r.maps[j].start == at && at < end {
		at += uintptr(r.maps[j].size)
		j++
	}
	if at != end {
		return nil, 0, 0, simErr(c, device.ErrInvalidValue, "[%#x, +%d) is not made of whole, adjacent mappings", ptr, size)
	}
	return r, i, j, nil
}

// MemUnmap unmaps [ptr, ptr+size), which must consist of whole, adjacent
// mappings (cuMemUnmap). A released handle whose last mapping this was is
// freed. Unmapping memory that queued work on a held stream still writes
// records a violation (see Violations). Errors: ErrNotSupported with
// NoVMM; a range that is not whole adjacent mappings is ErrInvalidValue.
func (s *Device) MemUnmap(ptr uintptr, size uint64) error {
	const c = device.CallMemUnmap
	return s.doPer(c, func() ([]uint64, error) {
		if err := s.vmm(c); err != nil {
			return nil, err
		}
		r, i, j, err := s.wholeMappings(c, ptr, size)
		if err != nil {
			return nil, err
		}
		gone := slices.Clone(r.maps[i:j])
		sizes := make([]uint64, len(gone))
		for k, m := range gone {
			sizes[k] = m.size
		}
		r.maps = slices.Delete(r.maps, i, j)
		for _, m := range gone {
			s.killPending(c, "unmapped", func(sp *simSpan) bool { return sp.m == m })
			m.gone = true
			m.ph.maps--
			if m.ph.released && m.ph.maps == 0 {
				s.freeHandle(c, m.ph)
			}
		}
		return sizes, nil
	})
}

// MemSetAccess grants read-write access to [ptr, ptr+size), which must
// consist of whole, adjacent mappings (cuMemSetAccess for this device).
// Granting it again is harmless. Errors: ErrNotSupported with NoVMM; a
// range that is not whole adjacent mappings is ErrInvalidValue.
func (s *Device) MemSetAccess(ptr uintptr, size uint64) error {
	const c = device.CallMemSetAccess
	return s.doPer(c, func() ([]uint64, error) {
		if err := s.vmm(c); err != nil {
			return nil, err
		}
		r, i, j, err := s.wholeMappings(c, ptr, size)
		if err != nil {
			return nil, err
		}
		var sizes []uint64
		for _, m := range r.maps[i:j] {
			m.access = true
			sizes = append(sizes, m.size)
		}
		return sizes, nil
	})
}
