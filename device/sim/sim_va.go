package sim

// The simulated virtual address space of one process.
//
// A process's window of addresses is handed out lowest-first-fit: a sorted
// list of free ranges, searched from the bottom for the first range that
// holds the size at the alignment asked. Freed ranges merge with their
// neighbours. The driver's allocator is not documented, but it reuses low
// freed addresses much like this, and first fit makes addresses depend
// only on the sequence of calls: deterministic.
//
// Linear allocations and VMM reservations come from the same list, so they
// never overlap. The list is a slice: O(free ranges) per call, which is
// what a simulator for tests can afford.

import "sort"

// simRange is the address range [lo, hi).
type simRange struct{ lo, hi uintptr }

// simVA is a window of virtual addresses with a free list.
type simVA struct {
	lo, hi uintptr    // the window [lo, hi)
	free   []simRange // sorted, disjoint, never adjacent, never empty
}

func newSimVA(base uintptr, span uint64) simVA {
	return simVA{lo: base, hi: base + uintptr(span), free: []simRange{{base, base + uintptr(span)}}}
}

// alloc takes the lowest range of size bytes aligned to align (a power of
// two) and returns its start, or false if none is free.
func (v *simVA) alloc(size, align uint64) (uintptr, bool) {
	if size == 0 || size > uint64(v.hi-v.lo) {
		return 0, false
	}
	for i, r := range v.free {
		a := alignUp(r.lo, uintptr(align))
		if a < r.lo || a >= r.hi || uint64(r.hi-a) < size {
			continue
		}
		end := a + uintptr(size)
		var repl []simRange
		if a > r.lo {
			repl = append(repl, simRange{r.lo, a})
		}
		if end < r.hi {
			repl = append(repl, simRange{end, r.hi})
		}
		v.free = append(v.free[:i], append(repl, v.free[i+1:]...)...)
		return a, true
	}
	return 0, false
}

// release returns [lo, lo+size), which alloc handed out, to the free list.
func (v *simVA) release(lo uintptr, size uint64) {
	hi := lo + uintptr(size)
	i := sort.Search(len(v.free), func(i int) bool { return v.free[i].lo > lo })
	mergePrev := i > 0 && v.free[i-1].hi == lo
	mergeNext := i < len(v.free) && v.free[i].lo == hi
	switch {
	case mergePrev && mergeNext:
		v.free[i-1].hi = v.free[i].hi
		v.free = append(v.free[:i], v.free[i+1:]...)
	case mergePrev:
		v.free[i-1].hi = hi
	case mergeNext:
		v.free[i].lo = lo
	default:
		v.free = append(v.free, simRange{})
		copy(v.free[i+1:], v.free[i:])
		v.free[i] = simRange{lo, hi}
	}
}

// alignUp rounds p up to a multiple of align, a power of two; it wraps to
// a value below p on overflow, which callers check.
func alignUp(p, align uintptr) uintptr { return (p + align - 1) &^ (align - 1) }

// roundUp64 rounds n up to a multiple of align (a power of two) and
// reports false on overflow.
func roundUp64(n, align uint64) (uint64, bool) {
	r := (n + align - 1) &^ (align - 1)
	return r, r >= n
}
