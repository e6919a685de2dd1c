package pool

// Sharing a GPU: the cap, and the out-of-memory path under contention.
//
// The cap is MaxFraction × total, less what it leaves for the process's
// context (contextShareDivisor; total is the device's total memory as
// cuMemGetInfo reported it at New), fixed for the pool's life: see the
// package doc for why, and for the arithmetic with K processes.
//
// When the index has no block for a request and the pool cannot grow, the
// out-of-memory path used to return every unused page to the driver and
// then map what the request needed: under contention each failure undid
// the pool's own cache of memory, and the next request mapped it again
// (on an H200, about 100 cuMemCreate per successful allocation with two
// processes oversubscribed 1.5×). A block that best fit places on
// released pages the pool cannot back (at the cap, or on a full device)
// is first exchanged for a free block lying wholly on mapped pages, if
// one is among the 32 candidates of step 2 (Pool.searchMapped), with no
// driver call. Where none is, the path runs: it
//
//  1. flushes the per-P caches and waits for pending stream-ordered frees,
//     as before;
//  2. searches the index again (searchRecycling), weighing up to 32 free
//     blocks for the one lying on the fewest released pages
//     (placeMapped); where that block lies partly on released pages, and
//     moving pages is worth it (mayRecycle: below 90% of the cap, or no
//     allocation failed lately), it
//     moves the pages the block lacks from under other free
//     blocks (the largest first, recycle) to the spares, unmapped but
//     kept (cuMemUnmap), and maps them under the block (cuMemMap,
//     cuMemSetAccess; no cuMemRelease and cuMemCreate); under pressure
//     (a failure in the last recyclePressureAllocs) it releases the
//     one-page handles among them instead and maps the block with large
//     handles (Pool.setFine);
//  3. if the index has no block, moves at most what the request needs
//     (releaseFor: its size rounded up to pages, plus one page for a
//     block that straddles) to the spares (for a request within
//     recycleLiveFraction of the cap, its one-page handles too), and
//     grows once more, mapping the spares first; a chunk pool frees
//     wholly free chunks up to that amount instead. It fails if that
//     fails;
//  4. remembers the failure (oomMemo): until the pool next frees a block
//     (under its lock or into a per-P cache) or maps new memory (a
//     growth, or holes backed with memory beyond the spares), a request
//     at least as large fails at once after the growth attempt (which
//     still sees memory other processes gave back), skipping steps 1 to
//     3, at most oomMemoSkips times in a row;
//  5. remembers a full device: after the driver refuses a cuMemCreate,
//     the memory the pool holds is its limit, and holes are backed with
//     its own memory (moved as in step 2), not new memory, unless
//     cuMemGetInfo reports room (fullFor, below).
//
// Unused memory goes back to other processes when they need it through
// FreeFloorFraction, IdleRelease (the background scavenger) or Trim, not on every error.

import (
	"math"

	"github.com/gpumem/tlsf/tlsf"
)

// oomMemoSkips bounds the requests failed from the memo in a row: what
// frees no block does not clear the memo (a stream-ordered free's event
// completing, so that the block may be reused; another process giving
// memory back where the request needs the out-of-memory path's search to
// find it), so every 64th request runs the whole path. 64 makes a run of
// failures cost about 1/64 of a flush and release each.
const oomMemoSkips = 64

// seenFree is the device's free memory in bytes as the current request's
// last growth attempt read it (cuMemGetInfo), so that its out-of-memory
// error can report it without another driver call, and the pool's
// reserved bytes then: what the pool mapped or released since moves the
// figure the error gives (seenFree.now).
type seenFree struct {
	free     uint64
	reserved uint64
	ok       bool
}

// now returns the device's free memory as of the look, less what the
// pool, holding reserved bytes now, mapped since (plus what it
// released): the look's figure with the pool's own changes since, other
// processes' unknown.
func (s seenFree) now(reserved uint64) uint64 {
	if reserved >= s.reserved {
		return s.free - min(s.free, reserved-s.reserved)
	}
	return s.free + (s.reserved - reserved)
}

// oomMemo is the last request the out-of-memory path failed.
type oomMemo struct {
	size   uint64 // bytes; 0: no failure remembered
	frees  uint64 // Pool.freesEver at the failure
	mapped uint64 // Pool.mappedEver at the failure
	skips  int    // requests failed from the memo since
}

// remembered reports whether a request of size bytes is bound to fail as
// the remembered one did, and counts the skip: it is at least as large,
// and since the failure the pool freed no block (freesEver) and mapped no
// new memory. (Memory a growth gained may serve it: a growth after a
// neighbour left may take the whole device, and a request that best fit
// then places on released pages needs the mapped free memory the growth
// left, which only the out-of-memory path's search finds.)
func (p *Pool) remembered(size uint64) bool {
	m := &p.oom
	if m.size == 0 || size < m.size || p.mappedEver() != m.mapped || m.skips >= oomMemoSkips || p.freesEver() != m.frees {
		return false
	}
	m.skips++
	return true
}

// mappedEver is the memory in bytes the pool holds plus all it has
// released (Stats.ReleasedBytes): it grows with every mapping of new
// memory, and stays as it is while pages move to the spares or back.
func (p *Pool) mappedEver() uint64 { return p.reserved() + p.c.releasedBytes }

// rememberOOM records a failed request of size bytes.
func (p *Pool) rememberOOM(size uint64) {
	p.pressure = p.c.allocs + 1
	s, mapped, frees := size, p.mappedEver(), p.freesEver()
	skips := 0
	if p.oom.frees == frees && p.oom.mapped == mapped { // nothing changed since the last failure
		if p.oom.size != 0 {
			s = min(s, p.oom.size)
		}
		skips = p.oom.skips // allocMiss resets it when the whole path runs
	}
	p.oom = oomMemo{size: s, frees: frees, mapped: mapped, skips: skips}
}

// freesEver counts the frees since New: those under the pool's lock and,
// once the caches engaged, those the per-P caches took (each P's count
// read under its cache's lock, as Stats reads it). Frees into a cache
// must clear the memo: a pool whose every block went back to the caches
// failed up to oomMemoSkips requests in a row from it before one ran the
// path that flushes them. O(GOMAXPROCS) with the caches on, on the
// out-of-memory path only. Pool lock held.
func (p *Pool) freesEver() uint64 {
	return p.c.frees + p.cache.sum(func(pc *pcache) uint64 { return pc.frees })
}

// releaseFor makes room for a request of size bytes aligned to align
// after it failed: a VMM pool moves the pages of at most what the request
// needs to its spares; a chunk pool frees wholly free chunks up to that
// amount. It returns the bytes moved or freed.
//
// Under pressure a VMM heap releases the one-page handles it unmaps, so
// that moved memory ends up in large handles (Pool.setFine), except for
// a request within recycleLiveFraction of the cap, which the pool must
// serve: their memory stays spares (vmmHeap.keepSmall) and is mapped
// again as it was. Released, it went to other processes sharing a full
// device before the growth after the move could ask for it again, and
// the request failed within its share. On the simulated H200 with real
// time, tlsf-stress multi, K = 2 and 4, seeds 5 to 12, against releasing
// them in the same run: failures within 90% of the share 2 and 16 (0 and
// 9 still within at return) against 9 and 18 (7 and 16), at 2.13 and
// 1.56 driver calls per operation against 2.06 and 1.58.
// (Keeping them in searchRecycling's move too gave 6.5 and 3.3 calls per
// operation against 2.1 and 1.6: the memory stayed in one-page handles.)
// Spares the growth that follows does not map stay reserved until a later
// mapping takes them or releases them (vmmHeap.mapRun), or Trim.
func (p *Pool) releaseFor(size, align uint64) (uint64, error) {
	if p.heap == nil {
		return 0, nil
	}
	g := p.heap.granularity()
	need := roundUp(size+max(align, indexGranularity)-indexGranularity, g) + g
	if err := p.ss.syncDirty(); err != nil {
		return 0, err
	}
	p.setFine(need)
	h := p.vmm
	if h == nil {
		n, err := p.heap.release(need, false)
		p.noteReleased(n)
		return n, err
	}
	h.keepSmall = p.withinLive(size)
	defer func() { h.keepSmall = false }() // a Device may panic
	n, err := h.release(need, true)
	p.noteMoved(n)
	return n, err
}

// searchRecycling is search for the out-of-memory path: where the block
// found lies partly on released pages (holes) and mapping them would cross
// the cap or the device has too little free memory, it first moves as
// many pages as the holes lack (beyond the spares) from under other free
// blocks to the spares (or releases them: recycle). The block is
// allocated in the index meanwhile, so its own pages are not taken. On
// error the index is unchanged (moved pages stay spares, counted as
// reserved, or were released).
func (p *Pool) searchRecycling(size, align uint64) (tlsf.Block, error) {
	h := p.vmm
	if h == nil {
		return p.search(size, align)
	}
	b, need, err := p.placeFewestHoles(h, size, align)
	if err != nil {
		return b, err
	}
	p.setFine(b.Size)
	if short := need - min(need, h.spare()); short > 0 && p.mayRecycle(b.Size) {
		rerr := p.ss.syncDirty()
		if rerr == nil {
			var n uint64
			n, rerr = h.recycle(short)
			p.noteMoved(n)
		}
		if rerr != nil {
			_, _ = p.x.Free(b.Addr)
			return tlsf.Block{}, rerr
		}
	}
	if need > 0 {
		if err := p.backPlaced(b, size, need); err != nil {
			return tlsf.Block{}, err
		}
	}
	return b, nil
}

// recycle moves the physical pages of about limit bytes lying wholly under
// free blocks out of the way (cuMemUnmap, one call per run of adjacent
// mappings it takes under one free block; the handles become spares, as
// vmmHeap.unmap says), taking whole mappings from the largest free blocks
// first and, within a block, from its top down (a mapping moves whole, so
// the bytes moved may pass limit by less than one mapping). Unlike
// release, it takes pages from the free top of the heap too: the block
// they go to is placed already, no growth follows. It returns the bytes
// moved. The caller has synchronized the streams that freed memory.
//
// Why the largest first: a page moved out of a large free block leaves a
// hole that a later request lands on only when no smaller block fits it
// (good fit takes the smallest suitable list first), and the top of a
// block is the part a split leaves free longest (the index allocates a
// block's bottom). Measured on the simulated H200 (2026-12-01, cap at
// 1.05 and 1.10 × peak live, one cold and ten warm replays, driver calls
// in all): lstm 15,259 and 10,773 calls (smallest free blocks first:
// 19,583 and 14,336), tdnn 68,925 and 45,737 (131,153 and 116,942);
// resnet50 at 1.013, 14,959 (28,867); tlsf-stress multi, 20,000
// operations, 8.2–8.9 calls per operation for K = 2 and 4.2–4.6 for K = 4
// (9.7–10.4 and 5.2–5.9). Smallest feasible caps are unchanged.
func (h *vmmHeap) recycle(limit uint64) (uint64, error) {
	h.extend(h.standby)
	if err := h.unmapStrays(); err != nil {
		return 0, err
	}
	return h.unmapFree(h.freeMappings(^uint64(0)), 0, limit, true, false)
}

// Moving pages near the cap. The out-of-memory path serves a request that
// fits under the cap but not in any mapped free block by moving 2 MiB
// pages from under other free blocks (searchRecycling, releaseFor): a
// cuMemMap a handle, a cuMemUnmap per run of adjacent mappings and a
// cuMemSetAccess per block, the driver's time per mapping. Below
// recycleLiveFraction of the cap (memory in use, the request included)
// it always does. Above it the free memory left is at most a tenth of the
// cap, scattered between live blocks, and whether gathering it pays
// depends on the job:
//
//   - a job whose live memory fits under its cap (a training loop run
//     near its limit) fails no allocation, and each gathering serves a
//     request that would otherwise fail: it must move pages, or the
//     smallest feasible cap rises (refusing every move above 90% raised
//     it from 1.009 to 1.117 × peak live on the lstm trace);
//   - a job that wants more than its cap (processes oversubscribing a
//     GPU) fails allocations anyway, and gathering pages for one request
//     only scatters the next: on the H200, 44–229 driver calls per
//     operation in tlsf-stress multi.
//
// A failed allocation tells the two apart: for recyclePressureAllocs
// allocations (under the lock) after one, the pool does not move pages
// above recycleLiveFraction of its cap, and a request that does not fit
// in mapped free memory fails at once. A job that never fails behaves as
// if the rule did not exist (min caps 1.009, 1.004, 1.005 × peak live on
// the simulated H200). With it and large handles under pressure
// (Pool.setFine), multi made 9.2–13.5 driver calls per operation on the
// H200 (K = 2, 3, 4, 15 s each; 11–38 with one-page handles, 44–229
// gathering always) and 5.7–10.1 on the simulated H200 (20,000
// operations; 47–93 with one-page handles); 7.0–10.3 on the H200 with
// the rules that came after (Pool.setFine).
const (
	recycleLiveFraction = 0.9
	// recyclePressureAllocs: 256 allocations under the pool's lock (the
	// per-P caches' are not counted), a few training steps of the shared
	// traces (lstm makes about 1,600 per replay of 3,278 ops).
	recyclePressureAllocs = 256
)

// mayRecycle reports whether the out-of-memory path may move pages for a
// request of size bytes: the pool has no cap; or the memory in use plus
// size fits under it and either stays within recycleLiveFraction of it
// (of the bytes callers asked for) or no allocation failed in the last
// recyclePressureAllocs: size is at most mostRecycled's figure, which
// the out-of-memory message's largest block uses too.
func (p *Pool) mayRecycle(size uint64) bool {
	most, _ := p.mostRecycled()
	return size <= most
}

// mostRecycled returns the largest block in bytes for which the
// out-of-memory path would move pages (mayRecycle): no bound without
// a cap; else what fits under the cap with the memory in use, and, after
// a failed allocation (recyclePressureAllocs), what stays within
// recycleLiveFraction of it. The second figure is the first without that
// failure's bound (0 where it does not apply). Pool lock held.
func (p *Pool) mostRecycled() (most, unheld uint64) {
	capped, limit, _ := p.cap()
	if !capped {
		return math.MaxUint64, 0
	}
	used := p.used()
	most = limit - min(limit, used)
	if !p.underPressure() {
		return most, 0
	}
	line := uint64(p.liveLine(limit))
	return min(most, line-min(line, used)), most
}

// withinLive reports whether the memory in use plus size bytes stays
// within recycleLiveFraction of the cap, of the bytes callers asked for;
// always, for a pool without a cap.
func (p *Pool) withinLive(size uint64) bool {
	capped, limit, _ := p.cap()
	if !capped {
		return true
	}
	return float64(p.used()+size) <= p.liveLine(limit)
}

// liveLine returns recycleLiveFraction of the cap limit, in bytes of
// blocks as the pool counts them (withinLive).
func (p *Pool) liveLine(limit uint64) float64 {
	// With GoodFit, used counts blocks at their size class, up to
	// 1/2^SLLog2 above the bytes asked for: the fraction is of those, as a
	// caller counts them.
	// (Against rounded bytes, 5–8% of tlsf-stress multi's out-of-memory
	// errors on the simulated H200 came from requests that fitted within
	// 90% of the share as the caller counts it; 0.1–0.3% so.)
	rounding := 1 + 1/float64(uint64(1)<<p.opts.SLLog2)
	if !p.opts.GoodFit {
		rounding = 1 // blocks rounded to 256 bytes only
	}
	return recycleLiveFraction * rounding * float64(limit)
}

// placeCandidates is how many free blocks the out-of-memory path weighs
// for a request (placeMapped): each costs two index operations (O(1), but
// for AllocFit's scan of a long own list where no later list has a block:
// tlsf.Index.AllocFit) and a walk over its pages (about 1 µs), a page moved a cuMemMap and a share of
// a cuMemUnmap and a cuMemSetAccess (tens of µs on an H200). Measured on
// the simulated H200 with tlsf-stress multi's workload (K = 2, 1.5×
// oversubscribed): 1, 8, 32, 128 candidates give 11, 5.6, 4.7, 4.1 driver
// calls per operation; 32 keeps the search within tens of µs.
const placeCandidates = 32

// placeFewestHoles places a block for size bytes aligned to align by the
// pool's placement and, where it lies on released pages, exchanges it for
// the candidate lying on the fewest (placeMapped). It returns the block,
// allocated in the index, and the bytes of released pages under it.
func (p *Pool) placeFewestHoles(h *vmmHeap, size, align uint64) (tlsf.Block, uint64, error) {
	alloc := func() (tlsf.Block, error) { return p.place(size, align) }
	b, err := alloc()
	if err != nil {
		return b, 0, err
	}
	need := h.unbacked(b)
	if need > 0 {
		b, need = p.placeMapped(h, b, need, alloc)
	}
	return b, need, nil
}

// placeMapped looks for a free block that lies on fewer released pages
// than b (need bytes of them): it takes up to placeCandidates blocks from
// the index in the order alloc gives them (the pool's placement: best fit
// in the request's own list, then good fit), keeps the one lacking the
// fewest pages and frees the others (they merge back as they were). The
// index knows nothing of pages; under the cap, every page a block lacks
// is a page moved.
func (p *Pool) placeMapped(h *vmmHeap, b tlsf.Block, need uint64, alloc func() (tlsf.Block, error)) (tlsf.Block, uint64) {
	cands := []tlsf.Block{b}
	for len(cands) < placeCandidates && need > 0 {
		c, err := alloc()
		if err != nil {
			break
		}
		cands = append(cands, c)
		if n := h.unbacked(c); n < need {
			b, need = c, n
		}
	}
	for _, c := range cands {
		if c.Addr != b.Addr {
			_, _ = p.x.Free(c.Addr)
		}
	}
	return b, need
}

// A full device. Below its cap a pool may still find the device full:
// other processes hold the rest (before caps counted the process's
// context, K pools capped at 1/K each could not all reach their caps:
// sim.H200ContextBytes; a cap set in bytes still counts none).
// Mapping the holes under a block then asks the driver for memory it has
// not got, and a cuMemCreate that a neighbour's release lets through one
// moment is refused the next: on the H200, tlsf-stress multi's processes
// made about 16 cuMemCreate and 13 cuMemRelease per block they backed this
// way. So after the driver refuses a cuMemCreate for want of memory
// (vmmHeap.refused), the pool treats the device as full (fullDevice)
// and the memory it had reserved then as a limit, which
// it keeps to as to its cap: it backs holes with its own memory, moved
// from under other free blocks (searchRecycling), and maps new memory
// past the limit only where cuMemGetInfo (one call) reports room for it.
// A request within recycleLiveFraction of the cap, which the pool should
// serve, always looks (Pool.fullFor, and the growth that follows a miss)
// and raises the limit to what it maps; the others, those of a job that
// wants more than its share, look once per fullProbeSkips of them and
// lift the limit when they find room. (A pool without a cap has only the
// first kind: its limit rises with what it maps.) A neighbour's memory
// given back therefore reaches the pool at its next request within 90%
// of its cap, or within 16 of the others.
//
// Measured on the H200 (2026-12-01, tlsf-stress multi --ops 20000, seeds
// 1 to 3, medians per process, against the code without the rule in the
// same run): K = 2, 4.59 driver calls per operation and 2,600 operations
// per second against 10.06 and 1,735; K = 3, 3.37 and 2,026 against 7.58
// and 1,444; K = 4, 4.89 and 1,652 against 7.67 and 1,208; out-of-memory
// errors within 90% of the share 72 of 98,970 against 59 of 98,105. On
// the simulated H200 with its calls taking real time (--sim-real-time),
// K = 2 and 4: 3.0–3.3 calls per operation against 3.7 and 5.6. With
// the limit (the first version of the rule had none, and forgot the full
// device at any look that found room), against that first version in another
// run (seeds 1 and 2): K = 2, 2.61 and 3,083 against 4.60 and 2,696;
// K = 3, 2.00 and 2,495 against 3.29 and 2,191; K = 4, 2.99 and 2,124
// against 4.84 and 1,657; within 90% of the share 35 of 67,770 against
// 56 of 66,134. Simulated, with real time: K = 2 and 4, 2.9 and 2.5
// against 3.2 and 3.5. (Skips counted per request, not per check, the
// limit raised by requests within 90%, and no second look within a
// request came after that run; on the simulated H200 they changed the
// figures by less than 0.15. In a later session's run, the code with them
// made 2.59, 2.16 and 3.21 calls per operation at K = 2, 3, 4, and 1.99,
// 1.66 and 2.52 with one cuMemUnmap per run of mappings instead of per
// mapping (vmmHeap.freeMappings), at the same operations per second.)

// roomToBack reports whether the pool may back need bytes of holes under
// the block for a request of size bytes: within the cap, the spares
// mapping first (they count as reserved already), and not past a full
// device's limit without room (fullFor).
func (p *Pool) roomToBack(size, need uint64) bool {
	capped, limit, _ := p.cap()
	if capped && p.reserved()+need-min(need, p.heap.spare()) > limit {
		return false
	}
	return !p.fullFor(size, need)
}

// fullDevice is what the pool knows of a full device (above).
type fullDevice struct {
	// on: the driver refused a cuMemCreate for want of memory, and no look
	// at the device's free memory since lifted the limit.
	on bool
	// limit is the limit in bytes: the memory the pool had reserved at
	// the refusal, raised by requests within recycleLiveFraction of the
	// cap that found room.
	limit uint64
	// skips counts the requests beyond it still to fail without a look.
	skips int
	// reqs counts the locked allocation requests begun (allocLocked,
	// refillLocked): the current request's identity. req is the request
	// that last decided whether to look (skipLook, looked), skipping
	// whether it then skips.
	reqs, req uint64
	skipping  bool
}

// pastLimit reports whether more bytes of new memory would take reserved
// memory past a full device's limit.
func (p *Pool) pastLimit(more uint64) bool {
	return p.full.on && more > 0 && p.reserved()+more > p.full.limit
}

// fullFor reports whether backing need bytes of holes under the block
// for a request of size bytes would ask a full device for memory it has
// not got: the pool found the device full, the mapping needs memory
// beyond the spares and would take reserved memory past the limit
// (pastLimit), and cuMemGetInfo reports too little free (one driver call)
// or, for a request beyond recycleLiveFraction of the cap, the pool does
// not look at the device for this request (skipLook). Where cuMemGetInfo
// fails, it reports false: the mapping's cuMemCreate decides, and a
// failure there is the driver's own error.
func (p *Pool) fullFor(size, need uint64) bool {
	add := need - min(need, p.heap.spare())
	if !p.pastLimit(add) {
		return false
	}
	within := p.withinLive(size)
	if !within && p.skipLook() {
		return true
	}
	free, _, err := p.dev.MemGetInfo()
	if err != nil {
		return false // the mapping's cuMemCreate decides
	}
	p.seen = seenFree{free: free, reserved: p.reserved(), ok: true} // this request's look, for its error
	return !p.looked(free >= add, add, within)
}

// fullProbeSkips is how many requests beyond recycleLiveFraction of the
// cap fail at a full device's limit without a look at it after a look
// that found it still full. A job that wants more than its share makes
// such requests all the time; one cuMemGetInfo per 16 of them keeps its
// driver calls bounded and still finds memory a neighbour gave back
// within 16 of its requests.
const fullProbeSkips = 16

// fullBeyond reports whether a growth for a request of size bytes that
// needs more bytes of new memory, beyond the spares, fails at a full
// device's limit without a look: the growth would take reserved memory
// past the limit (pastLimit), the request lies beyond
// recycleLiveFraction of the cap (within it the pool always looks), and
// skipLook says so.
func (p *Pool) fullBeyond(size, more uint64) bool {
	return p.pastLimit(more) && !p.withinLive(size) && p.skipLook()
}

// skipLook reports whether the current request (one of those beyond
// recycleLiveFraction of the cap) fails at a full device's limit without
// a look: while fewer than fullProbeSkips such requests did since the
// last look that found the device full. A request decides once (a miss
// checks up to five times: search, growth, the out-of-memory path's
// search, and its search and growth after moving memory) and counts one
// skip; one whose look found no room does not look again (looked).
func (p *Pool) skipLook() bool {
	f := &p.full
	if f.req == f.reqs {
		return f.skipping
	}
	f.req, f.skipping = f.reqs, f.skips > 0
	if f.skipping {
		f.skips--
	}
	return f.skipping
}

// looked records a look at a full device (cuMemGetInfo) for a request
// that needs more bytes of new memory, within recycleLiveFraction of the
// cap or not, and returns room. A request beyond it that finds room lifts
// the limit: the device has memory again for a pool that wants more than
// it holds; one that finds none makes the next fullProbeSkips such
// requests fail without a look. A request within it, or any in a pool
// without a cap, that finds room raises the limit to what it maps: the
// pool serves it when the device can, and stays at its limit for the
// others.
func (p *Pool) looked(room bool, more uint64, within bool) bool {
	f := &p.full
	switch {
	case !f.on || p.reserved()+more <= f.limit:
	case room && within:
		f.limit = p.reserved() + more
	case room:
		f.on = false
	case !within:
		f.skips = fullProbeSkips
		f.req, f.skipping = f.reqs, true // this request looked
	}
	return room
}

// noteRefused marks the device full where the heap's last mapping had a
// cuMemCreate refused for want of memory (vmmHeap.refused), also one of a
// larger handle that a smaller one then replaced: the device had less
// free than the mapping asked for.
func (p *Pool) noteRefused() {
	if h := p.vmm; h != nil && h.refused {
		h.refused = false
		p.full.on, p.full.limit, p.full.skips = true, p.reserved(), 0
	}
}
