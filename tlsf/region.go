package tlsf

import (
	"fmt"
	"sort"
)

// region is one address range [base, base+size) under the index. Its
// blocks form a doubly linked list in address order from first to last;
// blocks never link across regions, so they never merge across them.
type region struct {
	base, size  uint64
	first, last uint32 // block records at the bottom and top
	inUse       bool
}

// regionSet holds regions in stable slots and keeps the slots in use
// sorted by base for lookups by address (a block's region is found from
// its address).
type regionSet struct {
	slots []region
	spare []uint32
	order []uint32 // slots in use, by increasing base
}

// find returns the slot of the region containing addr. The index calls it
// whenever the top block of a region changes, so it avoids sort.Search's
// closure: a VMM pool's index has one region.
func (s *regionSet) find(addr uint64) (uint32, bool) {
	if len(s.order) == 1 { // a VMM pool's index, a replay's
		r := s.order[0]
		return r, addr-s.slots[r].base < s.slots[r].size
	}
	// Binary search for the last region whose base is at most addr.
	lo, hi := 0, len(s.order) // the answer is in [lo-1, hi)
	for lo < hi {
		m := int(uint(lo+hi) >> 1)
		if s.slots[s.order[m]].base <= addr {
			lo = m + 1
		} else {
			hi = m
		}
	}
	if lo == 0 {
		return 0, false
	}
	r := s.order[lo-1]
	if addr-s.slots[r].base < s.slots[r].size {
		return r, true
	}
	return 0, false
}

// byBase returns the position in order and the slot of the region whose
// base is exactly base.
func (s *regionSet) byBase(base uint64) (int, uint32, bool) {
	i := sort.Search(len(s.order), func(i int) bool { return s.slots[s.order[i]].base >= base })
	if i < len(s.order) && s.slots[s.order[i]].base == base {
		return i, s.order[i], true
	}
	return i, 0, false
}

// RegionInfo describes one region: Size bytes from Base, of which
// Allocated are in allocated blocks.
type RegionInfo struct {
	Base, Size, Allocated uint64
}

// checkRange validates a region's or growth's base and size.
func (x *Index) checkRange(what string, base, size uint64) error {
	switch {
	case size == 0:
		return fmt.Errorf("%w: %s of zero bytes", ErrBadRegion, what)
	case base%x.gran != 0 || size%x.gran != 0:
		return fmt.Errorf("%w: %s [%#x +%d) is not a multiple of the granularity %d", ErrBadRegion, what, base, size, x.gran)
	case size > MaxSize:
		return fmt.Errorf("%w: %s of %d bytes exceeds MaxSize", ErrBadRegion, what, size)
	case base+size < base:
		return fmt.Errorf("%w: %s [%#x +%d) wraps around 2^64", ErrBadRegion, what, base, size)
	}
	return nil
}

// AddRegion adds [base, base+size) as one free block. base and size must
// be multiples of the granularity, size at most MaxSize.
//
// Errors: ErrBadRegion (misaligned, empty, too large or wrapping),
// ErrRegionOverlap (intersects a region already added).
func (x *Index) AddRegion(base, size uint64) error {
	if err := x.checkRange("region", base, size); err != nil {
		return err
	}
	pos, _, _ := x.reg.byBase(base)
	if pos > 0 {
		p := &x.reg.slots[x.reg.order[pos-1]]
		if p.base+p.size > base {
			return fmt.Errorf("%w: [%#x +%d) meets [%#x +%d)", ErrRegionOverlap, base, size, p.base, p.size)
		}
	}
	if pos < len(x.reg.order) {
		n := &x.reg.slots[x.reg.order[pos]]
		if base+size > n.base {
			return fmt.Errorf("%w: [%#x +%d) meets [%#x +%d)", ErrRegionOverlap, base, size, n.base, n.size)
		}
	}

	var slot uint32
	if k := len(x.reg.spare); k > 0 {
		slot = x.reg.spare[k-1]
		x.reg.spare = x.reg.spare[:k-1]
	} else {
		x.reg.slots = append(x.reg.slots, region{})
		slot = uint32(len(x.reg.slots) - 1)
	}
	b := x.newRecord()
	x.blocks[b] = block{addr: base, size: size, prevPhys: nilRec, nextPhys: nilRec,
		prevFree: nilRec, nextFree: nilRec}
	x.reg.slots[slot] = region{base: base, size: size, first: b, last: b, inUse: true}
	x.reg.order = append(x.reg.order, 0)
	copy(x.reg.order[pos+1:], x.reg.order[pos:])
	x.reg.order[pos] = slot
	x.total += size
	x.freeBlocksN++
	x.link(b)
	return nil
}

// GrowRegion extends the region that starts at base by extra bytes at its
// end. A free block at the region's top grows to cover them (and moves to
// its new list; under Config.Wilderness it stays in the wilderness list);
// otherwise they become a new free block.
//
// Errors: ErrBadRegion (no region starts at base; extra misaligned or zero;
// the region would exceed MaxSize or wrap), ErrRegionOverlap (the growth
// would meet the next region).
func (x *Index) GrowRegion(base, extra uint64) error {
	pos, slot, ok := x.reg.byBase(base)
	if !ok {
		return fmt.Errorf("%w: no region starts at %#x", ErrBadRegion, base)
	}
	r := &x.reg.slots[slot]
	if err := x.checkRange("growth", r.base+r.size, extra); err != nil {
		return err
	}
	if r.size+extra > MaxSize {
		return fmt.Errorf("%w: region at %#x would grow to %d bytes, above MaxSize", ErrBadRegion, base, r.size+extra)
	}
	end := r.base + r.size
	if pos+1 < len(x.reg.order) {
		if n := &x.reg.slots[x.reg.order[pos+1]]; end+extra > n.base {
			return fmt.Errorf("%w: growing [%#x +%d) by %d meets [%#x +%d)", ErrRegionOverlap, r.base, r.size, extra, n.base, n.size)
		}
	}
	if last := r.last; x.blocks[last].free() {
		x.unlink(last)
		x.blocks[last].size += extra
		x.link(last)
	} else {
		b := x.newRecord()
		r = &x.reg.slots[slot]
		x.blocks[b] = block{addr: end, size: extra, prevPhys: last, nextPhys: nilRec,
			prevFree: nilRec, nextFree: nilRec}
		x.blocks[last].nextPhys = b
		r.last = b
		x.freeBlocksN++
		x.link(b)
	}
	r.size += extra
	x.total += extra
	return nil
}

// RemoveRegion removes the region that starts at base, which must be
// wholly free (then it is a single free block).
//
// Errors: ErrBadRegion (no region starts at base), ErrRegionBusy (it has
// allocated blocks).
func (x *Index) RemoveRegion(base uint64) error {
	pos, slot, ok := x.reg.byBase(base)
	if !ok {
		return fmt.Errorf("%w: no region starts at %#x", ErrBadRegion, base)
	}
	r := &x.reg.slots[slot]
	if b := r.first; !x.blocks[b].free() || b != r.last {
		return fmt.Errorf("%w: region at %#x has %d bytes allocated", ErrRegionBusy, base, x.regionAllocated(slot))
	}
	b := r.first // the only block: free, and merged with everything
	x.unlink(b)
	x.freeBlocksN--
	x.spare = append(x.spare, b)
	x.total -= r.size
	*r = region{}
	x.reg.spare = append(x.reg.spare, slot)
	x.reg.order = append(x.reg.order[:pos], x.reg.order[pos+1:]...)
	return nil
}

// regionAllocated walks a region and sums its allocated blocks.
func (x *Index) regionAllocated(slot uint32) uint64 {
	var n uint64
	for b := x.reg.slots[slot].first; b != nilRec; b = x.blocks[b].nextPhys {
		if !x.blocks[b].free() {
			n += x.blocks[b].size
		}
	}
	return n
}

func (x *Index) regionInfo(slot uint32) RegionInfo {
	r := &x.reg.slots[slot]
	return RegionInfo{Base: r.base, Size: r.size, Allocated: x.regionAllocated(slot)}
}

// Regions returns every region in address order. It walks every block
// (Allocated is not kept per region, off the hot path).
func (x *Index) Regions() []RegionInfo {
	out := make([]RegionInfo, 0, len(x.reg.order))
	for _, s := range x.reg.order {
		out = append(out, x.regionInfo(s))
	}
	return out
}

// RegionOf returns the region containing addr, walking its blocks.
func (x *Index) RegionOf(addr uint64) (RegionInfo, bool) {
	s, ok := x.reg.find(addr)
	if !ok {
		return RegionInfo{}, false
	}
	return x.regionInfo(s), true
}

// Last returns the block at the top of the region that starts at base:
// the block GrowRegion would extend when it is free.
// Errors: ErrBadRegion (no region starts at base).
func (x *Index) Last(base uint64) (Block, error) {
	_, slot, ok := x.reg.byBase(base)
	if !ok {
		return Block{}, fmt.Errorf("%w: no region starts at %#x", ErrBadRegion, base)
	}
	return x.public(x.reg.slots[slot].last), nil
}

// SetWilderness turns Config.Wilderness on or off from now on: each
// region's free top block moves to the list it then belongs in. In
// O(regions).
func (x *Index) SetWilderness(on bool) {
	if x.wild == on {
		return
	}
	var tops []uint32
	for _, s := range x.reg.order {
		if b := x.reg.slots[s].last; x.blocks[b].free() {
			x.unlink(b)
			tops = append(tops, b)
		}
	}
	x.wild = on
	for _, b := range tops {
		x.link(b)
	}
}

// Wilderness reports whether Config.Wilderness is on (SetWilderness).
func (x *Index) Wilderness() bool { return x.wild }
