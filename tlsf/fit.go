package tlsf

// Good fit within the request's own list.
//
// Alloc rounds a request up to the next class boundary and takes the head
// of the first non-empty list at or above it (TLSF §3.3): O(1), but a
// block is never taken from the list the request itself falls in, even
// when that list holds a block of exactly the right size, and every block
// carries up to 1/2^SLLog2 of rounding. On the shared traces, whose
// training loops free and allocate the same sizes step after step, that
// leaves blocks that would fit unused while the range grows.
//
// AllocFit allocates the request rounded up to the granularity only, and
// first scans the request's own second-level list for the smallest block
// that holds it (best fit within the list), stopping at an exact fit or
// after FitScan blocks; only if none fits does it take the head of the
// next non-empty list, as Alloc does. The bound changes from O(1) to
// O(FitScan): a scan reads at most FitScan 32-byte records. Only where no
// later list has a block either, on the way to ErrNoSpace, does it read
// the rest of the own list (O(its length)): a block that holds the
// request past the first FitScan is taken rather than failing, so that
// AllocFit fails only when no free block holds the request. Before, a
// pool whose free top sat behind 64 smaller blocks of its list failed a
// request the top held, on an empty device (pool: the free top is never
// grown for a request it holds already).

// FitScan is the most blocks AllocFit examines in the request's own list.
// 64 records are 2 KiB, a few dozen cache lines at most. Measured on the
// shared traces through the pool (simulated H200, 1 MiB caches, peak
// reserved over peak live after a cold and two warm replays): best fit in
// the own list, an exact fit only, and the first fit in the own list give
// the same figures within 0.5% (lstm 1.120, resnet50 1.020–1.026, tdnn
// 1.204), against Alloc's 1.142, 1.023, 1.182: the own list is short, and
// the bound is a guard against pathological lists, not a tuning knob.
//
// The pool places with AllocFit by default (pool.Options.GoodFit for
// Alloc): with per-P caches for blocks of 4 KiB and less it reserves less
// than Alloc with 1 MiB caches on lstm and resnet50, and within 1% on
// tdnn (pool/options.go gives those figures, the default's); with 1 MiB
// caches its figures sum to Alloc's (better on lstm, worse on tdnn). The
// index alone gains 0.7% on lstm and nothing elsewhere (bench/,
// top/live: the address-ordered best fit reference does no better).
const FitScan = 64

// AllocFit allocates a block of size bytes rounded up to the granularity:
// the best fit among the first FitScan blocks of the request's own
// second-level list, else the head of the next non-empty list (Alloc's
// good fit), else the first block past those FitScan that holds it. The
// block's Size is the rounded request, not a class boundary. In
// O(FitScan), except where it fails or takes a block past the first
// FitScan: O(the own list's length).
//
// Errors: as Alloc; ErrNoSpace only when no free block holds the
// rounded request.
func (x *Index) AllocFit(size uint64) (Block, error) {
	if size-1 >= MaxSize { // size == 0 wraps around
		return Block{}, x.checkSize(size)
	}
	r := (size + x.granMask) &^ x.granMask
	b, i := x.findOwn(r)
	switch {
	case b != nilRec:
		x.unlink(b)
	default:
		if b, i = x.findSuitable(x.roundUp(r), r); b != nilRec {
			x.popHead(b, i)
			break
		}
		if b = x.findOwnPast(r); b == nilRec {
			return Block{}, ErrNoSpace
		}
		x.unlink(b)
	}
	x.splitTail(b, r)
	return x.markAllocated(b), nil
}

// findOwn returns the smallest block of at least r bytes among the first
// FitScan blocks of r's own list (insert(r)), or nilRec, with the list's
// index.
func (x *Index) findOwn(r uint64) (uint32, uint) {
	fl, sl := x.insert(r)
	if x.slBitmap[fl&63]&(1<<(sl&63)) == 0 {
		return nilRec, 0
	}
	i := listIndex(fl, sl)
	best, bestSize := nilRec, uint64(1<<64-1)
	n := 0
	for b := x.heads[i]; b != nilRec && n < FitScan; n++ {
		bk := &x.blocks[b]
		if bk.size >= r && bk.size < bestSize {
			best, bestSize = b, bk.size
			if bk.size == r {
				break
			}
		}
		b = bk.nextFree
	}
	return best, i
}

// findOwnPast returns the first block of at least r bytes past the first
// FitScan blocks of r's own list, or nilRec: AllocFit's last resort.
func (x *Index) findOwnPast(r uint64) uint32 {
	fl, sl := x.insert(r)
	if x.slBitmap[fl&63]&(1<<(sl&63)) == 0 {
		return nilRec
	}
	n := 0
	for b := x.heads[listIndex(fl, sl)]; b != nilRec; n++ {
		bk := &x.blocks[b]
		if n >= FitScan && bk.size >= r {
			return b
		}
		b = bk.nextFree
	}
	return nilRec
}

// LargestAlloc returns the largest request Alloc accepts now without
// ErrNoSpace: the lower bound of the highest non-empty size-class list (a
// request one byte above it rounds up past every free block of that
// list), or, where larger, that of the list the largest wilderness block
// maps to (Config.Wilderness), or 0. In O(1), plus O(regions) under
// Wilderness.
func (x *Index) LargestAlloc() uint64 {
	var largest uint64
	if fl, sl, ok := x.topList(); ok {
		largest = x.classMin(fl, sl)
	}
	// A wilderness block of s bytes takes any request that rounds up to at
	// most s: up to the lower bound of the list s maps to.
	if w := x.largestWild(); w > 0 {
		largest = max(largest, x.classMin(x.insert(w)))
	}
	return largest
}

// LargestFit returns the largest request AllocFit would accept now: the
// size of the largest free block (AllocFit takes a block of exactly that
// size from its own list, the top one, where no later list has a block),
// or 0. In O(the top list's length), plus O(regions) under Wilderness.
func (x *Index) LargestFit() uint64 {
	// A request AllocFit finds no other block for takes the first
	// wilderness block that holds it: any of them.
	largest := x.largestWild()
	if fl, sl, ok := x.topList(); ok {
		for b := x.heads[listIndex(fl, sl)]; b != nilRec; b = x.blocks[b].nextFree {
			largest = max(largest, x.blocks[b].size)
		}
	}
	return largest
}
