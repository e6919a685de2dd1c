// Package bestfit is a plain reference allocator: address-ordered best fit
// over regions, with an address-ordered free list that coalesces on free.
//
// It is the model the TLSF index is tested against (property tests and
// fuzz targets mirror the index's placements into it with Take) and the
// baseline it is benchmarked beside (Alloc picks the smallest free span
// that fits, lowest address first). Every operation is O(free spans): it
// is meant to be obviously right, not fast. Not safe for concurrent use.
package bestfit

import "sort"

// Span is a free range of Size bytes at Addr in the region based at Region.
type Span struct {
	Addr, Size, Region uint64
}

// Allocator is an address-ordered best-fit allocator.
type Allocator struct {
	gran    uint64
	free    []Span            // by increasing Addr; never two adjacent in one region
	live    map[uint64]uint64 // block start → size
	regions map[uint64]uint64 // region base → size
	top     uint64            // highest end of any block ever allocated
}

// New returns an allocator whose blocks are multiples of gran bytes.
func New(gran uint64) *Allocator {
	return &Allocator{gran: gran, live: map[uint64]uint64{}, regions: map[uint64]uint64{}}
}

// AddRegion adds [base, base+size) as free space.
func (a *Allocator) AddRegion(base, size uint64) {
	a.regions[base] = size
	a.insert(Span{Addr: base, Size: size, Region: base})
}

// GrowRegion extends the region based at base by extra bytes.
func (a *Allocator) GrowRegion(base, extra uint64) {
	end := base + a.regions[base]
	a.regions[base] += extra
	a.insert(Span{Addr: end, Size: extra, Region: base})
}

// RemoveRegion drops the region based at base, which must be wholly free.
func (a *Allocator) RemoveRegion(base uint64) {
	i := a.find(base)
	a.free = append(a.free[:i], a.free[i+1:]...)
	delete(a.regions, base)
}

// Alloc takes the smallest free span of at least size bytes (rounded up
// to the granularity; lowest address on ties) and returns its start.
func (a *Allocator) Alloc(size uint64) (uint64, bool) {
	size = (size + a.gran - 1) &^ (a.gran - 1)
	best := -1
	for i, s := range a.free {
		if s.Size >= size && (best < 0 || s.Size < a.free[best].Size) {
			best = i
			if s.Size == size {
				break
			}
		}
	}
	if best < 0 {
		return 0, false
	}
	addr := a.free[best].Addr
	a.Take(addr, size)
	return addr, true
}

// Take marks [addr, addr+size) allocated; it must lie inside one free span.
// It reports false, changing nothing, when it does not.
func (a *Allocator) Take(addr, size uint64) bool {
	i := sort.Search(len(a.free), func(i int) bool { return a.free[i].Addr+a.free[i].Size > addr })
	if i == len(a.free) || a.free[i].Addr > addr || addr+size > a.free[i].Addr+a.free[i].Size {
		return false
	}
	s := a.free[i]
	var rest []Span
	if addr > s.Addr {
		rest = append(rest, Span{Addr: s.Addr, Size: addr - s.Addr, Region: s.Region})
	}
	if end := addr + size; end < s.Addr+s.Size {
		rest = append(rest, Span{Addr: end, Size: s.Addr + s.Size - end, Region: s.Region})
	}
	a.free = append(a.free[:i], append(rest, a.free[i+1:]...)...)
	a.live[addr] = size
	a.top = max(a.top, addr+size)
	return true
}

// Free frees the block at addr and returns its size; false if none.
func (a *Allocator) Free(addr uint64) (uint64, bool) {
	size, ok := a.live[addr]
	if !ok {
		return 0, false
	}
	delete(a.live, addr)
	a.insert(Span{Addr: addr, Size: size, Region: a.regionOf(addr)})
	return size, true
}

// Live returns the live blocks (start → size). The map is the allocator's:
// do not change it.
func (a *Allocator) Live() map[uint64]uint64 { return a.live }

// FreeSpans returns the free list in address order.
func (a *Allocator) FreeSpans() []Span { return append([]Span(nil), a.free...) }

// FreeBytes is the sum of the free spans.
func (a *Allocator) FreeBytes() uint64 {
	var n uint64
	for _, s := range a.free {
		n += s.Size
	}
	return n
}

// Largest is the largest free span, 0 if none.
func (a *Allocator) Largest() uint64 {
	var n uint64
	for _, s := range a.free {
		n = max(n, s.Size)
	}
	return n
}

// Top is the highest end address of any block ever allocated.
func (a *Allocator) Top() uint64 { return a.top }

func (a *Allocator) regionOf(addr uint64) uint64 {
	for base, size := range a.regions {
		if addr >= base && addr-base < size {
			return base
		}
	}
	return 0
}

// find returns the index of the span starting at addr.
func (a *Allocator) find(addr uint64) int {
	return sort.Search(len(a.free), func(i int) bool { return a.free[i].Addr >= addr })
}

// insert adds a free span and merges it with adjacent spans of its region.
func (a *Allocator) insert(s Span) {
	i := a.find(s.Addr)
	if i > 0 {
		if p := a.free[i-1]; p.Region == s.Region && p.Addr+p.Size == s.Addr {
			s = Span{Addr: p.Addr, Size: p.Size + s.Size, Region: s.Region}
			i--
			a.free = append(a.free[:i], a.free[i+1:]...)
		}
	}
	if i < len(a.free) {
		if n := a.free[i]; n.Region == s.Region && s.Addr+s.Size == n.Addr {
			s.Size += n.Size
			a.free = append(a.free[:i], a.free[i+1:]...)
		}
	}
	a.free = append(a.free, Span{})
	copy(a.free[i+1:], a.free[i:])
	a.free[i] = s
}
