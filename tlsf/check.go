package tlsf

import (
	"fmt"
	"math/bits"
)

// Stats are the index's totals, in bytes and blocks.
type Stats struct {
	Regions         int
	Total           uint64 // bytes in all regions
	Allocated       uint64 // bytes in allocated blocks (rounded sizes)
	Free            uint64 // Total − Allocated
	AllocatedBlocks int
	FreeBlocks      int
	LargestFree     uint64 // the largest free block
}

// FreeBytes returns the bytes in free blocks, Total − Allocated of Stats,
// in O(1).
func (x *Index) FreeBytes() uint64 { return x.total - x.allocated }

// Stats returns the totals. It costs O(1) plus a walk of the top non-empty
// size-class list, whose blocks share one size class, and of the
// wilderness list (Config.Wilderness: a block per region at most).
func (x *Index) Stats() Stats {
	return Stats{
		Regions:         len(x.reg.order),
		Total:           x.total,
		Allocated:       x.allocated,
		Free:            x.total - x.allocated,
		AllocatedBlocks: x.allocBlocks,
		FreeBlocks:      x.freeBlocksN,
		LargestFree:     x.LargestFree(),
	}
}

// LargestFree returns the size of the largest free block in bytes (0 when
// none): the largest block of the highest non-empty size-class list or of
// the wilderness list (Config.Wilderness).
func (x *Index) LargestFree() uint64 {
	largest := x.largestWild()
	if fl, sl, ok := x.topList(); ok {
		for b := x.heads[listIndex(fl, sl)]; b != nilRec; b = x.blocks[b].nextFree {
			largest = max(largest, x.blocks[b].size)
		}
	}
	return largest
}

// topList returns the highest non-empty size-class list (the wilderness
// list left out), or false when there is none.
func (x *Index) topList() (fl, sl uint, ok bool) {
	m := x.flBitmap &^ (1 << wildFL)
	if m == 0 {
		return 0, 0, false
	}
	fl = uint(63 - bits.LeadingZeros64(m))
	return fl, uint(63 - bits.LeadingZeros64(x.slBitmap[fl&63])), true
}

// largestWild returns the size of the largest block of the wilderness
// list (Config.Wilderness: one per region at most), or 0.
func (x *Index) largestWild() uint64 {
	var largest uint64
	for b := x.heads[wildList]; b != nilRec; b = x.blocks[b].nextFree {
		largest = max(largest, x.blocks[b].size)
	}
	return largest
}

// Walk calls fn for every block in address order (tlsf_walk_pool) until fn
// returns false. fn must not change the index.
func (x *Index) Walk(fn func(Block) bool) {
	for _, s := range x.reg.order {
		for b := x.reg.slots[s].first; b != nilRec; b = x.blocks[b].nextPhys {
			if !fn(x.public(b)) {
				return
			}
		}
	}
}

// Check verifies every invariant of the index (tlsf_check) and returns an
// error wrapping ErrCorrupt describing the first one broken:
//   - the blocks of each region tile it exactly, in address order, with
//     consistent links, each a non-zero multiple of the granularity;
//   - no two adjacent blocks are both free;
//   - every free block is in the list its size maps to (a region's top
//     block under Config.Wilderness: the wilderness list), once; every
//     listed block is free; the FL and SL bitmaps mark exactly the
//     non-empty lists;
//   - the address table holds exactly the allocated blocks' starts;
//   - allocated and free byte counts and block counts match a walk;
//     regions are sorted and disjoint.
//
// It costs O(blocks + lists) and is meant for tests.
func (x *Index) Check() error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	var total, allocated uint64
	var nAlloc, nFree int
	var prevEnd uint64
	for i, s := range x.reg.order {
		r := &x.reg.slots[s]
		if !r.inUse {
			return fail("region slot %d in order but not in use", s)
		}
		if i > 0 && r.base < prevEnd {
			return fail("region %#x overlaps or precedes the one before", r.base)
		}
		prevEnd = r.base + r.size
		at := r.base
		var regAlloc uint64
		prev := nilRec
		prevFree := false
		for b := r.first; b != nilRec; b = x.blocks[b].nextPhys {
			bk := &x.blocks[b]
			switch {
			case bk.addr != at:
				return fail("block %d at %#x, expected %#x", b, bk.addr, at)
			case bk.size == 0 || bk.size%x.gran != 0 || bk.size > MaxSize:
				return fail("block %#x has size %d", bk.addr, bk.size)
			case bk.prevPhys != prev:
				return fail("block %#x: prevPhys %d, expected %d", bk.addr, bk.prevPhys, prev)
			case bk.free() && prevFree:
				return fail("adjacent free blocks at %#x", bk.addr)
			}
			if bk.free() {
				nFree++
				if !x.listed(b) {
					return fail("free block %#x is not in list %v", bk.addr, x.listOf(bk))
				}
			} else {
				nAlloc++
				regAlloc += bk.size
				if rec, ok := x.live.Get(bk.addr); !ok || rec != uint64(b) {
					return fail("allocated block %#x missing from the address table", bk.addr)
				}
			}
			prevFree = bk.free()
			at += bk.size
			prev = b
		}
		if at != r.base+r.size {
			return fail("region %#x: blocks end at %#x, region at %#x", r.base, at, r.base+r.size)
		}
		if prev != r.last {
			return fail("region %#x: last block %d, recorded %d", r.base, prev, r.last)
		}
		total += r.size
		allocated += regAlloc
	}
	if total != x.total || allocated != x.allocated {
		return fail("totals: walk %d/%d, recorded %d/%d (total/allocated)", total, allocated, x.total, x.allocated)
	}
	if nAlloc != x.allocBlocks || nFree != x.freeBlocksN {
		return fail("block counts: walk %d/%d, recorded %d/%d (allocated/free)", nAlloc, nFree, x.allocBlocks, x.freeBlocksN)
	}
	if x.live.Len() != nAlloc {
		return fail("address table holds %d entries for %d allocated blocks", x.live.Len(), nAlloc)
	}
	return x.checkLists(nFree)
}

// listOf names the list of free record bk, for messages.
func (x *Index) listOf(bk *block) [2]uint {
	fl, sl := x.listFor(bk)
	return [2]uint{fl, sl}
}

// listed reports whether free record b is in its list (listFor). The
// walk stops at an allocated record, whose nextFree is its tag, not a
// link, so that Check reports such a list (b is then not in it) instead
// of following a tag.
func (x *Index) listed(b uint32) bool {
	fl, sl := x.listFor(&x.blocks[b])
	for c := x.heads[listIndex(fl, sl)]; c != nilRec && x.blocks[c].free(); c = x.blocks[c].nextFree {
		if c == b {
			return true
		}
	}
	return false
}

// checkLists verifies the free lists and both bitmaps; nFree is the number
// of free blocks a walk found.
func (x *Index) checkLists(nFree int) error {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%w: %s", ErrCorrupt, fmt.Sprintf(format, args...))
	}
	listed := 0
	for fl := uint(0); fl < 64; fl++ {
		if (x.flBitmap>>fl&1 == 1) != (x.slBitmap[fl] != 0) {
			return fail("FL bitmap bit %d disagrees with SL bitmap %#x", fl, x.slBitmap[fl])
		}
		for sl := uint(0); sl < 64; sl++ {
			// Sizes map to first-level indexes below numFL and to
			// second-level ones below 2^SLLog2; the wilderness list is
			// (wildFL, wildSL).
			used := fl < x.numFL && sl < 1<<x.slLog2 || fl == wildFL && sl == wildSL
			if !used {
				if x.slBitmap[fl]>>sl&1 == 1 || x.heads[listIndex(fl, sl)] != nilRec {
					return fail("list (%d,%d), which no block maps to, is not empty", fl, sl)
				}
				continue
			}
			head := x.heads[listIndex(fl, sl)]
			if (x.slBitmap[fl]>>sl&1 == 1) != (head != nilRec) {
				return fail("SL bitmap bit (%d,%d) disagrees with its list", fl, sl)
			}
			prev := nilRec
			for b := head; b != nilRec; b = x.blocks[b].nextFree {
				bk := &x.blocks[b]
				if !bk.free() {
					return fail("allocated block %#x in list (%d,%d)", bk.addr, fl, sl)
				}
				if f, s := x.listFor(bk); f != fl || s != sl {
					return fail("block %#x of %d bytes in list (%d,%d), belongs in (%d,%d)", bk.addr, bk.size, fl, sl, f, s)
				}
				if bk.prevFree != prev {
					return fail("block %#x: prevFree %d, expected %d", bk.addr, bk.prevFree, prev)
				}
				prev = b
				if listed++; listed > nFree {
					return fail("more listed blocks than free blocks (a cycle?)")
				}
			}
		}
	}
	if listed != nFree {
		return fail("%d blocks listed, %d free", listed, nFree)
	}
	return nil
}
