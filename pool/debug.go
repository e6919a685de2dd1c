package pool

// The debug layer: guard mode (guard.go) and the memory checker's hooks
// (nvtx.go), around the pool's own Alloc and Free.
//
// It exists only when Options.Guard is set or a memory checker is
// attached (compute-sanitizer sets NVTX_INJECTION64_PATH); otherwise
// Pool.dbg is nil, and AllocOn and a caller's free (FreeOn, FreeSizedOn:
// freeOn with outer) each pay one nil test, a branch that always goes the
// same way and that the CPU predicts. Each hook has one call site: the
// first line of AllocOn, freeLayered (where freeOn's first test sends a
// caller's free), and one each in AllocPitch, Stats, Check and Close.
//
// The layer calls the same fast path the public methods run
// (allocUnchecked and freeUnchecked: allocOn and freeOn, through the
// history when it is on), so blocks come from the per-P caches and the
// index as they would without it, and cache hits pass through it too.
//
// Locking: the layer's mutex guards its table of live blocks. The pool's
// lock may be held when it is taken (AllocPitch, Stats, Check, Close), never
// the other way round: alloc and free take it only before or after the
// pool's own calls, not around them. The red zone is filled and read
// under the pool's lock, after a check that the pool is open: a Close in
// between would have unmapped the block (and the driver may have given
// its memory to someone else).

import (
	"errors"
	"fmt"
	"math"
	"sync"

	"github.com/gpumem/tlsf/device"
)

// debugLayer is the pool's guard mode and memory-checker hooks.
type debugLayer struct {
	p     *Pool
	guard uint64            // red-zone bytes; 0: no guard
	fill  device.ByteSetter // the device, for red-zone fills; nil without guard
	watch *memWatch         // nil without a memory checker

	mu   sync.Mutex
	live map[uintptr]debugBlock // by pointer: blocks handed out through the layer
	// freeing holds the blocks a free has taken out of live and not yet
	// finished, each with the number of its free: a second free of one
	// meanwhile is a double free, not a pointer the layer never saw. (The
	// address may be allocated again, and freed, before the first free
	// ends: each free removes only its own entry.)
	freeing map[uintptr]uint64
	frees   uint64 // numbers the frees
	closed  bool   // forget ran (Close): a failed free puts nothing back
	// extra is the bytes the pool's counters hold for red zones of live
	// blocks: the block size of size+guard minus that of size (at most
	// the former: Pool.blockSize), summed.
	extra uint64
	// user is the bytes of live blocks at the block size of their request
	// (for pitch allocations, of pitch × height, as Stats.Allocated
	// counts them); userPeak its peak.
	user, userPeak uint64
	// blocks is the live blocks the layer knows; blocksPeak its peak.
	blocks, blocksPeak int64
	// inflight is the red-zone bytes of blocks the pool allocated for the
	// layer and the layer has not recorded yet (alloc).
	inflight uint64
	// activePeak is the peak of Active without red zones (live blocks'
	// extra, pending blocks' Pool.c.redPending), raised at each
	// allocation through the layer (noteActive): Active rises only there.
	activePeak uint64
	// undone counts the allocations alloc took back (undo), by size
	// bucket in undoneBySize: each was an allocation and a free of the
	// pool's that the caller never saw.
	undone       uint64
	undoneBySize [NumSizeBuckets]uint64
}

// debugBlock is one live block the layer knows.
type debugBlock struct {
	size   uint64 // the request, bytes (pitch × height for a pitch allocation)
	extra  uint64 // its share of debugLayer.extra
	user   uint64 // its share of debugLayer.user
	stream device.Stream
	pitch  bool // from AllocPitch: no red zone
}

// initDebug makes the debug layer if guard mode is on or a memory checker
// watches the process, before the heap takes any memory. Errors:
// ErrBadOptions (Guard on a device without byte fills).
func (p *Pool) initDebug() error {
	d := &debugLayer{p: p, guard: p.opts.Guard, live: map[uintptr]debugBlock{}, freeing: map[uintptr]uint64{}}
	if d.guard > 0 {
		bs, ok := p.dev.Device.(device.ByteSetter)
		if !ok {
			return fmt.Errorf("%w: Guard needs a device with byte fills (device.ByteSetter); %s has none", ErrBadOptions, p.dev.Name())
		}
		d.fill = bs
		// A simulated device without shadow memory reads every byte back
		// as the same word: the red zones would all look overwritten.
		if kc, ok := p.dev.Device.(interface{ KeepsContents() bool }); ok && !kc.KeepsContents() {
			return fmt.Errorf("%w: Guard needs a device that keeps memory contents; %s does not (sim.Config.Shadow)", ErrBadOptions, p.dev.Name())
		}
	}
	// The driver shows each allocation of a passthrough pool to the
	// checker itself.
	if p.opts.Backend != BackendPassthrough && p.opts.Backend != BackendVMM {
		d.watch = openWatch(p.dev.Device)
		p.dev.heaps = d.watch
		if d.watch != nil && p.backend == BackendAuto {
			p.backend = BackendChunks // the checker refuses VMM heaps (nvtx.go)
		}
	}
	if d.guard > 0 || d.watch != nil {
		p.dbg = d
	}
	return nil
}

// allocUnchecked is AllocOn without the debug layer (history kept).
func (p *Pool) allocUnchecked(size uint64, s device.Stream) (uintptr, error) {
	if p.hist != nil {
		return p.allocRecorded(size, s)
	}
	return p.allocOn(size, s)
}

// freeUnchecked is FreeOn without the debug layer (history kept).
func (p *Pool) freeUnchecked(ptr uintptr, s device.Stream) error {
	if p.hist != nil {
		return p.freeRecorded(ptr, s)
	}
	return p.freeOn(ptr, 0, s, false)
}

// alloc is AllocOn through the layer: size+guard bytes from the pool, the
// red zone filled, the block shown to the checker.
func (d *debugLayer) alloc(size uint64, s device.Stream) (uintptr, error) {
	p := d.p
	// Checked here: padding would hide a zero size, and wrap a huge one.
	if size == 0 {
		return 0, ErrInvalidSize
	}
	if size > math.MaxUint64-d.guard {
		return 0, fmt.Errorf("%w: %d bytes", ErrTooLarge, size)
	}
	b := debugBlock{size: size, stream: s}
	b.user = p.blockSize(size, s)
	if d.guard == 0 {
		ptr, err := p.allocUnchecked(size, s)
		if err != nil {
			return 0, err
		}
		if d.watch != nil {
			d.watch.region(ptr, size)
		}
		d.add(ptr, b)
		return ptr, nil
	}
	// size may be cached (its size class) where size+guard is not
	// (256-byte rounding, possibly smaller): the block is the latter.
	total := p.blockSize(size+d.guard, s)
	b.user = min(b.user, total)
	b.extra = total - b.user
	// From the pool's allocation until addLocked the pool counts the red
	// zone and the layer has no record of it: in flight, taken out of
	// Stats meanwhile (an under-count for a moment, never a peak too high).
	d.mu.Lock()
	d.inflight += b.extra
	d.mu.Unlock()
	landed := func() {
		d.mu.Lock()
		d.inflight -= b.extra
		d.mu.Unlock()
	}
	ptr, err := p.allocUnchecked(size+d.guard, s)
	if err != nil {
		landed()
		return 0, err
	}
	if err := d.lockedGuard(func() error {
		if err := d.guardFill(ptr, size, s); err != nil {
			return err
		}
		if d.watch != nil {
			d.watch.region(ptr, size)
		}
		d.addLocked(ptr, b)
		return nil
	}); err != nil {
		landed()
		if !errors.Is(err, ErrClosed) {
			d.undo(ptr, size+d.guard, s)
		}
		return 0, err
	}
	return ptr, nil
}

// addLocked is add in guard mode, under the pool's lock: the block's red
// zone recorded with it in the pool (allocMeta.red, for Pool.pend), and
// the layer's peak of Active without red zones raised.
func (d *debugLayer) addLocked(ptr uintptr, b debugBlock) {
	p := d.p
	if p.pt == nil {
		if blk, err := p.x.Lookup(uint64(ptr)); err == nil {
			p.setRed(blk.ID, b.extra)
		}
	}
	d.mu.Lock()
	d.inflight -= b.extra
	d.mu.Unlock()
	d.add(ptr, b)
	d.noteActive()
}

// noteActive raises activePeak to Active without red zones. Pool lock
// held.
func (d *debugLayer) noteActive() {
	p := d.p
	active := p.activeNow()
	d.mu.Lock()
	d.activePeak = max(d.activePeak, active-min(active, d.extra+d.inflight+p.c.redPending))
	d.mu.Unlock()
}

// blockSize is the size in bytes of the block the pool gives a request of
// size bytes on stream s, aligned to no more than 256 bytes: its size
// class where the caches serve it (the default stream, Cache.MaxSize and
// less) or with GoodFit, else size rounded up to 256 bytes (best fit,
// tlsf.Index.AllocFit). A passthrough pool counts its allocations at the
// size a pooled one would give them.
func (p *Pool) blockSize(size uint64, s device.Stream) uint64 {
	if s == 0 && !p.opts.Cache.Disable && size-1 < p.opts.Cache.MaxSize {
		_, r := p.x.SizeClass(size) // cached blocks of a class are alike
		return r
	}
	if r, err := p.fitSize(size, 0); err == nil {
		return r
	}
	return size
}

// notePitch records a pitch allocation of size bytes (pitch × height) at
// ptr, counted at its block size, as Stats.Allocated counts it: the
// block's own, or for a passthrough pool the block size a pooled one would
// give it. Pool lock held.
func (d *debugLayer) notePitch(ptr uintptr, size uint64) {
	if d.watch != nil {
		d.watch.region(ptr, size)
	}
	p := d.p
	user := p.blockSize(size, 0)
	if p.pt == nil {
		if blk, err := p.x.Lookup(uint64(ptr)); err == nil {
			user = blk.Size
			p.setRed(blk.ID, 0)
		}
	}
	d.add(ptr, debugBlock{size: size, user: user, pitch: true})
	if d.guard > 0 {
		d.noteActive()
	}
}

// names reports whether a block's record names stream s.
func (d *debugLayer) names(s device.Stream) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, b := range d.live {
		if b.stream == s {
			return true
		}
	}
	return false
}

// forgetStream forgets stream s in the blocks' records (ForgetStream):
// a later free or Check must not name s, which the caller is about to
// destroy. The caller synchronized s, so the red zones' fills on it are
// done. A free running meanwhile that fails puts its record back as it
// was, naming s: the caller's race with its own stream. Pool lock held.
func (d *debugLayer) forgetStream(s device.Stream) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for ptr, b := range d.live {
		if b.stream == s {
			b.stream = 0
			d.live[ptr] = b
		}
	}
}

// undo frees the block at ptr, allocated for a request of size bytes on
// stream s, that alloc cannot hand out (the fill of its red zone failed:
// a stream the device refuses), and takes the allocation and the free off
// the counters Stats gives (Allocs, Frees, AllocsBySize), so that the
// failed call changes none of them; the peaks are the layer's own, which
// never counted the block (adjustStats). The free is ordered on s as any
// free is (the block may be one freed on s earlier, which work queued on
// s may still use); where s refuses it too, on the default stream (the
// failed fill queued nothing on the block). Should both fail, the block
// stays allocated in the pool, and counted so. A pool with several
// streams holds the block until s's work completes: on a stream with
// work queued, Active and Pending count it until then.
func (d *debugLayer) undo(ptr uintptr, size uint64, s device.Stream) {
	p := d.p
	r := p.blockSize(size, s)
	if err := p.freeUnchecked(ptr, s); err != nil && (s == 0 || p.freeUnchecked(ptr, 0) != nil) {
		return
	}
	// A pool with several streams holds the block until its stream's
	// event completes: poll at once, so that a stream the device refuses
	// (forgotten, its blocks taken back: streams.go) or one with no work
	// queued gives it back now.
	p.lockAside()
	if !p.closed {
		_ = p.pollPending(false)
	}
	p.unlockAside()
	d.mu.Lock()
	d.undone++
	d.undoneBySize[sizeBucket(r)]++
	d.mu.Unlock()
}

func (d *debugLayer) add(ptr uintptr, b debugBlock) {
	d.mu.Lock()
	if d.closed { // Close ran since the block was filled: it is gone
		d.mu.Unlock()
		return
	}
	d.live[ptr] = b
	d.extra += b.extra
	d.user += b.user
	d.userPeak = max(d.userPeak, d.user)
	d.blocks++
	d.blocksPeak = max(d.blocksPeak, d.blocks)
	d.mu.Unlock()
}

// free is FreeOn through the layer: the red zone verified, the block
// hidden from the checker, then freed by the pool. On any error the block
// is still the caller's, as it was.
func (d *debugLayer) free(ptr uintptr, s device.Stream) error {
	p := d.p
	d.mu.Lock()
	b, ok := d.live[ptr]
	_, busy := d.freeing[ptr]
	var me uint64
	if ok {
		delete(d.live, ptr)
		d.frees++
		me = d.frees
		d.freeing[ptr] = me
	}
	d.mu.Unlock()
	if !ok && busy {
		return fmt.Errorf("%w: %#x, which another goroutine is freeing", ErrDoubleFree, ptr)
	}
	if !ok {
		return p.freeUnchecked(ptr, s) // not ours: the pool says why
	}
	// finish ends the free: the block is the caller's again (restore), or
	// gone.
	finish := func(restore bool) {
		d.mu.Lock()
		if d.freeing[ptr] == me {
			delete(d.freeing, ptr)
		}
		if restore && !d.closed {
			d.live[ptr] = b
		}
		d.mu.Unlock()
	}
	restore := func() { finish(true) }
	if d.guard > 0 && !b.pitch {
		if s != 0 {
			if err := p.dev.unlockedStreamSynchronize(s); err != nil {
				restore()
				return fmt.Errorf("pool: synchronizing stream %#x before a red-zone check: %w", uintptr(s), err)
			}
		}
		// The fill was queued on the stream of the allocation: a free on
		// another (a block used there, or handed over with RecordStream)
		// reads the zone only once that fill has landed, else it read
		// the zone's old bytes as an overrun. A stream the driver no
		// longer knows is skipped, as frees skip it.
		if a := b.stream; a != 0 && a != s {
			if err := p.dev.unlockedStreamSynchronize(a); err != nil && !streamGone(err) {
				restore()
				return fmt.Errorf("pool: synchronizing stream %#x, which filled the red zone, before its check: %w", uintptr(a), err)
			}
		}
		err := d.lockedGuard(func() error {
			err := d.guardVerify(ptr, b)
			if errors.Is(err, ErrCorrupted) {
				// Reported once: the zone is filled again, so that freeing
				// the block again succeeds unless it is overrun again.
				_ = d.guardFill(ptr, b.size, s)
			}
			return err
		})
		if err != nil {
			restore()
			return err
		}
	}
	if d.watch != nil {
		d.watch.unregion(ptr)
	}
	if err := p.freeUnchecked(ptr, s); err != nil {
		if d.watch != nil {
			d.watch.region(ptr, b.size)
		}
		restore()
		return err
	}
	d.mu.Lock()
	if d.freeing[ptr] == me {
		delete(d.freeing, ptr)
	}
	if !d.closed {
		d.extra -= b.extra
		d.user -= b.user
		d.blocks--
	}
	d.mu.Unlock()
	return nil
}

// lockedGuard runs f, a red-zone fill or read, under the pool's lock if
// the pool is open. Errors: ErrClosed, f's.
func (d *debugLayer) lockedGuard(f func() error) error {
	p := d.p
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	return f()
}

// adjustStats takes red zones out of a snapshot: Allocated drops by the
// red-zone bytes of live blocks, Active by those of live and pending
// blocks, Pending by those of pending ones; AllocatedPeak and ActivePeak
// are the layer's own peaks without red zones (userPeak, activePeak), as
// AllocationsPeak is its peak of live blocks; LargestFree drops by the
// red zone a request adds. Every allocation in guard mode goes through
// the layer, so that its peaks are the pool's figures less red zones, and
// never fall. It also takes the allocations undo took back off Allocs,
// Frees and AllocsBySize. Pool lock held.
func (d *debugLayer) adjustStats(s *Stats) {
	d.mu.Lock()
	defer d.mu.Unlock()
	s.Allocs -= min(d.undone, s.Allocs)
	s.Frees -= min(d.undone, s.Frees)
	for i, n := range d.undoneBySize {
		s.AllocsBySize[i] -= min(n, s.AllocsBySize[i])
	}
	if d.guard == 0 {
		return
	}
	if d.blocksPeak < s.AllocationsPeak {
		s.AllocationsPeak = max(d.blocksPeak, s.Allocations)
	}
	// A free in flight may have left the pool's counters already and the
	// layer's not yet: never go below zero.
	s.Allocated -= min(d.extra+d.inflight, s.Allocated)
	red := d.p.c.redPending
	s.Active -= min(d.extra+d.inflight+red, s.Active)
	s.Pending -= min(red, s.Pending)
	s.AllocatedPeak = max(d.userPeak, s.Allocated)
	s.ActivePeak = max(d.activePeak, s.Active)
	// A request of n bytes takes a block for n+guard: the largest the
	// index serves without growing is guard bytes less.
	s.LargestFree -= min(d.guard, s.LargestFree)
}

// lessRed takes red zones out of the out-of-memory message's figures (as
// adjustStats does out of Stats): allocated bytes less the red zones of
// live blocks (a block allocated but not yet recorded by the layer keeps
// its red zone for that moment), and the largest block the pool could
// allocate less the red zone a request adds. Pool lock held.
func (d *debugLayer) lessRed(allocated, largest uint64) (uint64, uint64) {
	d.mu.Lock()
	defer d.mu.Unlock()
	return allocated - min(d.extra, allocated), largest - min(d.guard, largest)
}

// forget drops every block at Close: their memory goes with the heap.
// Pool lock held.
func (d *debugLayer) forget() {
	d.mu.Lock()
	// The counters stay: Stats after Close still counts the blocks live
	// at Close that the pool itself served (Pool.Stats), less their red
	// zones; not those the caches handed out, whose counts go with the
	// caches.
	if p := d.p; p.pt == nil && p.cache != nil {
		for ptr, b := range d.live {
			if blk, err := p.x.Lookup(uint64(ptr)); err == nil && p.state(blk.ID) == stateCached {
				d.extra -= b.extra
				d.user -= b.user
				d.blocks--
			}
		}
	}
	clear(d.live)
	d.closed = true
	d.mu.Unlock()
}
