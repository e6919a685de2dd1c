package pool

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/tlsf"
)

// vmmHeap is one virtual address range [base, base+vsize) reserved with
// cuMemAddressReserve. The index sees [base, end) as one region that grows
// at its end; every page (one allocation granule, 2 MiB on an H200) below
// end is mapped, as part of one physical allocation (a handle: cuMemCreate
// + cuMemMap) of one or more pages, or is a hole: a page released because
// it lay wholly under free blocks, mapped again when a block that covers
// it is allocated. Pages at or above end are never mapped.
//
// # Handle size
//
// On an H200 the driver's cost is per handle and mapping, nearly whatever
// their size (sim_latency.go: about 40 µs to create, map and grant access
// to a 2 MiB handle, 38 µs for 20 MiB, 47 µs for 128 MiB), and batching
// cuMemSetAccess over a range of mappings buys nothing. So a growth maps
// its memory as one handle (up to maxHandlePages pages): a pool that grows
// by 36 MiB at a time pays for one handle, not 18. The price is release
// granularity: cuMemUnmap must cover whole mappings, so a handle is
// released only when all of its pages lie under free blocks; and a handle
// maps whole, so it moves whole: the H200's driver (580, CUDA 13) refuses
// a cuMemMap of part of a handle, from offset 0 or another, with
// CUDA_ERROR_NOT_SUPPORTED (bench/multi/h200/2026-12-04/offset.py). Where that
// matters, the pool asks for one-page handles (fine): in a capped pool, as
// the smallest feasible cap needs memory to move at the finest granularity
// the driver allows; a pool that recycles memory under ReleaseFraction
// with no cap asks for handles of at most a fraction of its peak
// (releasePages). Pool.setFine says when, and when not. Holes under a
// block mapped again while the heap is not fine get large handles inside
// the block and one-page handles for its first and last page, which it may
// share with its neighbours. On a device other processes share
// (Pool.setShared), a fine heap's growths and mappings of holes map the
// block they are for the same way, in handles of up to a 1024th of the
// cap: memory moving between processes moves at the handles' granularity,
// and one-page handles make filling and moving a share cost driver calls
// per 2 MiB. A MaxFraction of one half or less declares the device shared
// from the start, with handles of up to a 2048th of the cap.
type vmmHeap struct {
	dev     *counted
	x       *tlsf.Index
	gran    uint64 // bytes per page
	base    uint64
	vsize   uint64
	end     uint64             // top of the index's region; base when none yet
	handles []device.MemHandle // by page: the handle mapped over it; valid where mapped
	start   []uint32           // by page: the first page of its mapping; valid where mapped
	mapped  []bool             // by page
	// fine: the next mappings use one-page handles, and one-page handles
	// unmapped with keep become spares (set by the pool before it grows,
	// backs or moves pages: Pool.setFine says when). Otherwise mappings
	// use handles of up to maxHandlePages pages (releasePages under
	// ReleaseFraction) and one-page handles unmapped are released (unless
	// keepSmall or releasePages). Larger handles unmapped with keep become
	// spares either way.
	fine bool
	// keepSmall: one-page handles unmapped with keep become spares even
	// while not fine. The out-of-memory path sets it while it moves
	// memory for a request it must serve (Pool.releaseFor): released,
	// their memory could go to another process before the mapping that
	// follows asks for it again.
	keepSmall bool
	// releasePages, where above 0: the pool recycles memory under
	// ReleaseFraction with no cap (Pool.setFine), new handles have at most
	// releasePages pages, and one-page handles unmapped with keep become
	// spares, as in a fine heap: the mapping that follows takes them.
	releasePages uint64
	// releaseShift halves releasePages once for each move that fell short
	// of the line ReleaseFraction draws and set a peak above it
	// (Pool.makeRoom): memory pinned in large handles partly under live
	// blocks could not move.
	releaseShift uint
	// sharedPages, where at least 2: other processes hold much of the
	// device, or MaxFraction declares it shared (Pool.setShared, as of
	// the pool's last growth), and a
	// growth maps the interior of the block it is for in handles of up to
	// sharedPages pages even while fine (growthRange), as a mapping of
	// the holes under a block does (back).
	sharedPages uint64
	// dropped counts bytes released to the driver by unmaps asked to
	// keep their memory (one-page handles while neither fine nor
	// keepSmall) and by spares released in a mapping (dropSpares), for
	// the pool's statistics (Pool.noteMoved, Pool.noteDropped).
	dropped uint64
	// unmapWork counts the mappings cuMemUnmap calls removed beyond one
	// per call: the driver's cost is per mapping ("Handle size" above),
	// so a call over m mappings is m calls' work (Pool.driverWork).
	unmapWork uint64
	nMapped   uint64 // pages mapped
	holes     uint64 // unmapped pages below end; onChange runs after it changed
	// standby pages, [end, end + standby pages), are mapped above the
	// index's region after the heap started over (startOver): reserved,
	// not in the index, taken back by the next growths (extend) with no
	// driver call. Every path but a growth that looks at free pages
	// (release, recycle) takes them back first, so that only the growths
	// (growAndSearch, growFromStandby), noteFragmentation (which leaves
	// them out of the heap's memory), Stats and the checks see them apart.
	standby uint64
	// orphans are physical allocations unmapped or never mapped whose
	// cuMemRelease failed: still the pool's, counted as reserved, and
	// released again at the next release or Close.
	orphans []orphan
	// stray pages are mapped, without access, by a mapping that failed
	// and could not be undone (cuMemUnmap failed too). They count as
	// mapped (reserved) and, below end, as holes; they are unmapped before
	// the heap next maps, releases or closes.
	stray  []bool // by page
	nStray uint64
	// movable is movablePages's marks, by page, kept between calls.
	movable []bool
	// onChange runs after holes changed (Pool.updateGate).
	onChange func()
	// spares are physical allocations unmapped to move them (recycle,
	// release with keep) and kept for the next mapping, by size: moving a
	// handle costs cuMemUnmap and cuMemMap instead of also cuMemRelease
	// and cuMemCreate. They count as reserved. A mapping takes the largest
	// spare that fits where it maps (mapRun); those that fit nowhere are
	// released as it creates new handles, so reserved memory stays where
	// the pool's cap checks put it.
	//
	// Measured on the H200 (2026-12-01, tlsf-stress multi, ops per
	// second per process and driver calls per operation), keeping
	// multi-page handles as spares against releasing them: K = 2, 30 s,
	// 2,243–2,321 and 8.4–8.8 against 1,449–1,482 and 9.4–9.8; K = 4, 20 s,
	// 1,470–1,596 and 6.7–7.7. On the simulated H200 (K = 2, 80,000
	// operations) 3.3–3.4 calls per operation against 4.1–4.3.
	spares [maxHandlePages + 1][]device.MemHandle // by pages per handle
	nSpare uint64                                 // pages held by spares
	// most is the largest handle, in pages, that the next mapping asks
	// for (0: maxHandlePages): halved when the driver refuses a handle,
	// doubled again after handleStreak handles of that size succeed
	// (mapRun).
	most   uint64
	streak int
	// freeHint is the device's free memory in bytes as the pool just read
	// it (cuMemGetInfo) before a growth, for the next mapRun to size its
	// handles without asking again; valid while freeHintOK.
	freeHint   uint64
	freeHintOK bool
	// refused: the driver refused a cuMemCreate for want of memory
	// since the pool last asked (Pool.noteRefused).
	refused bool
	// note, when set (history on), is told of every run of pages mapped
	// or unmapped: address and bytes (history.go).
	note func(addr, size uint64, mapped bool)
	// peers are other devices granted access to every mapping (peers.go).
	peers []int
}

// maxHandlePages bounds a handle: 64 pages, 128 MiB on an H200. Creating
// a 128 MiB handle costs about what a 2 MiB one does (14.7 against 11.3
// µs), releasing it 56 µs against 12. Larger handles cost less per byte
// still (BenchmarkCUDAVMMHandleSize on the H200, 2026-12-01, µs per 2 MiB
// for create, set-access and release: 0.40, 0.69, 1.31 at 128 MiB; 0.18,
// 0.24, 1.19 at 1 GiB), but a handle is released only when all of it is
// free, and raising the bound to 512 pages bought nothing where it would
// matter most (tlsf-stress multi on the H200, K = 2, 30 s: 1,123 ops/s
// per process against 1,222, as many driver calls per operation; on the
// simulated H200 it cut them from 3.8–4.4 to 2.4–2.6 over 80,000
// operations).
const maxHandlePages = 64

func newVMMHeap(dev *counted, x *tlsf.Index, vsize, total uint64) (*vmmHeap, error) {
	gran, err := dev.AllocationGranularity()
	if err != nil {
		return nil, err
	}
	if vsize == 0 {
		// Twice the device: address space is cheap (the GPU's is 2^49
		// bytes), and fragmentation of it must not end a pool that still
		// has physical memory to map. At most tlsf.MaxSize, which
		// VirtualSize may not exceed either.
		vsize = 2 * min(total, tlsf.MaxSize/2)
	}
	vsize = roundUp(vsize, gran)
	base, err := dev.AddressReserve(vsize, gran)
	if err != nil {
		return nil, fmt.Errorf("pool: reserving %d bytes of address space: %w", vsize, err)
	}
	pages := vsize / gran
	return &vmmHeap{
		dev: dev, x: x, gran: gran, base: uint64(base), vsize: vsize, end: uint64(base),
		handles:  make([]device.MemHandle, pages),
		start:    make([]uint32, pages),
		mapped:   make([]bool, pages),
		stray:    make([]bool, pages),
		onChange: func() {},
	}, nil
}

func (h *vmmHeap) reserved() uint64 {
	n := h.nMapped + h.nSpare
	for _, o := range h.orphans {
		n += o.pages
	}
	return n * h.gran
}
func (h *vmmHeap) granularity() uint64 { return h.gran }
func (h *vmmHeap) spare() uint64       { return h.nSpare * h.gran }

// pushSpare keeps handle mh of k pages, unmapped, for a later mapping.
func (h *vmmHeap) pushSpare(mh device.MemHandle, k uint64) {
	h.spares[k] = append(h.spares[k], mh)
	h.nSpare += k
}

// dropSpares releases spares of more than above pages, the smallest
// first, until at least n pages are released or none is left (counted in
// h.dropped), and returns the pages released.
func (h *vmmHeap) dropSpares(n, above uint64) uint64 {
	var released uint64
	for k := above + 1; k <= maxHandlePages && n > released; k++ {
		for len(h.spares[k]) > 0 && n > released {
			mh, _, _ := h.popSpare(k, k)
			h.dropped += k * h.gran
			h.releaseHandle(mh, k)
			released += k
		}
	}
	return released
}

// popSpare takes the largest spare of at most most pages (and at least
// least), if any.
func (h *vmmHeap) popSpare(least, most uint64) (device.MemHandle, uint64, bool) {
	for k := min(most, maxHandlePages); k >= max(least, 1); k-- {
		if st := h.spares[k]; len(st) > 0 {
			mh := st[len(st)-1]
			h.spares[k] = st[:len(st)-1]
			h.nSpare -= k
			return mh, k, true
		}
	}
	return 0, 0, false
}

// freeTop returns the free block at the top of the heap (the one a growth
// extends), or false where the top block is allocated or there is no
// region yet.
func (h *vmmHeap) freeTop() (tlsf.Block, bool) {
	if h.end == h.base {
		return tlsf.Block{}, false
	}
	last, err := h.x.Last(h.base)
	return last, err == nil && last.Free
}

func (h *vmmHeap) need(size uint64) uint64 {
	var tail uint64
	if last, ok := h.freeTop(); ok {
		tail = last.Size
	}
	if tail >= size {
		return 0
	}
	return roundUp(size-tail, h.gran)
}

// startOver empties the index of a heap that holds no block at all (the
// index's region one free block, no page released or stray) and lowers
// end to base, keeping every page mapped, on standby, for the growths
// that follow (extend): the heap then fills from the bottom as a new
// one would, with no driver call. It reports whether it did.
func (h *vmmHeap) startOver() bool {
	if h.end == h.base || h.holes != 0 || h.nStray != 0 || h.x.FreeBytes() != h.end-h.base {
		return false
	}
	if err := h.x.RemoveRegion(h.base); err != nil {
		return false // not reached: the region is one free block
	}
	h.standby += (h.end - h.base) / h.gran
	h.end = h.base
	return true
}

// extend moves up to k standby pages into the index's region (the free
// top of the heap grows by them) and returns the pages moved.
func (h *vmmHeap) extend(k uint64) uint64 {
	k = min(k, h.standby)
	if k == 0 {
		return 0
	}
	added := k * h.gran
	var err error
	if h.end == h.base {
		err = h.x.AddRegion(h.base, added)
	} else {
		err = h.x.GrowRegion(h.base, added)
	}
	if err != nil { // not reached: the range is ours alone, and mapped
		return 0
	}
	h.end += added
	h.standby -= k
	return k
}

// grow maps up to want bytes of new pages at end (at least need), grants
// access, and extends the index's region. Standby pages, which a growth
// takes first (Pool.growAndSearch), are taken back before it maps.
func (h *vmmHeap) grow(need, want uint64) error {
	h.extend(h.standby)
	room := h.base + h.vsize - h.end
	if need > h.vsize {
		return fmt.Errorf("%w: %d bytes exceed the virtual range of %d bytes", ErrTooLarge, need, h.vsize)
	}
	if need > room {
		return errNoRoom // the range is used up to its end
	}
	want = min(max(want, need), room)
	if err := h.unmapStrays(); err != nil {
		return err
	}
	first := (h.end - h.base) / h.gran
	lo, hi, large := h.growthRange(first, need)
	var lg mapLog
	n, err := h.mapRun(first, want/h.gran, need/h.gran, lo, hi, large, &lg)
	if err != nil {
		return err
	}
	h.settle(&lg)
	added := n * h.gran
	if h.end == h.base {
		err = h.x.AddRegion(h.base, added)
	} else {
		err = h.x.GrowRegion(h.base, added)
	}
	if err != nil { // not reached: the range is ours alone
		h.unmapRun(first, n)
		return err
	}
	h.end += added
	return nil
}

// growthRange returns the pages [lo, hi) in which a growth from page
// first that needs need bytes maps spares of several pages, and the most
// pages of a new handle there (mapRun): all pages, with handles of up to
// handlePages (maxHandlePages, or releasePages under ReleaseFraction)
// where the heap is not fine and of one page where it is;
// except on a shared device (sharedPages) while fine, where it is the
// pages wholly inside the block the growth is for (placed at the bottom of
// the heap's free top block, or at end), which are freed together, with
// handles of up to sharedPages pages.
func (h *vmmHeap) growthRange(first, need uint64) (lo, hi, large uint64) {
	if !h.fine || h.sharedPages < 2 {
		return 0, ^uint64(0), h.handlePages() // spares fit anywhere
	}
	start := h.end
	if last, ok := h.freeTop(); ok {
		start = last.Addr
	}
	// The block ends at or below page first + need/gran; its last page
	// may be shared with the next block.
	hi = first + need/h.gran
	if hi > 0 {
		hi--
	}
	return (start - h.base + h.gran - 1) / h.gran, hi, h.sharedPages
}

// handleStreak is how many handles of the largest size the heap asks for
// must succeed before it asks for twice that size again (mapRun).
const handleStreak = 16

// mapRun maps up to n pages from page first (at least least of them,
// else none), then grants access to the whole run. At each page it maps
// the largest spare that fits: within [lo, hi) and the run, else one of
// one page; where none fits, a new handle of up to min(large, h.most)
// pages where the pages lie in [lo, hi), else of one page (callers pass
// large = 1 where the heap is fine and must move at the finest grain).
// Spares that fit nowhere in the run are released (dropSpares), at least
// as many pages as it created: before each new handle, those larger than
// any run of pages left for them, up to the pages created so far and the
// handle's, so that the device has their memory for it; the rest when the
// caller settles lg, the log of its mappings, after every run it maps
// succeeded (settle). (A handle that then comes out smaller, or is
// refused, leaves reserved memory below what the caller planned, never
// above.) A run that fails undoes its own mappings (undoMaps) and leaves
// lg as it found it, but for the spares it released for new handles.
//
// A handle larger than a page is no larger than the device's free memory
// (cuMemGetInfo, asked once per run that wants one). One that the driver
// refuses all the same is tried again at half the size, down to one page,
// and later mappings keep the smaller size until handleStreak handles of
// it succeed: under contention between processes the device may not have
// the larger size again soon, and on the H200 a refused cuMemCreate costs
// more than the smaller ones that follow it. Measured on the H200
// (2026-12-01, tlsf-stress multi, K = 2, 30 s; ops per second per
// process and driver calls per operation): asking for the full size at
// every mapping, 822–836 and 7.5–7.6; remembering the refused size,
// 1,222–1,225 and 10.4–10.6; remembering it and sizing to free memory,
// 1,449–1,482 and 9.4–9.8. (Handles of up to 512 pages instead of 64 gave
// 1,123 and 10.4–10.6.) It returns how many pages it mapped.
func (h *vmmHeap) mapRun(first, n, least, lo, hi, large uint64, lg *mapLog) (uint64, error) {
	var done uint64
	var err error
	if h.most == 0 {
		h.most = maxHandlePages
	}
	free, asked := h.freeHint, h.freeHintOK // the device's free memory, once known
	h.freeHintOK = false
	start := len(lg.maps)
	for done < n {
		p := first + done
		var mh device.MemHandle
		k := uint64(1)
		// The largest spare that fits: inside [lo, hi) one of several
		// pages, else one of one page.
		fit := uint64(1)
		if p >= lo && p < hi {
			fit = min(n-done, hi-p)
		}
		var spare bool
		mh, k, spare = h.popSpare(1, fit)
		if !spare {
			k = 1
			if p >= lo && p < hi {
				k = max(1, min(n-done, hi-p, h.most, large))
			}
			// Spares larger than any run of pages left for them fit
			// nowhere in this run: those it would release at its end (as
			// many pages as it creates) go first, so that the device has
			// their memory for this handle. On a full device shared with
			// other processes, creating first fails, or takes memory a
			// neighbour just gave back.
			if h.nSpare > 0 && lg.created+k > lg.dropped {
				r := h.dropSpares(lg.created+k-lg.dropped, maxFit(p, first+n, lo, hi))
				lg.dropped += r
				free += r * h.gran
			}
			if k > 1 {
				if !asked {
					if f, _, gerr := h.dev.MemGetInfo(); gerr == nil {
						free, asked = f, true
					}
				}
				if asked {
					k = max(1, min(k, free/h.gran))
				}
			}
			mh, err = h.create(k)
			for err != nil && k > 1 {
				h.most, h.streak = max(k/2, 1), 0
				k = h.most
				mh, err = h.create(k)
			}
			if err != nil {
				break
			}
			free -= min(free, k*h.gran)
			if k == h.most && k < maxHandlePages {
				if h.streak++; h.streak >= handleStreak {
					h.most, h.streak = min(2*h.most, maxHandlePages), 0
				}
			}
		}
		if err = h.dev.MemMap(uintptr(h.pageAddr(p)), k*h.gran, mh); err != nil {
			if spare {
				h.pushSpare(mh, k)
			} else {
				h.releaseHandle(mh, k)
			}
			break
		}
		for q := p; q < p+k; q++ {
			h.handles[q] = mh
			h.start[q] = uint32(p)
			h.mapped[q] = true
		}
		h.nMapped += k
		done += k
		lg.maps = append(lg.maps, logMap{p: p, k: k, spare: spare})
		if !spare {
			lg.created += k
		}
	}
	if h.note != nil && done > 0 {
		h.note(h.pageAddr(first), done*h.gran, true)
	}
	if err != nil && done < least {
		h.undoMaps(lg, start)
		return 0, err
	}
	if done == 0 {
		return 0, err
	}
	if aerr := h.setAccess(uintptr(h.pageAddr(first)), done*h.gran); aerr != nil {
		h.undoMaps(lg, start)
		return 0, aerr
	}
	return done, nil
}

// mapLog records the mappings of one growth or backing (mapRun), for
// their undo (undoMaps) or settling (settle): each mapping, and the pages
// of new handles created and of spares released for them.
type mapLog struct {
	maps             []logMap
	created, dropped uint64
}

// logMap is one mapping: k pages from page p, of a handle taken from the
// spares or created for it.
type logMap struct {
	p, k  uint64
	spare bool
}

// settle ends the mappings lg recorded, all of which stay: the spares
// that fitted nowhere are released (counted in dropped), as many pages as
// were created, less those released already, so that reserved memory
// ends where the caller expected (it counted spares as memory the mapping
// would use).
func (h *vmmHeap) settle(lg *mapLog) {
	h.dropSpares(lg.created-min(lg.created, lg.dropped), 0)
}

// undoMaps undoes the mappings lg recorded from index from on, the last
// first: each is unmapped, its handle back to the spares where it came
// from them, else released uncounted (created for this growth or backing,
// it was never reserved memory before) and taken off lg.created. So a
// failed mapping changes neither reserved memory nor the releases
// counted, but for the spares released for new handles (lg.dropped:
// counted, their memory back with the driver). Before, the undo released
// every handle, spares included, with no release counted, and a failed
// backing kept what earlier runs created as spares. A mapping the driver
// will not unmap stays mapped, as strays. It returns the pages of the
// mappings undone, unmapped or strays: below end, both are holes.
func (h *vmmHeap) undoMaps(lg *mapLog, from int) uint64 {
	var undone uint64
	for i := len(lg.maps) - 1; i >= from; i-- {
		e := lg.maps[i]
		mode := releaseAll
		if e.spare {
			mode = keepAll
		}
		undone += e.k
		if h.unmap(e.p, e.k, mode) != nil {
			for q := e.p; q < e.p+e.k; q++ {
				h.stray[q] = true
			}
			h.nStray += e.k
			continue
		}
		if !e.spare {
			lg.created -= e.k
		}
	}
	lg.maps = lg.maps[:from]
	return undone
}

// handlePages is the most pages of a new handle outside a shared growth's
// block (growthRange): maxHandlePages; one where the heap is fine and must
// move memory at the finest grain; releasePages under ReleaseFraction with
// no cap.
func (h *vmmHeap) handlePages() uint64 {
	if h.fine {
		return 1
	}
	if h.releasePages > 0 {
		return h.releasePages
	}
	return maxHandlePages
}

// create makes a physical allocation of k pages (cuMemCreate), noting a
// refusal for want of memory (refused).
func (h *vmmHeap) create(k uint64) (device.MemHandle, error) {
	mh, err := h.dev.MemCreate(k * h.gran)
	h.refused = h.refused || errors.Is(err, device.ErrOutOfMemory)
	return mh, err
}

// maxFit is the most pages a spare mapped from page p on may have in a run
// that ends at page end: inside [lo, hi) as many as are left of it, else
// one.
func maxFit(p, end, lo, hi uint64) uint64 {
	top := min(end, hi)
	if start := max(p, lo); start < top {
		return top - start
	}
	return 1
}

// mappingLen returns the number of pages of the mapping that starts at
// page p (mapped, start[p] == p).
func (h *vmmHeap) mappingLen(p uint64) uint64 {
	q := p + 1
	for q < uint64(len(h.mapped)) && h.mapped[q] && uint64(h.start[q]) == p {
		q++
	}
	return q - p
}

// runs returns the maximal runs of pages in [first, end) whose flag is
// want, as (first page, count) pairs in address order.
func runs(flags []bool, first, end uint64, want bool) [][2]uint64 {
	var out [][2]uint64
	for p := first; p < end; {
		if flags[p] != want {
			p++
			continue
		}
		q := p
		for q < end && flags[q] == want {
			q++
		}
		out = append(out, [2]uint64{p, q - p})
		p = q
	}
	return out
}

// unmapStrays unmaps the stray pages. Those below end stay holes.
func (h *vmmHeap) unmapStrays() error {
	if h.nStray == 0 {
		return nil
	}
	for _, r := range runs(h.stray, 0, uint64(len(h.stray)), true) {
		if err := h.unmapRun(r[0], r[1]); err != nil {
			return err
		}
		for p := r[0]; p < r[0]+r[1]; p++ {
			h.stray[p] = false
		}
		h.nStray -= r[1]
	}
	return nil
}

// unmapRun unmaps pages [first, first+n), all mapped, and releases their
// physical memory. It fails only when the unmap fails, and then changes
// nothing; a page whose release fails is unmapped all the same and its
// handle kept as an orphan.
func (h *vmmHeap) unmapRun(first, n uint64) error {
	return h.unmap(first, n, releaseAll)
}

// unmapMode is what vmmHeap.unmap does with the handles it unmaps.
type unmapMode uint8

const (
	releaseAll unmapMode = iota // release them
	keepMoved                   // keep them as spares, but for small ones under pressure (unmap)
	keepAll                     // keep every one as a spare (undoMaps)
)

// unmap unmaps pages [first, first+n), all mapped and made of whole
// mappings, and releases their physical memory (releaseAll), or keeps
// their handles as spares: with keepAll all of them; with keepMoved all
// of them while the heap is fine, keepSmall or sized by ReleaseFraction
// (releasePages), else those of more than one page (one-page handles are
// then released and counted in dropped, so that memory moved under
// pressure ends up in large handles).
func (h *vmmHeap) unmap(first, n uint64, mode unmapMode) error {
	if n == 0 {
		return nil
	}
	err := h.dev.MemUnmap(uintptr(h.pageAddr(first)), n*h.gran)
	if err != nil {
		return err // still mapped: keep accounting them
	}
	for p := first; p < first+n; {
		k := h.mappingLen(p)
		if p > first {
			h.unmapWork++
		}
		keep := mode == keepAll || mode == keepMoved && (k > 1 || h.fine || h.keepSmall || h.releasePages > 0)
		if keep {
			h.pushSpare(h.handles[p], k)
		} else {
			if mode == keepMoved {
				h.dropped += k * h.gran
			}
			h.releaseHandle(h.handles[p], k)
		}
		for q := p; q < p+k; q++ {
			h.handles[q] = 0
			h.mapped[q] = false
		}
		h.nMapped -= k
		p += k
	}
	if h.note != nil {
		h.note(h.pageAddr(first), n*h.gran, false)
	}
	return nil
}

// releaseHandle releases a physical allocation of pages pages mapped
// nowhere, keeping it as an orphan if the driver refuses.
func (h *vmmHeap) releaseHandle(mh device.MemHandle, pages uint64) {
	if err := h.dev.MemRelease(mh); err != nil {
		h.orphans = append(h.orphans, orphan{mh, pages})
	}
}

// orphan is a physical allocation whose cuMemRelease failed.
type orphan struct {
	h     device.MemHandle
	pages uint64
}

// releaseOrphans releases the orphans again and returns the bytes
// released and the errors of those that stay.
func (h *vmmHeap) releaseOrphans() (uint64, error) {
	var errs []error
	var released uint64
	kept := h.orphans[:0]
	for _, o := range h.orphans {
		if err := h.dev.MemRelease(o.h); err != nil {
			errs = append(errs, err)
			kept = append(kept, o)
			continue
		}
		released += o.pages * h.gran
	}
	h.orphans = kept
	return released, errors.Join(errs...)
}

// orphanPages is the pages held by orphans.
func (h *vmmHeap) orphanPages() uint64 {
	var n uint64
	for _, o := range h.orphans {
		n += o.pages
	}
	return n
}

func (h *vmmHeap) pageAddr(p uint64) uint64 { return h.base + p*h.gran }

// pages returns the pages that block b touches.
func (h *vmmHeap) pages(b tlsf.Block) (first, end uint64) {
	return (b.Addr - h.base) / h.gran, (b.Addr + b.Size - h.base + h.gran - 1) / h.gran
}

func (h *vmmHeap) unbackedTail() uint64 {
	if h.holes == 0 || h.end == h.base {
		return 0
	}
	if last, ok := h.freeTop(); ok {
		return h.unbacked(last)
	}
	return 0
}

func (h *vmmHeap) unbacked(b tlsf.Block) uint64 {
	if h.holes == 0 {
		return 0
	}
	var n uint64
	first, end := h.pages(b)
	for p := first; p < end; p++ {
		if !h.mapped[p] || h.stray[p] {
			n++
		}
	}
	return n * h.gran
}

// back maps the holes under block b, run by run.
func (h *vmmHeap) back(b tlsf.Block) error {
	if h.holes == 0 {
		return nil
	}
	if err := h.unmapStrays(); err != nil {
		return err
	}
	first, end := h.pages(b)
	// Pages wholly inside b may share handles (they are freed
	// together): up to handlePages, and on a shared device up to
	// sharedPages even while fine, as a growth's (growthRange; on the
	// simulated H200 with real time, tlsf-stress multi, K = 2 and 4,
	// seeds 5 to 12: 2.00 and 1.51 driver calls per operation against
	// 2.09 and 1.61 with one-page handles, 5,298 and 7,373 operations
	// per second per process, medians over the processes, against
	// 5,036 and 6,865). Its first and last, which it may share with
	// its neighbours, get one-page handles, so that they can move
	// apart.
	lo := (b.Addr - h.base + h.gran - 1) / h.gran
	hi := (b.Addr + b.Size - h.base) / h.gran
	var lg mapLog
	for _, hole := range runs(h.mapped, first, end, false) {
		p, q := hole[0], hole[0]+hole[1]
		large := h.handlePages()
		if h.fine && h.sharedPages >= 2 {
			large = h.sharedPages
		}
		if _, err := h.mapRun(p, q-p, q-p, lo, hi, large, &lg); err != nil {
			// The runs mapped already go back to holes (undoMaps): a
			// mapping the driver will not unmap stays, as a stray, which
			// is a hole too (check).
			h.holes += h.undoMaps(&lg, 0)
			h.onChange()
			return err
		}
		h.holes -= q - p
		h.onChange()
	}
	h.settle(&lg)
	return nil
}

// release unmaps mapped pages that lie wholly inside free blocks, those of
// the largest free blocks first (they are the least likely to be cut up
// and reused soon) and within a block from its top down, until limit
// bytes are released (one cuMemUnmap per run of adjacent mappings it
// takes under one free block: freeMappings; a failed cuMemUnmap leaves
// that whole run mapped, and a handle whose cuMemRelease fails becomes
// an orphan while release goes on with the next run); without keep it first
// releases the spares. It releases the orphans again first in either
// mode (with keep, one the driver still refuses stays, and the move goes
// on; without, its error is returned). With keep, it keeps the unmapped handles as spares for the next
// mapping instead, as unmap says, and reports the bytes so moved (and
// the orphans released).
func (h *vmmHeap) release(limit uint64, keep bool) (uint64, error) {
	h.extend(h.standby)
	if err := h.unmapStrays(); err != nil {
		return 0, err
	}
	var released uint64
	if !keep {
		var errs []error
		for h.nSpare > 0 && released < limit {
			mh, k, _ := h.popSpare(1, maxHandlePages)
			if err := h.dev.MemRelease(mh); err != nil {
				h.orphans = append(h.orphans, orphan{mh, k})
				errs = append(errs, err)
				continue
			}
			released += k * h.gran
		}
		if err := errors.Join(errs...); err != nil {
			return released, err
		}
	}
	var top uint64 = ^uint64(0)
	if keep && h.end > h.base {
		// Moving pages out of the free top of the heap would be undone at
		// once: a growth is about to cover it.
		if last, ok := h.freeTop(); ok {
			top = last.Addr
		}
	}
	free := h.freeMappings(top)
	// Orphans (handles whose cuMemRelease failed) are released again in
	// either mode: they serve no mapping, and on a full device their
	// memory is what a mapping waits for. Before, a move (keep) left them,
	// and a pool whose only memory was an orphan failed every request
	// until a Trim (fuzz input 95280f31f7969c13). With keep they count as
	// released, not moved (dropped: Pool.noteMoved).
	n, err := h.releaseOrphans()
	released += n
	if keep {
		// A move goes on past an orphan the driver still refuses: the
		// free mappings serve it all the same.
		h.dropped += n
		err = nil
	}
	if err != nil {
		return released, err
	}
	n, err = h.unmapFree(free, released, limit, keep, true)
	return released + n, err
}

// unmapFree unmaps runs of free mappings in order, each from its top
// (cutFromTop), as vmmHeap.unmap does with keep, counting the pages as
// holes, until done plus the bytes it counts reach limit, and returns
// those bytes: every page unmapped, or with net those not left orphaned
// (a failed cuMemRelease: still the pool's, not released).
func (h *vmmHeap) unmapFree(free []mappingRun, done, limit uint64, keep, net bool) (uint64, error) {
	var counted uint64
	for _, r := range free {
		if done+counted >= limit {
			break
		}
		first := h.cutFromTop(r, limit-done-counted)
		n := r.first + r.n - first
		orphans := h.orphanPages()
		mode := releaseAll
		if keep {
			mode = keepMoved
		}
		if err := h.unmap(first, n, mode); err != nil {
			return counted, err
		}
		h.holes += n
		h.onChange()
		if net {
			n -= h.orphanPages() - orphans
		}
		counted += n * h.gran
	}
	return counted, nil
}

// mappingRun is a run of adjacent whole mappings, pages [first,
// first+n), lying under one free block of blockSize bytes.
type mappingRun struct{ first, n, blockSize uint64 }

// freeMappings returns the runs of adjacent whole mappings lying under
// free blocks, but for the free block at address skip, in the order
// release and recycle take them: the largest free blocks first and,
// within one, from its top down (the bottom of a free block is the part
// the next split allocates). A mapping that reaches outside its free
// block (under a live block too) is in no run. In O(pages under free
// blocks).
func (h *vmmHeap) freeMappings(skip uint64) []mappingRun {
	var free []mappingRun
	h.eachFreeMapping(skip, func(s, k, blockSize uint64, adjacent bool) {
		if adjacent {
			free[len(free)-1].n += k
		} else {
			free = append(free, mappingRun{s, k, blockSize})
		}
	})
	slices.SortStableFunc(free, func(a, b mappingRun) int {
		if c := cmp.Compare(b.blockSize, a.blockSize); c != 0 {
			return c
		}
		return cmp.Compare(b.first, a.first)
	})
	return free
}

// eachFreeMapping calls f for each whole mapping, pages [s, s+k), lying
// under a free block (of blockSize bytes) other than the one at address
// skip, in address order; adjacent reports that it follows the last one
// f was given, under the same block. Pool lock held.
func (h *vmmHeap) eachFreeMapping(skip uint64, f func(s, k, blockSize uint64, adjacent bool)) {
	h.x.Walk(func(b tlsf.Block) bool {
		if !b.Free || b.Addr == skip {
			return true
		}
		first := (b.Addr - h.base + h.gran - 1) / h.gran
		end := (b.Addr + b.Size - h.base) / h.gran
		open := false // the last mapping given is under this block, next to this one
		for p := first; p < end; {
			if !h.mapped[p] {
				open = false
				p++
				continue
			}
			s := uint64(h.start[p])
			k := h.mappingLen(s)
			if s < first || s+k > end {
				open = false
			} else {
				f(s, k, b.Size, open)
				open = true
			}
			p = s + k
		}
		return true
	})
}

// cutFromTop returns the first page of the fewest whole mappings at the
// top of r that hold at least bytes bytes (r.first if all of r is
// needed): what one cuMemUnmap takes from r.
func (h *vmmHeap) cutFromTop(r mappingRun, bytes uint64) uint64 {
	p := r.first + r.n
	for p > r.first && (r.first+r.n-p)*h.gran < bytes {
		p = uint64(h.start[p-1])
	}
	return p
}

func (h *vmmHeap) close() error {
	var errs []error
	if err := h.unmapStrays(); err != nil {
		errs = append(errs, err)
	}
	// Strays may lie above end: look at every page.
	for _, r := range runs(h.mapped, 0, uint64(len(h.mapped)), true) {
		if err := h.unmapRun(r[0], r[1]); err != nil {
			errs = append(errs, err)
		}
	}
	for h.nSpare > 0 {
		mh, k, _ := h.popSpare(1, maxHandlePages)
		h.releaseHandle(mh, k)
	}
	if _, err := h.releaseOrphans(); err != nil {
		errs = append(errs, err)
	}
	if err := h.dev.AddressFree(uintptr(h.base), h.vsize); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// check verifies the page accounting: mapped pages counted, holes below
// end counted, standby pages mapped, nothing mapped above them, and every
// allocated block of the index backed.
func (h *vmmHeap) check() error {
	var mapped, holes, strays uint64
	top := (h.end - h.base) / h.gran
	for p := top; p < top+h.standby; p++ {
		if p >= uint64(len(h.mapped)) || !h.mapped[p] || h.stray[p] {
			return fmt.Errorf("pool: standby page %d not mapped", p)
		}
	}
	for p, m := range h.mapped {
		if h.stray[p] {
			strays++
			if !m {
				return fmt.Errorf("pool: stray page %d not mapped", p)
			}
		}
		if m {
			mapped++
			if uint64(p) >= top+h.standby && !h.stray[p] {
				return fmt.Errorf("pool: page %d mapped above the heap's end", p)
			}
		}
		if uint64(p) < top && (!m || h.stray[p]) {
			holes++
		}
	}
	for p, m := range h.mapped {
		if !m {
			continue
		}
		s := uint64(h.start[p])
		if s > uint64(p) || !h.mapped[s] || uint64(h.start[s]) != s || h.handles[s] != h.handles[p] || h.mappingLen(s) > maxHandlePages {
			return fmt.Errorf("pool: page %d: mapping from page %d inconsistent", p, s)
		}
	}
	if mapped != h.nMapped || holes != h.holes || strays != h.nStray {
		return fmt.Errorf("pool: %d pages mapped, %d holes and %d strays by walk, %d, %d and %d counted",
			mapped, holes, strays, h.nMapped, h.holes, h.nStray)
	}
	var bad error
	h.x.Walk(func(b tlsf.Block) bool {
		if !b.Free {
			first, end := h.pages(b)
			for p := first; p < end; p++ {
				if !h.mapped[p] || h.stray[p] {
					bad = fmt.Errorf("pool: allocated block %#x lies on unmapped or stray page %d", b.Addr, p)
					return false
				}
			}
		}
		return true
	})
	return bad
}
