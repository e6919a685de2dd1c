package pool

import (
	"errors"
	"fmt"
	"math/bits"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/tlsf"
)

// Stats is a snapshot of a pool's statistics. Byte counts are bytes;
// "Peak" fields are the highest values since New or the last ResetPeaks.
type Stats struct {
	Backend Backend

	// Allocated is the bytes of live allocations, each counted at its
	// block size (the request rounded up to 256 bytes, or to its size
	// class where the caches serve it or under Options.GoodFit; pitch ×
	// height at its size class for pitch allocations) in every backend,
	// passthrough included, so the figures compare across backends.
	Allocated, AllocatedPeak uint64
	// Allocations is the number of live allocations.
	Allocations, AllocationsPeak int64
	// Active is the bytes of blocks that cannot serve a new request:
	// live blocks at their block size, and blocks freed on a stream
	// awaiting its event. In passthrough mode, Allocated. (The C ABI's
	// tlsf_stats.active is Active + Cached: blocks in the caches serve
	// only requests of their own size class.)
	//
	// With caches on, the peaks of Allocated, Allocations and Active count
	// blocks held by caches as in use: an upper bound, by at most the
	// caches' capacity. They are exact with caches off, and in guard mode
	// (Options.Guard), whose figures leave red zones out: there the peaks
	// of Allocated and Active are taken at each allocation.
	Active, ActivePeak uint64
	// Reserved is the device memory the pool holds: mapped pages (VMM),
	// chunks, or the driver allocations themselves (passthrough: their
	// sizes, pitch × height for a pitch allocation, so that Allocated,
	// which counts block sizes, can exceed it).
	Reserved, ReservedPeak uint64
	// Cached is the bytes of blocks held by per-P caches, counted neither
	// as allocated nor as free; CachedBlocks is their number.
	Cached       uint64
	CachedBlocks int64
	// CachesOn reports whether the per-P caches serve requests: from New
	// with CacheOptions.Eager, never with CacheOptions.Disable, else once
	// goroutines contended for the pool's lock (CacheOptions.Eager says
	// when).
	CachesOn bool
	// Pending is the bytes of blocks freed on a stream and awaiting its
	// event (included in Active); PendingBlocks is their number.
	Pending       uint64
	PendingBlocks int64

	// IndexFree is the free bytes in the index; for a VMM pool it
	// includes address space whose pages were released, and the pages
	// kept mapped on standby since the pool last started over (every
	// block freed: Pool.startOver), which the next growths take back. LargestFree is
	// the largest request in bytes that Alloc serves from the index's free
	// space without growing (tlsf.Index.LargestFit: the largest free
	// block; with Options.GoodFit, tlsf.Index.LargestAlloc: that block
	// rounded down to a size-class boundary, since good fit rounds
	// requests up to one; an Alloc of it may still fail if released pages
	// under it cannot be mapped again within the cap), and Fragmentation
	// is 1 − LargestFree / IndexFree (0 when nothing is free).
	IndexFree     uint64
	LargestFree   uint64
	Fragmentation float64
	FreeBlocks    int
	// TopKept reports whether a VMM pool keeps the free top of its heap
	// for requests no other free block holds: Options.Wilderness, or a
	// growth under severe fragmentation (severeFragmentation, pool.go)
	// that served its request, since New or the heap's last start-over
	// (Pool.startOver: every block freed, no page released). A log event
	// at Info level marks the switch on; the start-over turns it off (its
	// Debug event).
	TopKept bool

	// Allocs and Frees count successful calls since New (cache hits
	// included).
	Allocs, Frees uint64
	// AllocsBySize counts the successful allocations since New by the
	// size of their block (as Allocated counts it):
	// AllocsBySize[k] counts blocks of more than 2^(k-1) and at most 2^k
	// bytes (SizeBucket gives k), so [8] holds 256-byte blocks, [20] those
	// up to 1 MiB. The counts sum to Allocs.
	AllocsBySize [NumSizeBuckets]uint64
	// Grows counts growths of the heap; Releases counts releases that
	// returned memory to the driver, ReleasedBytes the bytes returned.
	Grows, Releases, ReleasedBytes uint64
	// RecycledBytes is the physical memory a VMM pool moved between
	// addresses, kept while unmapped (under ReleaseFraction, or on the
	// out-of-memory path of a capped pool: unmapped under free blocks,
	// mapped where needed), in bytes since New. Memory unmapped to move
	// and released instead (handles of more than a page, or a pool under
	// pressure) counts in Releases and ReleasedBytes; memory kept to move
	// that a later mapping releases instead of mapping it (a spare that
	// fits nowhere in it) counts in both.
	RecycledBytes uint64
	// ScavengedBytes is the device memory the background scavenger
	// returned because the device ran low (FreeFloorFraction) or the pool
	// was idle when another process started or grew (IdleRelease; included in
	// ReleasedBytes), in bytes since New.
	ScavengedBytes uint64
	// OutOfMemory counts requests that failed with ErrOutOfMemory;
	// Retries counts runs of the out-of-memory path (flush, wait,
	// release, search again, grow again), successful or not.
	OutOfMemory, Retries uint64
	// DeviceCalls counts the driver calls the pool made, by kind.
	DeviceCalls device.Counts
	// DeviceCallsByPath counts the same calls by the part of the pool
	// that made them (Path: a request's growth, the out-of-memory path,
	// the scavenger, ...), each by kind; its Total is DeviceCalls.Total().
	DeviceCallsByPath PathCounts
}

// Stats returns a snapshot. It takes the pool's lock and sums the
// per-P caches' counters. Safe for concurrent use, and on a closed pool:
// Close drained the caches and the pending frees first, so Cached and
// Pending are 0 and the index's free figures count their blocks as free;
// Allocated still counts the blocks live at Close that the pool itself
// served (not those the caches handed out); Reserved is 0 unless Close
// returned a device error; DeviceCalls includes Close's own calls.
func (p *Pool) Stats() Stats {
	p.lockAside()
	defer p.unlockAside()
	s := p.statsLocked()
	if p.dbg != nil {
		p.dbg.adjustStats(&s)
	}
	return s
}

func (p *Pool) statsLocked() Stats {
	c := p.c
	s := Stats{
		Backend:        p.backend,
		Reserved:       p.reserved(),
		Pending:        c.pending,
		Grows:          c.grows,
		Releases:       c.releases,
		OutOfMemory:    c.ooms,
		Retries:        c.retries,
		ReservedPeak:   c.reservedPeak,
		ReleasedBytes:  c.releasedBytes,
		RecycledBytes:  c.recycledBytes,
		ScavengedBytes: c.scavenged,
		PendingBlocks:  c.pendingBlocks,
	}
	s.DeviceCalls, s.DeviceCallsByPath = p.dev.snapshot()
	if p.cache != nil {
		p.cache.addStats(&c, &s)
		s.CachesOn = p.cache.engaged()
	}
	s.Allocated, s.AllocatedPeak = c.allocated, c.allocatedPeak
	s.Allocations, s.AllocationsPeak = c.allocations, c.allocationsPeak
	s.Active, s.ActivePeak = c.active, c.activePeak
	s.Allocs, s.Frees = c.allocs, c.frees
	s.AllocsBySize = c.bySize
	if p.pt == nil {
		st := p.x.Stats()
		s.IndexFree, s.LargestFree, s.FreeBlocks = st.Free, p.largestFree(), st.FreeBlocks
		if h := p.vmm; h != nil && h.standby > 0 {
			// Standby pages count as the free top they become.
			s.IndexFree += h.standby * h.gran
			if _, ok := h.freeTop(); !ok {
				s.FreeBlocks++
			}
		}
		s.TopKept = p.x.Wilderness()
		if s.IndexFree > 0 {
			s.Fragmentation = 1 - float64(s.LargestFree)/float64(s.IndexFree)
		}
	}
	return s
}

// Check verifies the pool's invariants and returns the first broken one:
// the index's own (tlsf.Index.Check); every allocated block of the index
// is live, pending or cached in exactly one place; the statistics equal
// what a walk finds; reserved memory covers the index's blocks in use; the
// fast paths' gate matches the pool's state (Pool.gate); in guard mode,
// every live block's red zone. It takes the lock and walks every block
// (in guard mode it also synchronizes the streams of live blocks and
// reads their red zones: cuStreamSynchronize, cuMemcpyDtoH): meant for
// tests. Safe for concurrent use.
//
// Errors:
//   - ErrClosed: the pool is closed.
//   - tlsf.ErrCorrupt: a broken invariant of the pool's bookkeeping or of
//     its index (a bug in the pool, never misuse); the message names it.
//   - ErrCorrupted: guard mode (Options.Guard) found a live block's red
//     zone changed; the message names the block of lowest address and
//     how many more there are.
//   - The device's error where guard mode's synchronization or read of a
//     red zone failed.
func (p *Pool) Check() error {
	p.lockAside()
	defer p.unlockAside()
	if p.closed {
		return ErrClosed
	}
	if err := p.checkPaths(); err != nil {
		return invariantBroken(err)
	}
	if err := p.checkGate(); err != nil {
		return invariantBroken(err)
	}
	if p.dbg != nil {
		if err := p.dbg.guardCheck(); err != nil {
			return err
		}
	}
	if p.pt != nil {
		var sum, rounded uint64
		for _, a := range p.pt.live {
			sum += a.size
			rounded += a.counted
		}
		for _, n := range p.pt.stuck {
			sum += n
		}
		if sum != p.pt.reserved || rounded != p.c.allocated || int64(len(p.pt.live)) != p.c.allocations {
			return invariantBroken(fmt.Errorf("pool: passthrough accounting: live %d bytes (%d rounded) in %d, reserved %d, allocated %d in %d",
				sum, rounded, len(p.pt.live), p.pt.reserved, p.c.allocated, p.c.allocations))
		}
		return nil
	}
	if err := p.x.Check(); err != nil {
		return err
	}
	var live, pending, cached, red uint64
	var nLive, nPending, nCached int64
	var bad error
	p.x.Walk(func(b tlsf.Block) bool {
		if b.Free {
			return true
		}
		st := p.state(b.ID)
		switch st {
		case stateLive:
			live += b.Size
			nLive++
		case statePending:
			pending += b.Size
			nPending++
			red += p.red(b)
		case stateCached:
			cached += b.Size
			nCached++
		default:
			bad = fmt.Errorf("pool: allocated block %#x of %d bytes has no owner (state %d)", b.Addr, b.Size, st)
			return false
		}
		return true
	})
	if bad != nil {
		return invariantBroken(bad)
	}
	if p.dbg != nil && red != p.c.redPending {
		return invariantBroken(fmt.Errorf("pool: pending blocks' red zones %d bytes by walk, %d by counter", red, p.c.redPending))
	}
	if n := p.ss.pendingCount(); int64(n) != nPending {
		return invariantBroken(fmt.Errorf("pool: %d blocks pending in the index, %d in stream sets", nPending, n))
	}
	s := p.statsLocked()
	if p.cache != nil {
		if err := p.cache.check(); err != nil {
			return invariantBroken(err)
		}
	}
	// Blocks handed out by caches are cached in the index's view and live
	// in the caches' counters.
	cacheLive, cacheLiveN := s.Allocated-p.c.allocated, s.Allocations-p.c.allocations
	if s.Allocated != live+cacheLive || s.Allocations != nLive+cacheLiveN || cached != s.Cached+cacheLive {
		return invariantBroken(fmt.Errorf("pool: allocated %d bytes in %d by walk (+%d in %d from caches), %d in %d by counters", live, nLive, cacheLive, cacheLiveN, s.Allocated, s.Allocations))
	}
	if s.Active != live+cacheLive+pending || s.Pending != pending || s.PendingBlocks != nPending {
		return invariantBroken(fmt.Errorf("pool: active %d (pending %d in %d) by walk, %d (%d in %d) by counters",
			live+cacheLive+pending, pending, nPending, s.Active, s.Pending, s.PendingBlocks))
	}
	if st := p.x.Stats(); st.Allocated != live+pending+cached {
		return invariantBroken(fmt.Errorf("pool: index allocated %d bytes, owners hold %d", st.Allocated, live+pending+cached))
	}
	if h := p.vmm; h != nil {
		if err := h.check(); err != nil {
			return invariantBroken(err)
		}
	}
	return nil
}

// invariantBroken marks err, a broken invariant of the pool's bookkeeping
// that Check found, as matching tlsf.ErrCorrupt, the index's sentinel for
// a broken invariant; its message stays err's.
func invariantBroken(err error) error {
	if errors.Is(err, tlsf.ErrCorrupt) {
		return err
	}
	return invariantError{err}
}

// invariantError is invariantBroken's error.
type invariantError struct{ err error }

func (e invariantError) Error() string   { return e.err.Error() }
func (e invariantError) Unwrap() []error { return []error{tlsf.ErrCorrupt, e.err} }

// NumSizeBuckets is the number of power-of-two size buckets of
// Stats.AllocsBySize: one per bit length of a 64-bit size, plus one.
const NumSizeBuckets = 65

// SizeBucket returns the index in Stats.AllocsBySize of a block of size
// bytes: the k for which 2^(k-1) < size ≤ 2^k (0 for size 0 and 1).
func SizeBucket(size uint64) int { return sizeBucket(size) }

func sizeBucket(size uint64) int {
	if size <= 1 {
		return 0
	}
	return bits.Len64(size - 1)
}

// ResetPeaks sets every peak (AllocatedPeak, AllocationsPeak, ActivePeak,
// ReservedPeak) to the current value, so that the peaks of a phase of a
// program (one training step, say) can be read on their own, as
// torch.cuda.reset_peak_memory_stats does. With caches on, the peaks
// count blocks held by caches as in use (see Stats). Safe for
// concurrent use; it takes the pool's lock. Errors: none (on a closed
// pool it does nothing).
func (p *Pool) ResetPeaks() {
	p.lockAside()
	defer p.unlockAside()
	if p.closed {
		return
	}
	p.c.allocatedPeak, p.c.activePeak, p.c.allocationsPeak, p.c.reservedPeak = 0, 0, 0, 0
	p.notePeaks()
	p.noteReserved()
	if d := p.dbg; d != nil {
		active := p.activeNow()
		d.mu.Lock()
		d.userPeak, d.blocksPeak = d.user, d.blocks
		d.activePeak = active - min(active, d.extra+d.inflight+p.c.redPending)
		d.mu.Unlock()
	}
}

// activeNow is Stats.Active, the caches' live blocks summed. Pool lock
// held.
func (p *Pool) activeNow() uint64 {
	return p.c.active + p.cache.sum(func(pc *pcache) uint64 { return pc.liveBytes })
}

// largestFree is the largest request the index serves now without growing
// (Stats.LargestFree): under best fit the largest free block, with
// GoodFit that block rounded down to a size-class boundary, as it is
// where the caches serve a request of its size now (a refill allocates
// the request's class size: cacheSet.refillLocked). Pool lock held.
func (p *Pool) largestFree() uint64 {
	if p.opts.GoodFit {
		return p.largestFreeTop(p.x.LargestAlloc())
	}
	return p.largestRequest(p.largestFreeTop(p.x.LargestFit()))
}

// largestRequest returns the largest request whose block is at most n
// bytes: n, or, where a request of n is rounded up to a size class (good
// fit's, or the caches' where they serve n), the class boundary below n.
// Pool lock held.
func (p *Pool) largestRequest(n uint64) uint64 {
	if n == 0 || p.pt != nil {
		return n
	}
	cl := p.x.Classes()
	if !p.opts.GoodFit {
		c := p.cache
		if c == nil || !c.serves(n, 0) {
			return n
		}
		cl = c.classes
	}
	if class, r := cl.SizeClass(n); r > n && class > 0 {
		return cl.Size(class - 1)
	}
	return n
}

// largestFreeTop is largestFree's figure from the index's, largest, and
// the pages on standby. Pool lock held.
func (p *Pool) largestFreeTop(largest uint64) uint64 {
	h := p.vmm
	if h == nil || h.standby == 0 {
		return largest
	}
	// A request the free top and the standby pages above it hold takes
	// them with no new memory (Pool.takeStandby); good fit rounds it up to
	// a size class, so it may be as large as the class boundary below.
	top := h.standby * h.gran
	if last, ok := h.freeTop(); ok {
		top += last.Size
	}
	if p.opts.GoodFit {
		cl := p.x.Classes()
		if class, r := cl.SizeClass(top); r > top && class > 0 {
			top = cl.Size(class - 1)
		}
	}
	return max(largest, top)
}

// checkPaths: between requests no path is left set (a slow path that
// returned without leave). Pool lock held.
func (p *Pool) checkPaths() error {
	if path := Path(p.dev.path.Load()); path != PathOther {
		return fmt.Errorf("pool: driver calls still count for path %v between requests", path)
	}
	return nil
}
