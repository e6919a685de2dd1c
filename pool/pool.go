package pool

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"reflect"
	"sync/atomic"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/cuda"
	"github.com/gpumem/tlsf/tlsf"
)

// indexGranularity is the index's minimum block and alignment: 256 bytes,
// what cudaMalloc guarantees.
const indexGranularity = 256

// Block states, kept in each allocated block's tag in the index
// (Pool.state, tlsf.Index.Tag); 0 is a free block, or an allocated one
// the pool gave no state yet.
const (
	stateLive    uint8 = iota + 1 // handed to the caller
	statePending                  // freed on a stream, awaiting its event
	stateCached                   // held by a per-P cache
)

type allocMeta struct {
	owner uint32 // stateCached: the P whose cache holds it
	// red is, in guard mode, the bytes of the block that its red zone
	// takes (debugBlock.extra, a multiple of 256: block sizes are), in
	// units of 256 bytes (up to 1 TiB, above any size class's step), set
	// while it is live (debugLayer.alloc), so that the block counts them
	// pending too (Pool.pend).
	red uint32
}

// Pool is a device-memory allocator for one device: a TLSF index over
// memory taken from the driver in large pieces (see Backend), with
// per-P caches for small blocks. All methods are safe for concurrent use.
type Pool struct {
	mu      biasMutex // the pool's lock (bias.go)
	dev     *counted
	opts    Options
	backend Backend
	owned   bool // Close closes the device too
	hooks   int  // calls of Options.OnOutOfMemory running (runOOMHook); pool lock
	// closedFlag is closed, readable without the lock (Devices.Get).
	closedFlag atomic.Bool

	x    *tlsf.Index
	heap heap
	vmm  *vmmHeap // heap, for a VMM pool; else nil
	pt   *passthrough
	meta []allocMeta // by block ID
	ss   *streamSet

	total uint64 // device memory in bytes, at New
	// othersLow is the least that others (other processes, and this
	// one outside the pool: its context, say) held of the device in bytes
	// at New and at any growth since: total − free − reserved as
	// cuMemGetInfo reported them then (setShared).
	othersLow uint64
	// context is what a MaxFraction cap leaves of the process's share for
	// its own CUDA context, in bytes (fractionCap): the device's memory in
	// use at New, at most total/contextShareDivisor.
	context    uint64
	pitchAlign uint64 // cuMemAllocPitch's pitch unit, probed on first use
	// probe is the pitch probe's allocation (probeBytes bytes) when the
	// driver refused to free it: still the pool's and counted as reserved,
	// freed again at the next pitch allocation and at Close.
	probe      uintptr
	probeBytes uint64
	c          counters
	closed     bool
	lockedFree int // frees under the lock since the last policy check
	// fastMax: requests of 1 to fastMax bytes need no size check beyond
	// the index's (they round up to less than the heap's virtual range);
	// 0 for a passthrough pool and once the pool is closed, so that
	// neither the gate (gate) nor allocLocked need look at pt and closed:
	// every request then takes allocOdd, every free freeRare.
	fastMax uint64
	// The fast paths' gate (gate, updateGate): AllocOn's written-out case
	// serves requests of 1 to allocGate bytes on stream gateStream, and
	// freeOn's the frees on gateStream while freeGate. A size bound (or a
	// flag) and a stream in place of five or six tests, updateGate called
	// wherever an input changes (the stream set's first stream and mode,
	// RecordStream's uses, the VMM heap's released pages, Close's fastMax;
	// New's fastMax precedes any stream, the gate still closed): 2.5% off
	// the instructions of 50 warm replays of lstm (callgrind). Check
	// verifies it: a gate left open would map a block onto a released
	// page.
	allocGate  uint64
	freeGate   bool
	gateStream device.Stream

	cache *cacheSet // nil when caches are off
	// contended counts acquisitions of the lock on the alloc and free
	// paths that found it held (not by lockAside), since the locked
	// operation count (allocs + frees) was contendedSince: the caches
	// engage at contentionEngage within contentionWindow (lockContended).
	// Pool lock.
	contended      int
	contendedSince uint64
	// aside: the lock is held by lockAside (Stats, Check, Size, Trim,
	// Snapshot, ResetPeaks, the scavenger), whose holding it does not
	// count as contention.
	aside atomic.Bool

	dbg  *debugLayer // guard mode and memory-checker hooks; nil when off (debug.go)
	hist *history    // nil unless Options.History > 0 (history.go)
	// layered: dbg or hist is set (New, once), which AllocOn and freeOn
	// test in one compare.
	layered bool
	peers   []int   // devices granted access besides dev (peers.go)
	oom     oomMemo // the last request the out-of-memory path failed (share.go)
	// missStart is reserved memory in bytes when the current request's
	// miss began, moved by what changed while its OnOutOfMemory hook ran
	// (allocMiss).
	missStart uint64
	// pressure is 1 + c.allocs at the last failed allocation, 0: none
	// (mayRecycle, share.go).
	pressure uint64
	seen     seenFree // the device's free memory as this request's growth read it (share.go)
	// asked is the caller's request in bytes while a cache refill
	// allocates its class's size for it (refillLocked), so that the
	// OnOutOfMemory hook and the error name the request; else 0. Reset
	// while the hook runs without the lock (runOOMHook).
	asked uint64
	// pitched: an AllocPitch request is running, whose block has no red
	// zone in guard mode (requested). Reset while the hook runs without
	// the lock (runOOMHook).
	pitched bool
	// lastFree is the device's free memory in bytes after the last
	// growth (as it read it, less what it mapped), which sizes the
	// growths that take standby pages (takeStandby).
	lastFree uint64
	// mayEmpty: the pool's own blocks were all freed while blocks handed
	// out by the caches were live (emptyNo: not so, at New, or the heap
	// started over since). A cache free that leaves its P with none of them
	// takes the lock to see whether the pool can start over (startOver):
	// any P's (emptyAny), or only the blocker's (emptyBlocker, the P
	// startOver's last scan found holding some: pcache.blocker). A hint
	// only: startOver checks everything itself.
	mayEmpty atomic.Uint32
	full     fullDevice // a device found full, and the limit it set (share.go)
	scav     *scavenger // nil where no rule applies (startScavenger)
	idle     idleWatch  // IdleRelease's view of the pool (scavenge.go)
}

// counters are the pool's statistics kept under its lock.
type counters struct {
	allocated, allocatedPeak     uint64
	allocations, allocationsPeak int64
	active, activePeak           uint64
	reservedPeak                 uint64
	pending                      uint64
	pendingBlocks                int64
	// redPending is the red-zone bytes of pending blocks in guard mode
	// (allocMeta.red): in Pending and Active, which Stats takes them out
	// of (debugLayer.adjustStats).
	redPending      uint64
	allocs, frees   uint64
	grows, releases uint64
	releasedBytes   uint64
	recycledBytes   uint64
	ooms, retries   uint64
	bySize          [NumSizeBuckets]uint64 // allocs by sizeBucket
	scavenged       uint64                 // bytes the scavenger returned
}

// New makes a pool on dev. It queries the device's memory
// (cuMemGetInfo), reserves the virtual range of a VMM pool
// (cuMemGetAllocationGranularity, cuMemAddressReserve), grants the
// devices of Options.PeerAccess access (cuDeviceCanAccessPeer, then
// cuCtxEnablePeerAccess or cuMemSetAccess) and, with InitialFraction,
// reserves the initial memory (cuMemCreate, cuMemMap and cuMemSetAccess,
// or cuMemAlloc). A failed New frees the memory and the address range it
// took.
//
// Errors:
//   - ErrBadOptions: an option out of range (Options says which); a nil
//     device; BackendVMM on a device without virtual memory management;
//     Guard on a device without byte fills (device.ByteSetter) or, for a
//     simulated device, without shadow memory; a pooled backend's cap
//     (MaxBytes or MaxFraction's) below the allocation granularity;
//     MaxBytes, or a VMM pool's VirtualSize, below the initial reserve.
//   - ErrNoPeerAccess: a device of Options.PeerAccess cannot access dev
//     (dev is not a device.PeerAccessor, or cuDeviceCanAccessPeer says
//     no); the message names the pair.
//   - ErrOutOfMemory, also wrapping device.ErrOutOfMemory: the device
//     refused the initial reserve, or a VMM pool's virtual range
//     (cuMemAddressReserve), for want of memory.
//   - The device's error (device.Err* sentinels, *device.Error) where a
//     driver call above failed for another reason, such as
//     device.ErrNoDevice for an unknown ordinal in Options.PeerAccess
//     (wrapped with the pair).
func New(dev device.Device, opts Options) (*Pool, error) {
	p, err := newPool(dev, opts)
	if err != nil {
		return nil, err
	}
	// Started once New's calls stopped counting for PathSetup, so that
	// the scavenger's wakes never see (or restore) that path.
	p.startScavenger()
	return p, nil
}

// nilDevice reports whether dev is nil, or a nil pointer in a non-nil
// interface (a *sim.Device variable never set), whose first method call
// would panic.
func nilDevice(dev device.Device) bool {
	if dev == nil {
		return true
	}
	v := reflect.ValueOf(dev)
	return v.Kind() == reflect.Pointer && v.IsNil()
}

// newPool is New but for the scavenger.
func newPool(dev device.Device, opts Options) (*Pool, error) {
	o, err := opts.withDefaults()
	if err != nil {
		return nil, err
	}
	env, err := PassthroughFromEnv()
	if err != nil {
		return nil, err
	}
	if env {
		o.Backend = BackendPassthrough
	}
	if nilDevice(dev) {
		return nil, fmt.Errorf("%w: nil device", ErrBadOptions)
	}
	p := &Pool{dev: &counted{Device: dev}, opts: o, backend: o.Backend}
	p.dev.reservedNow = func() uint64 {
		if p.pt == nil && p.heap == nil {
			return 0 // New, before the heap
		}
		return p.reserved()
	}
	p.dev.switchTo(PathSetup)
	defer p.dev.leave(PathOther)
	p.ss = newStreamSet(p.dev)
	p.ss.onChange = p.updateGate
	p.hist = newHistory(o.History, o.HistoryStacks)
	if err := p.initDebug(); err != nil {
		return nil, err
	}
	p.layered = p.dbg != nil || p.hist != nil
	free, total, err := p.dev.MemGetInfo()
	if err != nil {
		return nil, err
	}
	p.total = total
	p.othersLow = total - min(total, free)
	p.idle.othersLow = p.othersLow
	p.context = min(p.othersLow, total/contextShareDivisor)
	if p.backend == BackendAuto {
		p.backend = BackendChunks
		if dev.VMMSupported() {
			p.backend = BackendVMM
		}
	}
	// Passthrough pools use the index only to size blocks as pooled ones
	// would, so that statistics compare across backends.
	p.x, err = tlsf.New(tlsf.Config{Granularity: indexGranularity, SLLog2: o.SLLog2, Wilderness: o.Wilderness && p.backend == BackendVMM})
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrBadOptions, err)
	}
	if p.backend == BackendPassthrough {
		p.pt = newPassthrough()
		if err := p.setupPeers(o.PeerAccess.Ordinals()); err != nil {
			return nil, err
		}
		return p, nil
	}
	switch p.backend {
	case BackendVMM:
		if !dev.VMMSupported() {
			return nil, fmt.Errorf("%w: BackendVMM on %s, which has no virtual memory management", ErrBadOptions, dev.Name())
		}
		h, err := newVMMHeap(p.dev, p.x, o.VirtualSize, total)
		if err != nil {
			if isOOM(err) {
				return nil, fmt.Errorf("%w: %w", ErrOutOfMemory, err)
			}
			return nil, err
		}
		p.heap, p.vmm = h, h
		h.onChange = p.updateGate
		// Good fit rounds up by less than 2×: half the range never
		// rounds past it.
		p.fastMax = h.vsize / 2
	case BackendChunks:
		p.heap = newChunkHeap(p.dev, p.x)
		p.fastMax = tlsf.MaxSize / 2
	}
	if g := p.heap.granularity(); o.MaxBytes > 0 && o.MaxBytes < g {
		_ = p.heap.close()
		return nil, fmt.Errorf("%w: MaxBytes %d is below the allocation granularity of %d bytes: no allocation could ever succeed", ErrBadOptions, o.MaxBytes, g)
	} else if o.MaxFraction < 1 && p.fractionCap() < g {
		_ = p.heap.close()
		share := p.fractionShare()
		return nil, fmt.Errorf("%w: MaxFraction %v caps the pool at %d bytes (%d of the device's %d, less %d for the process's context), below the allocation granularity of %d bytes: no allocation could ever succeed", ErrBadOptions, o.MaxFraction, p.fractionCap(), share, total, share-p.fractionCap(), g)
	}
	p.watchHeap()
	if err := p.setupPeers(o.PeerAccess.Ordinals()); err != nil {
		_ = p.heap.close()
		return nil, err
	}
	if o.InitialFraction > 0 {
		g := p.heap.granularity()
		initial := uint64(o.InitialFraction*float64(free)) / g * g
		if o.MaxFraction < 1 {
			// InitialFraction ≤ MaxFraction, but the share's cap leaves
			// room for the context (MaxBytes below is an error instead).
			initial = min(initial, p.fractionCap()/g*g)
		}
		if o.MaxBytes > 0 && initial > o.MaxBytes {
			_ = p.heap.close()
			return nil, fmt.Errorf("%w: MaxBytes %d is below the initial reserve of %d bytes", ErrBadOptions, o.MaxBytes, initial)
		}
		if p.vmm != nil && initial > p.vmm.vsize {
			_ = p.heap.close()
			return nil, fmt.Errorf("%w: VirtualSize %d (rounded up to %d bytes) is below the initial reserve of %d bytes (InitialFraction %v of %d free)", ErrBadOptions, o.VirtualSize, p.vmm.vsize, initial, o.InitialFraction, free)
		}
		if initial > 0 {
			p.setFine(initial)
			err := p.heap.grow(initial, initial)
			p.noteMapping()
			if err != nil {
				_ = p.heap.close()
				if isOOM(err) {
					// Wraps both: the pool's sentinel, as every failure
					// for want of memory, and the driver's.
					return nil, fmt.Errorf("%w: initial reserve of %d bytes: %w", ErrOutOfMemory, initial, err)
				}
				return nil, fmt.Errorf("pool: initial reserve of %d bytes: %w", initial, err)
			}
			p.c.grows++
			p.noteReserved()
			p.noteGrow(initial)
		}
	}
	if !o.Cache.Disable {
		p.cache = newCacheSet(p, o.Cache)
		if o.Cache.Eager || !exactClasses(p.x, o.Cache.MaxSize, o.GoodFit) {
			p.cache.engage()
		}
	}
	return p, nil
}

// NewCUDA makes a pool on GPU ordinal (0 for the first) through the CUDA
// driver (cuda.Open); Close also releases the device's context.
// Errors: those of cuda.Open (device.ErrNoDriver where no driver is
// found) and of New.
func NewCUDA(ordinal int, opts Options) (*Pool, error) {
	dev, err := cuda.Open(ordinal)
	if err != nil {
		return nil, err
	}
	p, err := New(dev, opts)
	if err != nil {
		_ = dev.Close()
		return nil, err
	}
	p.owned = true
	return p, nil
}

// Backend returns the backend in use (never BackendAuto).
func (p *Pool) Backend() Backend { return p.backend }

// Device returns the device the pool allocates from.
func (p *Pool) Device() device.Device { return p.dev.Device }

// Alloc allocates size bytes for use on the default stream: AllocOn(size, 0).
func (p *Pool) Alloc(size uint64) (uintptr, error) { return p.AllocOn(size, 0) }

// AllocOn allocates size bytes for use on stream s and returns the device
// pointer, aligned to 256 bytes. A block freed on s may be reused at once;
// a block freed on another stream only after the free's event completed.
// In O(1) from the caches, else in O(tlsf.FitScan) (best fit in the
// request's own list, the whole list only where no later list has a
// block: tlsf.Index.AllocFit; O(1) with Options.GoodFit), except when
// the pool must grow (driver calls) or its index has nothing free (the
// out-of-memory path).
//
// Errors: ErrInvalidSize (size 0), ErrTooLarge (above tlsf.MaxSize, or
// above a VMM pool's virtual range within the device's total memory and
// the cap), ErrOutOfMemory (wrapping device.ErrOutOfMemory above the
// device's total memory, as the driver's own error), ErrClosed; device errors
// other than out-of-memory are returned wrapped. s is not validated: a
// destroyed or never-created stream is undefined behaviour to the driver
// ("Destroyed streams", streams.go).
func (p *Pool) AllocOn(size uint64, s device.Stream) (uintptr, error) {
	if p.layered {
		if p.dbg != nil {
			return p.dbg.alloc(size, s) // guard mode, memory checker (debug.go)
		}
		return p.allocRecorded(size, s) // history.go
	}
	if c := p.cache; c != nil && c.serves(size, uintptr(s)) {
		return p.allocCached(size, s)
	}
	// The common locked case, written out here: a request of a
	// single-stream pool on its stream, placed as place places it (best
	// fit, or good fit with Options.GoodFit), in a heap with no released
	// pages (no hole can lie under the block), that the index serves
	// without growing; the gate (Pool.gate) tells the stream, mode and
	// released pages in a size compare and a stream compare. Everything
	// else goes to lockedSlow, the pool unchanged here, whose
	// allocLocked serves it. Each call saved counts: freeOn's comment
	// gives the figures.
	//
	// The goroutine the lock is biased toward runs it in a
	// section instead (enter: no locked instruction, bias.go), which it
	// leaves for the lock before anything else.
	biased := p.mu.enter()
	if !biased {
		if p.mu.mu.TryLock() { // TryLock, written out (biasMutex.tried)
			p.mu.tried()
		} else {
			p.lockContended() // counts toward engaging the caches
		}
	}
	if size-1 >= p.allocGate || s != p.gateStream {
		p.mu.relock(biased)
		return p.lockedSlow(size, s, false)
	}
	var b tlsf.Block
	var err error
	if p.opts.GoodFit { // place's unaligned cases, inline: calling place costs 2%
		b, err = p.x.Alloc(size)
	} else {
		b, err = p.x.AllocFit(size)
	}
	if err != nil {
		p.mu.relock(biased)
		return p.lockedSlow(size, s, false) // ErrNoSpace: allocLocked's search fails too, and grows
	}
	p.full.reqs++
	// noteAlloc(b, false), written out of inlined parts: no debug layer
	// here, and the call and its tests cost 1.7–1.8% of the instructions
	// of 51 replays of lstm, resnet50 and tdnn on the simulated H200
	// (callgrind, 2026-12-07; testing layered in one compare, here and in
	// freeOn, 0.8% more)
	p.setState(b, stateLive)
	p.countAlloc(b)
	p.c.active += b.Size
	p.notePeaks()
	// Not deferred: nothing above runs a caller's code. Not release:
	// written out, leave inlines (8 instructions fewer per call).
	if biased {
		p.mu.leave()
	} else { // Unlock, written out (biasMutex.tried)
		p.mu.unlocking()
		p.mu.mu.Unlock()
	}
	return uintptr(b.Addr), nil
}

// allocCached serves a request the caches serve (cacheSet.serves): from
// the current P's cache, else by a refill under the pool's lock.
func (p *Pool) allocCached(size uint64, s device.Stream) (uintptr, error) {
	if ptr, ok := p.cache.alloc(size); ok {
		return ptr, nil
	}
	p.mu.Lock()
	return p.lockedSlow(size, s, true)
}

// allocOn is AllocOn without the debug layer and history, and without
// its fast path: allocLocked serves the same requests.
func (p *Pool) allocOn(size uint64, s device.Stream) (uintptr, error) {
	if c := p.cache; c != nil && c.serves(size, uintptr(s)) {
		return p.allocCached(size, s)
	}
	if !p.mu.TryLock() {
		p.lockContended()
	}
	return p.lockedSlow(size, s, false)
}

// lockedSlow is AllocOn's rest, the pool's lock held, which it
// gives back: deferred, because the OnOutOfMemory hook, run from here,
// may panic, and the C ABI recovers panics, after which the pool must not
// stay locked.
func (p *Pool) lockedSlow(size uint64, s device.Stream, cached bool) (uintptr, error) {
	defer p.mu.Unlock()
	if cached {
		return p.cache.refillLocked(size)
	}
	return p.allocLocked(size, 0, s)
}

// allocLocked allocates size bytes aligned to align (0: the index's
// granularity) for stream s. A request of a single-stream pool on its
// stream runs here (the index, and its miss path) when AllocOn's fast
// path did not serve it; everything else goes to allocOdd.
func (p *Pool) allocLocked(size, align uint64, s device.Stream) (uintptr, error) {
	p.full.reqs++
	if st := p.ss.first; size-1 >= p.fastMax || align > indexGranularity || st == nil || st.s != s || p.ss.multi {
		return p.allocOdd(size, align, s)
	}
	b, err := p.search(size, 0)
	if err != nil {
		if b, err = p.allocMiss(size, 0); err != nil {
			return 0, err
		}
	}
	p.noteAlloc(b, false)
	return uintptr(b.Addr), nil
}

// allocOdd is allocLocked's general case.
func (p *Pool) allocOdd(size, align uint64, s device.Stream) (uintptr, error) {
	if p.closed {
		return 0, ErrClosed
	}
	if size == 0 {
		return 0, ErrInvalidSize
	}
	if size > tlsf.MaxSize {
		return 0, fmt.Errorf("%w: %d bytes", ErrTooLarge, size)
	}
	if p.pt != nil {
		return p.ptAlloc(size, s)
	}
	b, reused, err := p.allocBlock(size, align, s)
	if err != nil {
		return 0, err
	}
	p.noteAlloc(b, reused)
	return uintptr(b.Addr), nil
}

// ptAlloc is a passthrough pool's allocation: its driver calls count for
// PathAlloc, even if the out-of-memory hook panics.
func (p *Pool) ptAlloc(size uint64, s device.Stream) (uintptr, error) {
	prev := p.dev.enter(PathAlloc)
	defer p.dev.leave(prev)
	return p.pt.alloc(p, size, s)
}

// state returns the state of the block whose ID is id: 0 for a block
// the index holds free. It is the block's tag in the index
// (tlsf.Index.Tag), on the record's cache line that the block's alloc and
// free touch anyway. Kept in p.meta beside the owner, as before, it took
// 0.6%, 2.9% and 0.4% more instructions and 5%, 15% and 5% more L1 data
// misses over 50 warm replays of lstm, resnet50 and tdnn on the
// simulated H200 (Valgrind's callgrind, 2026-12-07).
func (p *Pool) state(id uint32) uint8 { return uint8(p.x.Tag(id)) }

// setState records the state of allocated block b.
func (p *Pool) setState(b tlsf.Block, state uint8) { p.x.SetTag(b.ID, uint32(state)) }

// setOwner records the P whose cache holds block b (stateCached), or
// centralOwner.
func (p *Pool) setOwner(b tlsf.Block, owner uint32) {
	if int(b.ID) >= len(p.meta) {
		p.meta = append(p.meta, make([]allocMeta, int(p.x.MaxID())-len(p.meta))...)
	}
	p.meta[b.ID].owner = owner
}

// owner returns the P whose cache holds block b (stateCached), or
// centralOwner.
func (p *Pool) owner(b tlsf.Block) uint32 {
	if int(b.ID) >= len(p.meta) {
		return 0
	}
	return p.meta[b.ID].owner
}

// noteAlloc records block b handed to a caller; reused means it was
// pending on the stream and so already counted as active.
// (AllocOn writes out its case, reused false.)
func (p *Pool) noteAlloc(b tlsf.Block, reused bool) {
	p.setState(b, stateLive)
	p.countAlloc(b)
	if reused {
		p.unpend(b)
	} else {
		p.c.active += b.Size
	}
	if p.dbg != nil {
		p.setRed(b.ID, 0) // the layer records its own (debugLayer.addLocked); none left from the ID's last block
	}
	p.notePeaks()
}

// countAlloc counts block b as handed to a caller: allocations made and
// live, bytes allocated, its size bucket. Active and the peaks are the
// caller's (noteAlloc). Pool lock held.
func (p *Pool) countAlloc(b tlsf.Block) {
	c := &p.c
	c.allocs++
	c.bySize[sizeBucket(b.Size)]++
	c.allocated += b.Size
	c.allocations++
}

// pend counts block b, freed on a stream, pending until its event: in
// Active and Pending, its red zone in redPending (guard mode). Pool lock
// held.
func (p *Pool) pend(b tlsf.Block) {
	p.setState(b, statePending)
	p.c.active += b.Size
	p.c.pending += b.Size
	p.c.pendingBlocks++
	if p.dbg != nil {
		p.c.redPending += p.red(b)
	}
}

// unpend takes block b off Pending (not Active): its event completed, or
// its stream reuses it. Pool lock held.
func (p *Pool) unpend(b tlsf.Block) {
	p.c.pending -= b.Size
	p.c.pendingBlocks--
	if p.dbg != nil {
		p.c.redPending -= p.red(b)
		p.setRed(b.ID, 0)
	}
}

// red returns the red-zone bytes recorded for block b (allocMeta.red).
func (p *Pool) red(b tlsf.Block) uint64 {
	if int(b.ID) < len(p.meta) {
		return uint64(p.meta[b.ID].red) * indexGranularity
	}
	return 0
}

// setRed records the red-zone bytes of the allocated block id.
func (p *Pool) setRed(id uint32, red uint64) {
	if int(id) >= len(p.meta) {
		if red == 0 {
			return
		}
		p.meta = append(p.meta, make([]allocMeta, int(p.x.MaxID())-len(p.meta))...)
	}
	p.meta[id].red = uint32(red / indexGranularity)
}

// notePeaks updates the peaks, counting blocks the caches hold as in use.
func (p *Pool) notePeaks() {
	c := &p.c
	var sys uint64
	var sysBlocks int64
	if p.cache != nil {
		sys, sysBlocks = p.cache.sysBytes, p.cache.sysBlocks
	}
	c.allocatedPeak = max(c.allocatedPeak, c.allocated+sys)
	c.activePeak = max(c.activePeak, c.active+sys)
	c.allocationsPeak = max(c.allocationsPeak, c.allocations+sysBlocks)
}

// gate returns what the fast paths' gate should be (Pool.allocGate,
// freeGate, gateStream): open only for a single-stream pool with a
// stream, open and not passthrough (fastMax above 0); for allocations
// only where the VMM heap has no released page below its end (no hole
// can lie under a block the index places), for frees only where no block
// has uses RecordStream recorded. Pool lock held.
func (p *Pool) gate() (alloc uint64, free bool, s device.Stream) {
	st := p.ss.first
	if st == nil || p.ss.multi || p.fastMax == 0 {
		return 0, false, 0
	}
	if p.vmm == nil || p.vmm.holes == 0 {
		alloc = p.fastMax
	}
	return alloc, len(p.ss.uses) == 0, st.s
}

// updateGate sets the fast paths' gate from the pool's state (gate): the
// stream set and the VMM heap call it through their onChange hooks after
// every change of its inputs, Close after its own. Pool lock held.
func (p *Pool) updateGate() { p.allocGate, p.freeGate, p.gateStream = p.gate() }

// checkGate reports a gate that differs from the pool's state. Pool lock
// held.
func (p *Pool) checkGate() error {
	if a, f, s := p.gate(); a != p.allocGate || f != p.freeGate || s != p.gateStream {
		return fmt.Errorf("pool: fast-path gate (%d bytes, frees %v, stream %#x) differs from the pool's state (%d, %v, %#x)",
			p.allocGate, p.freeGate, uintptr(p.gateStream), a, f, uintptr(s))
	}
	return nil
}

// place allocates a block for size bytes aligned to align from the index
// by the pool's placement, with no device memory behind it yet: aligned
// above 256 bytes, tlsf.Index.AllocAligned; else best fit in the
// request's own list (AllocFit), or with GoodFit good fit (Alloc). Every
// search goes through it, the out-of-memory path's included, so that its
// blocks are those fitSize sizes.
func (p *Pool) place(size, align uint64) (tlsf.Block, error) {
	switch {
	case align > indexGranularity:
		return p.x.AllocAligned(size, align)
	case p.opts.GoodFit:
		return p.x.Alloc(size)
	}
	return p.x.AllocFit(size)
}

// fitSize is the size in bytes of the block the index gives a request of
// size bytes aligned to align: the request rounded up to 256 bytes under
// best fit (tlsf.Index.AllocFit), else, with GoodFit or an alignment above
// 256 bytes (tlsf.Index.AllocAligned), its size class. Errors: the
// index's for sizes it refuses (tlsf.Index.RoundUp).
func (p *Pool) fitSize(size, align uint64) (uint64, error) {
	r, err := p.x.RoundUp(size)
	if err == nil && !p.opts.GoodFit && align <= indexGranularity {
		r = roundUp(size, indexGranularity)
	}
	return r, err
}

// allocBlock finds a block for size bytes on stream s: a block pending on
// s of the same block size, the index, or the slow path.
func (p *Pool) allocBlock(size, align uint64, s device.Stream) (tlsf.Block, bool, error) {
	// A VMM pool can never hold more than its virtual range: refuse at
	// once, before the slow path flushes, polls or releases anything. A
	// block above the device's total memory or the cap fails as in every
	// backend, out of memory (hopeless); one within both, above a
	// VirtualSize set smaller, is too large for this pool.
	if h := p.vmm; h != nil {
		if r, _ := p.fitSize(size, align); r > h.vsize {
			p.seen = seenFree{} // as allocMiss: the message reads the device's free memory anew
			if err := p.hopeless(size, align); err != nil {
				p.c.ooms++
				return tlsf.Block{}, false, err
			}
			return tlsf.Block{}, false, fmt.Errorf("%w: %d bytes exceed the virtual range of %d bytes", ErrTooLarge, r, h.vsize)
		}
	}
	if p.ss.joins(s) {
		// A stream joining a pool that has one: registered (the switch to
		// multi-stream mode) once the request succeeded, so that a failed
		// request leaves the pool as it was. It has nothing pending to
		// reuse, and the caller sees the block only after the new stream
		// waits for the frees before it (streamSet.use).
		start, peak, kept := p.reserved(), p.c.reservedPeak, p.x.Wilderness()
		b, err := p.search(size, align)
		if err != nil {
			if b, err = p.allocMiss(size, align); err != nil {
				return b, false, err
			}
		}
		if _, err := p.ss.use(s); err != nil {
			// As allocMiss undoes a failed request's growth: the block back
			// in the index, the memory mapped for it released.
			_, _ = p.x.Free(b.Addr)
			p.x.SetWilderness(kept) // and the growth's switch (settleFragmentation)
			if p.reserved() > start {
				prev := p.dev.enter(PathAlloc)
				if _, rerr := p.releaseUnused(p.reserved() - start); rerr == nil && p.reserved() <= start && p.opts.OnOutOfMemory == nil {
					p.c.reservedPeak = peak
				}
				p.dev.leave(prev)
			}
			return tlsf.Block{}, false, fmt.Errorf("pool: registering stream %#x: %w", uintptr(s), err)
		}
		return b, false, nil
	}
	st, err := p.ss.use(s)
	if err != nil {
		return tlsf.Block{}, false, fmt.Errorf("pool: registering stream %#x: %w", uintptr(s), err)
	}
	if p.ss.multi && align <= indexGranularity {
		r, _ := p.fitSize(size, align)
		if addr, ok := p.ss.reuse(st, r); ok {
			b, _ := p.x.Lookup(addr)
			return b, true, nil
		}
	}
	b, err := p.search(size, align)
	if err == nil {
		return b, false, nil
	}
	b, err = p.allocMiss(size, align)
	return b, false, err
}

// errNoRoom: the heap could not grow within the cap. Internal; the caller
// sees ErrOutOfMemory.
var errNoRoom = errors.New("pool: cap reached")

// search allocates from the index and backs the block with device memory
// (VMM holes), within the cap. Where the block placed lies on released
// pages that cannot be backed (the cap, or a full device), it takes a
// free block that lies on none, if one is among those the out-of-memory
// path would weigh (searchMapped). On error the index is unchanged.
func (p *Pool) search(size, align uint64) (tlsf.Block, error) {
	b, err := p.place(size, align)
	if err != nil {
		return b, err
	}
	if need := p.heap.unbacked(b); need > 0 {
		return p.backSearched(b, size, align, need)
	}
	return b, nil
}

// backSearched is search for a block b placed on released pages, need
// bytes of them; its driver calls count for PathAlloc (unless made on
// another path already).
func (p *Pool) backSearched(b tlsf.Block, size, align, need uint64) (tlsf.Block, error) {
	prev := p.dev.enter(PathAlloc)
	defer p.dev.leave(prev)
	if err := p.makeRoom(need, false); err != nil {
		_, _ = p.x.Free(b.Addr)
		return tlsf.Block{}, err
	}
	p.setFine(b.Size)
	if err := p.backPlaced(b, size, need); err != nil {
		if retryable(err) {
			if m, ok := p.searchMapped(size, align); ok {
				return m, nil
			}
		}
		return tlsf.Block{}, err
	}
	return b, nil
}

// searchMapped looks for a free block for size bytes aligned to align
// that lies wholly on mapped pages, among the placeCandidates blocks the
// pool's placement gives (placeFewestHoles), and allocates it; else the index
// is as it was. No driver call: index operations and a walk over each
// candidate's pages. A request that best fit places on released pages
// while the pool holds enough mapped free memory elsewhere is so served
// without the out-of-memory path (a flush of the caches, a wait for
// pending frees) and without moving pages.
//
// Measured on the simulated H200 (2026-12-02, tlsf-stress multi -g 16,
// 20,000 operations, seeds 5 to 16, medians over the processes, against
// the out-of-memory path serving these requests, in the same run): K = 2,
// 0.574 driver calls per operation against 0.571; K = 4, 0.491 against
// 0.528 (5 of 48 processes above one against 10); whole out-of-memory
// paths run 69k against 107k (K = 2) and 127k against 214k (K = 4);
// failures within 90% of the share 1 and 18 against 6 and 28. Smallest
// feasible caps on the nine traces (replay --min-cap, three runs against
// three): all within 1.006 × peak live; deeplab 1.0046–1.0057 against
// 1.0035, the others within 0.0007 of before (runs differ by up to 0.0005).
func (p *Pool) searchMapped(size, align uint64) (tlsf.Block, bool) {
	h := p.vmm
	if h == nil {
		return tlsf.Block{}, false
	}
	b, need, err := p.placeFewestHoles(h, size, align)
	if err != nil {
		return tlsf.Block{}, false
	}
	if need > 0 {
		_, _ = p.x.Free(b.Addr)
		return tlsf.Block{}, false
	}
	return b, true
}

// backPlaced maps the need bytes of holes under block b, just placed in
// the index for a request of size bytes, where there is room for them
// (roomToBack; else errNoRoom). On error it frees b in the index, which is
// then as it was. Shared by search and searchRecycling.
func (p *Pool) backPlaced(b tlsf.Block, size, need uint64) error {
	if !p.roomToBack(size, need) {
		_, _ = p.x.Free(b.Addr)
		return errNoRoom
	}
	err := p.heap.back(b)
	p.noteMapping()
	if err != nil {
		_, _ = p.x.Free(b.Addr)
		return err
	}
	p.noteReserved()
	return nil
}

// allocMiss runs when the index has no block (the locked path missed):
// reclaim completed stream-ordered frees, grow, and then the
// out-of-memory path (allocMissPath). A request that fails leaves the
// pool no more memory than it held: should a growth made for it stay
// (its search failed after it: a growth on a device too full to back
// what the block lacks, or, with OnOutOfMemory, one of the retry after
// the hook), as much unused memory is released (releaseUnused: it waits
// for the streams that freed memory first, and takes standby pages back
// into the heap, as every release does), as capi/tlsf.h promises of a
// failed call, and the peak of reserved memory is what it was. Where
// OnOutOfMemory is set, what its hook and other goroutines made the pool
// map or release while the hook ran (without the pool's lock) is theirs:
// the baseline moves by it (missStart, retryAfterHook), and the peak is
// left as it is. Pool lock held.
func (p *Pool) allocMiss(size, align uint64) (tlsf.Block, error) {
	p.missStart = p.reserved()
	peak := p.c.reservedPeak
	b, err := p.allocMissPath(size, align)
	if start := p.missStart; err != nil && !p.closed && p.reserved() > start {
		prev := p.dev.enter(PathOutOfMemory)
		defer p.dev.leave(prev)
		if _, rerr := p.releaseUnused(p.reserved() - start); rerr == nil && p.reserved() <= start && p.opts.OnOutOfMemory == nil {
			p.c.reservedPeak = peak
		}
	}
	return b, err
}

// allocMissPath is allocMiss's path.
func (p *Pool) allocMissPath(size, align uint64) (tlsf.Block, error) {
	prev := p.dev.enter(PathAlloc)
	defer p.dev.leave(prev)
	p.seen = seenFree{}
	if _, why := p.hopelessWhy(size, align); why != "" {
		// Served from memory the pool holds, the request is no failure:
		// its error (which logs) only once that failed.
		if b, ok := p.heldServes(size, align); ok {
			return b, nil
		}
		p.c.ooms++
		return tlsf.Block{}, p.hopeless(size, align)
	}
	if p.ss.polls() {
		_ = p.pollPending(false)
		if b, err := p.search(size, align); err == nil {
			return b, nil
		}
	}
	if b, ok := p.growFromStandby(size, align); ok {
		return b, nil
	}
	if p.cache.reclaimOthers() {
		// Blocks other Ps cache and the central lists come back before the
		// heap grows, so that which P a goroutine ran on does not decide
		// reserved memory. With several streams they come back pending on
		// the default stream (giveBack): poll, so that those whose event
		// completed are in the index for the search.
		_ = p.pollPending(false)
		if b, err := p.search(size, align); err == nil {
			return b, nil
		}
	}
	b, err := p.growAndSearch(size, align)
	if err == nil || !retryable(err) {
		return b, p.growError(size, err)
	}
	// Out of memory (share.go): unless a request at least this large just
	// failed and nothing was freed since, flush the caches, wait for
	// pending frees, search again, move what the request needs from under
	// free blocks to the spares, and grow once more.
	p.dev.switchTo(PathOutOfMemory)
	if p.remembered(size) {
		return p.outOfMemory(size, align, err)
	}
	p.c.retries++
	p.oom.skips = 0
	p.flushCaches()
	_ = p.pollPending(true)
	if b, err := p.searchRecycling(size, align); err == nil || !retryable(err) {
		if err == nil {
			p.oom = oomMemo{}
		}
		return b, err
	}
	if !p.mayRecycle(size) {
		return p.outOfMemory(size, align, err)
	}
	if _, rerr := p.releaseFor(size, align); rerr != nil {
		return tlsf.Block{}, fmt.Errorf("pool: releasing unused memory: %w", rerr)
	}
	if b, err := p.search(size, align); err == nil {
		p.oom = oomMemo{}
		return b, nil
	}
	b, err = p.growAndSearch(size, align)
	if err == nil || !retryable(err) {
		if err == nil {
			p.oom = oomMemo{}
		}
		return b, p.growError(size, err)
	}
	return p.outOfMemory(size, align, err)
}

// heldServes serves a request above a lowered cap (SetMaxBytes; hopeless)
// from memory the pool holds, which needs no more: standby pages, whether
// or not the heap started over (startOverIsNoOp), and, where the pool
// holds at least the block's bytes, stream-ordered frees that completed
// and blocks other Ps cache, as allocMissPath takes them before a growth.
// A pool holding less makes no driver call. Pool lock held.
func (p *Pool) heldServes(size, align uint64) (tlsf.Block, bool) {
	if b, ok := p.growFromStandby(size, align); ok {
		return b, true
	}
	if r, err := p.fitSize(size, align); err != nil || r > p.reserved() {
		return tlsf.Block{}, false
	}
	if p.ss.polls() {
		_ = p.pollPending(false)
		if b, err := p.search(size, align); err == nil {
			return b, true
		}
	}
	if p.cache.reclaimOthers() {
		_ = p.pollPending(false)
		if b, err := p.search(size, align); err == nil {
			return b, true
		}
	}
	return tlsf.Block{}, false
}

// outOfMemory is allocMiss's last step, err the growth's failure: the
// OnOutOfMemory hook and its one retry where set, else the failure,
// remembered (share.go).
func (p *Pool) outOfMemory(size, align uint64, err error) (tlsf.Block, error) {
	if p.opts.OnOutOfMemory != nil {
		if b, herr, done := p.retryAfterHook(size, align); done {
			if herr == nil {
				p.oom = oomMemo{}
			}
			return b, herr
		}
	}
	p.c.ooms++
	p.rememberOOM(size)
	return tlsf.Block{}, p.oomError(size, err)
}

// hopeless returns ErrOutOfMemory for a request that no release could
// make room for: its block (fitSize, plus alignment padding) is larger
// than the device's total memory, than MaxBytes, or than MaxFraction's
// cap (fractionCap: the most that cap can ever allow). Such a request
// fails at once: flushing caches and returning memory first would cost
// the pool its warm memory for nothing. No driver call. (Memory the pool
// holds still serves it under a cap lowered below that memory: a free
// block the search found, or standby pages, allocMiss.)
func (p *Pool) hopeless(size, align uint64) error {
	r, why := p.hopelessWhy(size, align)
	switch why {
	case "":
		return nil
	case hopelessDevice:
		// The device has not got it: the driver's error, as growing would
		// have returned.
		return p.oomError(size, fmt.Errorf("a block of %s exceeds the device's total memory; nothing released: %w", sizeString(r), device.ErrOutOfMemory))
	}
	return fmt.Errorf("%w: a block of %s exceeds %s; nothing released", p.oomError(size, nil), sizeString(r), why)
}

// hopelessDevice is hopelessWhy's answer for a block above the device's
// total memory.
const hopelessDevice = "the device's total memory"

// hopelessWhy returns the block a request needs (fitSize, plus alignment
// padding) and what it exceeds, "" where nothing: hopeless's test, without
// its error (whose message may log and read the device's free memory).
func (p *Pool) hopelessWhy(size, align uint64) (uint64, string) {
	r, err := p.fitSize(size, align)
	if err != nil {
		return 0, "" // allocOdd reports sizes the index refuses
	}
	if align > indexGranularity {
		r += align - indexGranularity
	}
	switch {
	case r > p.total:
		return r, hopelessDevice
	case p.opts.MaxBytes > 0 && r > p.opts.MaxBytes:
		return r, "the cap (MaxBytes)"
	case p.opts.MaxFraction < 1 && r > p.fractionCap():
		return r, "the cap (MaxFraction of the device's total, less the process's context)"
	}
	return r, ""
}

// retryable errors are those the out-of-memory path may cure.
func retryable(err error) bool {
	return isOOM(err) || errors.Is(err, errNoRoom) || errors.Is(err, tlsf.ErrNoSpace)
}

// growError wraps a growth error that is not out-of-memory.
func (p *Pool) growError(size uint64, err error) error {
	if err == nil || errors.Is(err, ErrTooLarge) {
		return err
	}
	return fmt.Errorf("pool: growing for %d bytes: %w", size, err)
}

func isOOM(err error) bool { return errors.Is(err, device.ErrOutOfMemory) }

// growAndSearch grows the heap by max(need, GrowFraction × free) within
// the cap and allocates from the index.
func (p *Pool) growAndSearch(size, align uint64) (_ tlsf.Block, err error) {
	room, err := p.roomFor(size, align)
	if err != nil {
		return tlsf.Block{}, err
	}
	need := p.heap.need(room)
	if need == 0 {
		return p.search(size, align)
	}
	// Before standby pages join the heap: they are not yet its memory
	// (noteFragmentation), as they were not a new pool's.
	if n, on := p.noteFragmentation(room, p.heap.unbackedTail()); on {
		defer func() { p.settleFragmentation(n, err == nil) }()
	}
	if h := p.vmm; h != nil && h.standby > 0 {
		if p.takeStandby(need) {
			return p.search(size, align)
		}
		need = p.heap.need(room)
	}
	// The block grown into also covers the free top of the heap, whose
	// pages may have been released: they count against the cap too.
	tail := p.heap.unbackedTail()
	if err := p.makeRoom(need+tail, true); err != nil {
		return tlsf.Block{}, err
	}
	g := p.heap.granularity()
	// Spare physical memory maps first and is reserved already: only what
	// it does not cover adds to reserved, and needs the driver.
	spare := p.heap.spare()
	res := p.reserved() - min(p.reserved(), spare)
	// The cap needs no driver call (share.go): check it first, so that a
	// pool at its cap fails without one.
	capped, limit := p.capFrom(0)
	if capped && res+need+tail > limit {
		return tlsf.Block{}, errNoRoom
	}
	more := need + tail - min(need+tail, spare) // new memory, beyond the spares
	if p.fullBeyond(size, more) {
		return tlsf.Block{}, fmt.Errorf("pool: %s more needed; the device was full at %s reserved, and is not asked again for %d more requests: %w", sizeString(more), sizeString(p.full.limit), p.full.skips, device.ErrOutOfMemory)
	}
	free, _, err := p.dev.MemGetInfo()
	if err != nil {
		return tlsf.Block{}, err
	}
	p.seen = seenFree{free: free, reserved: p.reserved(), ok: true}
	want := roundUp(max(need, uint64(p.opts.GrowFraction*float64(free))), g)
	if more <= free {
		// What the growth maps beyond need leaves the device's memory
		// that the top's released pages (tail) need to be backed: before,
		// a GrowFraction growth could take it, and the request failed
		// with room for all of it.
		want = max(need, min(want, need+(free-more)/g*g))
	}
	if capped {
		want = max(need, min(want, (limit-res-tail)/g*g))
	}
	if line, ok := p.releaseLine(need + tail); ok {
		// ReleaseFraction bounds the growth too, not only what is
		// mapped for the request.
		want = max(need, min(want, (line-min(line, res+tail))/g*g))
	}
	p.setFine(room)
	p.setShared(free)
	if !p.looked(more <= free, more, p.withinLive(size)) {
		// The device has not got it: asking page by page would take every
		// free page from other processes before failing.
		return tlsf.Block{}, fmt.Errorf("pool: %s more needed, %s free: %w", sizeString(more), sizeString(free), device.ErrOutOfMemory)
	}
	before := p.reserved()
	if h := p.vmm; h != nil {
		h.freeHint, h.freeHintOK = free, true
	}
	err = p.heap.grow(need, want)
	p.noteMapping()
	if err != nil {
		return tlsf.Block{}, err
	}
	p.c.grows++
	p.noteReserved()
	grown := p.reserved() - min(before, p.reserved())
	p.lastFree = free - min(free, grown)
	p.noteGrow(grown)
	return p.searchGrown(size, align)
}

// searchGrown is search after a growth for the request. The growth made
// the heap's free top hold it, released pages under the top included
// (growAndSearch's tail: the out-of-memory path's move may take pages
// from under the top). Where best fit places the request elsewhere, on
// released pages it cannot back (a full device), the block lying on the
// fewest released pages among the candidates (placeFewestHoles, up to
// placeCandidates of them: the grown top where it is among them) is
// backed and taken instead, room made first as search makes it
// (makeRoom). Before, that search took only a block lying on none
// (searchMapped), and a request whose grown top kept a released page
// failed with the memory it needed mapped (testdata/top-holes.ops). Only
// a failed search changes: where best fit's block can be backed, it is
// taken, as before.
func (p *Pool) searchGrown(size, align uint64) (tlsf.Block, error) {
	b, err := p.search(size, align)
	h := p.vmm
	if err == nil || !retryable(err) || h == nil {
		return b, err
	}
	c, need, perr := p.placeFewestHoles(h, size, align)
	if perr != nil {
		return tlsf.Block{}, err
	}
	if need > 0 {
		if merr := p.makeRoom(need, false); merr != nil {
			_, _ = p.x.Free(c.Addr)
			if retryable(merr) {
				return tlsf.Block{}, err
			}
			return tlsf.Block{}, merr // a device error, as backSearched returns it
		}
		p.setFine(c.Size)
		if berr := p.backPlaced(c, size, need); berr != nil {
			if retryable(berr) {
				return tlsf.Block{}, err
			}
			return tlsf.Block{}, berr // a device error, as makeRoom's
		}
	}
	return c, nil
}

// roomFor returns the free block size (bytes) a growth must make room for
// to serve a request of size bytes aligned to align: the request's fit
// size, plus the padding any alignment may cost, since an aligned search
// (AllocAligned) takes a free block of that class (else a block that fits
// exactly is never found). It returns fitSize's errors and ErrTooLarge.
func (p *Pool) roomFor(size, align uint64) (uint64, error) {
	r, err := p.fitSize(size, align)
	if err != nil || align <= indexGranularity {
		return r, err
	}
	room, err := p.x.RoundUp(r + align - indexGranularity)
	if err != nil {
		return 0, fmt.Errorf("%w: %d bytes aligned to %d", ErrTooLarge, size, align)
	}
	return room, nil
}

// growFromStandby serves allocMiss's request by growing a VMM heap that
// started over from its standby pages (takeStandby), where those cover
// the growth, before the caches of other Ps are reclaimed: the pages are
// mapped and reserved already, so taking them costs no driver call and
// adds nothing to reserved memory, and the first run made the same growth
// with no cached block back either (and it checks for severe
// fragmentation first, as the first run's growth did: noteFragmentation);
// a growth the standby pages do not cover reclaims them as any other. It
// reports whether it served the request; where it did not, nothing
// changed, or the standby pages joined the heap and the search failed,
// which allocMiss's later search of the grown heap then repeats (not
// reached: with pages on standby the heap has no holes, and the pages
// cover the block). Measured on the simulated device (development VM,
// pinned to one core, 2026-12-03, medians of six alternating runs of
// BenchmarkPoolReplay's minimum per replay): warm replays, each growing
// from standby again after the last one freed everything, took 2% (lstm),
// 4% (resnet50) and 5% (tdnn, resnet50-infer) less time per operation;
// peak reserved of the nine traces of the README stayed as it was at
// GOMAXPROCS 1 and 16. Pool lock held.
func (p *Pool) growFromStandby(size, align uint64) (tlsf.Block, bool) {
	h := p.vmm
	if h == nil || h.standby == 0 {
		return tlsf.Block{}, false
	}
	room, err := p.roomFor(size, align)
	if err != nil {
		return tlsf.Block{}, false
	}
	need := p.heap.need(room)
	if need == 0 || need > h.standby*h.gran {
		return tlsf.Block{}, false
	}
	n, on := p.noteFragmentation(room, p.heap.unbackedTail())
	p.takeStandby(need) // true: the pages cover need
	b, err := p.search(size, align)
	if on {
		p.settleFragmentation(n, err == nil)
	}
	return b, err == nil
}

// takeStandby serves a growth of a VMM heap that needs need bytes of
// pages above its end from the pages on standby since it started over
// (startOver): as much as a growth would map, max(need, GrowFraction ×
// the device's free memory), the free memory being what the last growth
// left plus the standby pages (what it would be had the pool not kept
// them), so that a heap started over fills as a new pool's did. It
// reports whether that covered need; if not, every standby page joins
// the heap and the growth maps the rest. No driver call; reserved memory
// does not change. Pool lock held.
func (p *Pool) takeStandby(need uint64) bool {
	h := p.vmm
	if need > h.standby*h.gran {
		h.extend(h.standby)
		return false
	}
	want := max(need, uint64(p.opts.GrowFraction*float64(p.lastFree+h.standby*h.gran)))
	h.extend(roundUp(want, h.gran) / h.gran)
	return true
}

// The states of Pool.mayEmpty.
const (
	emptyNo      uint32 = iota // no start-over awaits a cache free
	emptyAny                   // a free that empties any P's table looks for one
	emptyBlocker               // only the free that empties the blocker P's table does
)

// startOver: a VMM pool whose every block is free starts over as a new
// pool would, keeping its memory. When the last live block is freed
// (the pool's own, then those the caches handed out), the caches are
// drained into the index and, if no page is released or stray and no
// free awaits a stream, the heap's end drops to its base
// (vmmHeap.startOver): its pages stay mapped, on standby, and the next
// growths take them back bottom-up, sized as a new pool's growths
// (takeStandby), with no driver call; a heap no larger than the next
// growth would take back stays as it is (startOverIsNoOp), since that
// growth would undo the start-over. Without it, the next run of the
// same work starts on one free block as large as the last run's peak,
// which the index keeps whole for requests nothing else holds (the
// highest list), so that requests a new pool would have cut from its
// small free top split free blocks in the middle of the heap instead.
// Measured on the simulated H200 (2026-12-02, peak reserved over peak
// live over a cold and three warm replays, each replay's live blocks
// freed after it; GOMAXPROCS 1): lstm 1.062 → 1.032, bert 1.0056 →
// 1.0036, deeplab 1.045 → 1.040, vit 1.036 → 1.028, the five others
// unchanged: every warm replay as the cold one. A training loop that
// never frees everything (its weights stay live) never starts over and
// sees no change.
//
// The heap then places as a new one in one more way: a top kept since
// severe fragmentation (noteFragmentation) is forgotten, also by a heap
// that stays as it is, and kept again only once the fragmentation
// recurs, which growths from standby pages check as a new pool's growths
// do, standby pages not counted. Before, the top stayed kept and standby
// growths never checked: measured on the simulated H200 (2026-12-06,
// peak reserved over peak live, a cold and the warm replays), caches
// off, resnet50-infer 1.155 against the cold replay's 1.142, now 1.142;
// the eight other traces, and all nine with the caches on, unchanged.
// (Counting standby pages in the fraction made it 1.281 with caches off
// and 1.290 by default: the warm replays then never switched.)
//
// Only the pool's own last free starts the search for a start-over; from
// then on, until the heap started over, the free of the last block a
// cache handed out does too. A pool that has only served blocks from
// caches since New or its last start-over does not start over, whichever
// P frees them.
//
// The cost: a compare per free under the lock; where only blocks the
// caches handed out are live, a check of each P's cache (a spin lock
// each) then, and again, under the pool's lock, when the P found first
// holding some (the blocker) has none left. Pool lock held.
func (p *Pool) startOver() {
	h := p.vmm
	if p.c.allocations != 0 {
		p.mayEmpty.Store(emptyNo)
		return
	}
	if h == nil || p.closed || p.c.pendingBlocks != 0 || h.end == h.base || h.holes != 0 || h.nStray != 0 {
		// No scan now, so no blocker: the one marked may have no block
		// left (this free may be its last, or RecordStream took it), and
		// the next free that empties any P's table must look again.
		p.mayEmpty.CompareAndSwap(emptyBlocker, emptyAny)
		return
	}
	if c := p.cache; c != nil && c.engaged() { // else no block was ever cached
		// emptyAny before the scan, not after it: the Store precedes each
		// P's lockWait in markBlocker, and a cache free decrements
		// liveBlocks under that P's lock, then loads mayEmpty. Either the
		// free holds the lock first, and the scan counts its P without
		// the block, or it takes the lock after the scan of its P
		// released it, and sees emptyAny or (its P the blocker)
		// emptyBlocker: a free of a block the scan counted cannot miss
		// the start-over.
		//
		// Once the scan found a blocker, only the free that empties its
		// P's table looks again (or, if this pool cannot start over then,
		// the next free that empties any P's: the early return above):
		// another P's frees cannot leave the pool empty before that one,
		// and each of them taking the pool's lock
		// and scanning every P made a 4 KiB alloc+free 9× slower at
		// GOMAXPROCS 2 (BenchmarkSmallPairsOneHeld). A P the scan passed
		// may take a block from its stack meanwhile (no pool lock): the
		// scan after the blocker's free sees it, or, if the block was
		// taken after that scan passed its P too, the heap does not start
		// over (the block is allocated in the index), mayEmpty stays at
		// emptyAny, and that block's free looks again.
		p.mayEmpty.Store(emptyAny)
		if c.markBlocker() {
			p.mayEmpty.Store(emptyBlocker)
			return
		}
		if c.drainLocked(true) != nil {
			return // a block could not go back: it stays cached
		}
	}
	if p.startOverIsNoOp() {
		p.mayEmpty.Store(emptyNo)
		p.x.SetWilderness(p.opts.Wilderness) // as the start-over would
		return
	}
	if h.startOver() {
		p.mayEmpty.Store(emptyNo)
		p.x.SetWilderness(p.opts.Wilderness)
		p.logEvent(slog.LevelDebug, "tlsf pool: every block freed; the heap starts over, its pages on standby", slog.Uint64("standby_bytes", h.standby*h.gran))
	}
}

// startOverIsNoOp reports whether starting a VMM heap over would leave it
// as it is: its every byte is free, no page is on standby, and the heap
// is no larger than what the next growth takes back from standby for any
// request (takeStandby's GrowFraction × (lastFree + the standby pages),
// lastFree being the device's free memory the last growth left, which
// only a growth changes), so that the next allocation would extend it
// back whole, one free block again, placed as before (a request above a
// lowered cap too: allocMiss serves it from standby pages that hold it).
// The pool then skips the start-over and its undoing:
// a pool whose only block is allocated and freed in turn (nothing else
// live, a block the caches do not serve) paid both at each pair,
// RemoveRegion and AddRegion under the lock. Pool lock held.
func (p *Pool) startOverIsNoOp() bool {
	h := p.vmm
	if h.standby != 0 || h.x.FreeBytes() != h.end-h.base {
		return false
	}
	// takeStandby extends by roundUp(want, gran) bytes; the heap is whole
	// pages, so that covers it where want > heap − gran (no division).
	heap := h.end - h.base
	want := uint64(p.opts.GrowFraction * float64(p.lastFree+heap))
	return want+h.gran > heap
}

// severeFragmentation: a VMM heap that must grow for a request although
// its mapped free memory outside its free top is enough for the request
// (in pieces) and at least this fraction of its reserved memory (spares
// and orphans included, standby pages not) is fragmented badly, and keeps
// its top for requests no other block holds until the heap starts over
// (tlsf.Index.SetWilderness, Pool.startOver; Options.Wilderness does so
// always). The check runs before the cap's; a growth that then fails
// switches it off again (settleFragmentation).
//
// Why a switch, and why a quarter: neither placement is better
// everywhere. Best fit taking a tight top did better on the training
// traces (lstm 1.062 × peak live against 1.128 with the top kept), while
// on ResNet-50 inference at batch sizes 1 to 256 (bench/traces) small
// requests that split the top left the next large one neither a hole nor
// a top to grow from: 1.290 against 1.151. Its heap grew once with 35% of
// its memory free outside the top, in pieces that would have held the
// request; no growth of the eight other traces had pieces that would have
// held its request beyond 19% of the heap (lstm grew with up to 48% free
// outside the top, in pieces smaller than the requests). Measured on the
// simulated H200 (2026-12-02, a cold and ten warm replays), the switch at
// a sixth to three tenths of reserved memory left every other trace's
// peak and smallest feasible cap as without it (within the run-to-run
// spread of the per-P caches) and took inference to 1.151 (expandable
// segments: 1.148); above a third, inference stays at 1.290. Switching at
// the first growth with room in pieces, whatever the fraction, took
// resnet50 to 1.022 and lstm to 1.108. Under ReleaseFraction the switch
// moved inference from 1.035 to 1.049 at f = 0.05, within its bound, at
// half the warm driver time, and from 1.026 to 1.019 at 0.03.
const severeFragmentation = 0.25

// noteFragmentation, before a VMM heap grows for a request needing room
// bytes (with new pages or standby pages: growAndSearch,
// growFromStandby), turns the index's wilderness list on where the heap
// is fragmented badly (severeFragmentation), until the heap starts over
// (startOver); tail is the released bytes under the heap's free top
// (vmmHeap.unbackedTail). Standby pages are reserved but not yet the
// heap's, as they were not a new pool's: they do not count in the
// fraction. It reports whether it turned the list on, and what it saw,
// for settleFragmentation once the growth is done. In O(1). Pool lock
// held.
func (p *Pool) noteFragmentation(room, tail uint64) (fragmentation, bool) {
	h := p.vmm
	if h == nil || p.x.Wilderness() {
		return fragmentation{}, false
	}
	var top uint64
	if last, ok := h.freeTop(); ok {
		top = last.Size
	}
	// Released pages (holes) are free address space, not memory: those
	// outside the top are subtracted here, those under it with the top.
	holes := h.holes*h.gran - min(h.holes*h.gran, tail)
	all := p.x.FreeBytes()
	free := all - min(all, top+holes)
	inUse := p.reserved() - min(p.reserved(), h.standby*h.gran)
	if free < room || float64(free) < severeFragmentation*float64(inUse) {
		return fragmentation{}, false
	}
	p.x.SetWilderness(true)
	return fragmentation{free: free, inUse: inUse, standby: h.standby * h.gran, room: room}, true
}

// fragmentation is what noteFragmentation saw where it turned the
// wilderness list on, in bytes: the heap's free memory outside its free
// top, its memory in use, its standby pages and the request's room.
type fragmentation struct{ free, inUse, standby, room uint64 }

// settleFragmentation keeps the wilderness list noteFragmentation turned
// on where the growth after it served its request, and logs the switch;
// where the request failed, it turns the list off again: a failed
// request leaves the statistics as they were (Stats.TopKept; errors.go),
// and the next growth looks again. Pool lock held.
func (p *Pool) settleFragmentation(n fragmentation, served bool) {
	if !served {
		p.x.SetWilderness(false)
		return
	}
	p.logEvent(slog.LevelInfo, "tlsf pool: fragmentation is severe, the free top of the heap is kept for requests nothing else holds until every block is freed",
		slog.Uint64("free_outside_top_bytes", n.free), slog.Uint64("heap_bytes", n.inUse), slog.Uint64("standby_bytes", n.standby), slog.Uint64("request_bytes", n.room))
}

// setFine tells a VMM heap which handles to map next (vmm.go), k being the
// bytes the request at hand adds to the memory in use (its block, the
// growth's room, the bytes to move; New's initial reserve): under
// ReleaseFraction f with no cap, handles of at most f/2 of the peak of
// memory in use, k included (vmmHeap.releasePages: releaseHandleDivisor);
// one-page handles in a capped pool (MaxBytes, or MaxFraction below 1;
// with ReleaseFraction too, then even under pressure), whose memory must
// be able to move at the finest granularity to fit under its cap (where
// the device is shared, or a MaxFraction of one half or less declares it
// so, setShared lets its growths map larger handles inside a block); but not
// while a capped pool without ReleaseFraction is under pressure (an
// allocation failed in its last recyclePressureAllocs), when it maps large
// handles and releases the one-page handles it moves instead of keeping
// them (except those the out-of-memory path's last move takes for a
// request within 90% of the cap: Pool.releaseFor).
//
// One-page handles from the start: measured on the shared traces
// (simulated H200, smallest cap found by bisection to 2 MiB, over peak
// live), lstm 1.009, resnet50 1.003, tdnn 1.003; mapping them only within
// 1/32 or 1/4 of the cap, 1.062, 1.017, 1.061, since the handles mapped
// before the pool came near its cap cannot be released while any part of
// them is in use; handles of even two pages, 1.142, 1.021, 1.185.
//
// Large handles under pressure: a job that wants more than its cap moves
// memory on every few requests (tlsf-stress multi: about 94 MiB a
// request, blocks of 1/4096 to 1/16 of its share), and a move costs a
// cuMemMap per handle: 47 driver calls per operation with one-page
// handles. With large handles, 9.6–10.1, 6.9–7.3, 5.7–6.4 for K = 2, 3, 4
// processes over 20,000 operations on the simulated H200 (3.5–4.3 over
// 80,000 for K = 2: much of the rest is the one-page handles mapped before
// the first failure, released once); on the H200, 9.2–13.5 (15 s
// each; 7.4–7.8 over 60 s for K = 2). With the rules that came after
// (recycle's order, handles sized to free memory, large handles kept as
// spares: share.go, vmm.go), 7.0–10.3 on the H200 at 990–2,000
// operations per second per process, and 7.9–8.0 (K = 2) and 4.1–4.3
// (K = 4) on the simulated H200. The price: a large handle moves only
// when no block uses any of it, so such a job may fail a request that a
// pool of one-page handles would have served (in the sharing tests, 1 of 11,969
// failed requests came while the job's live memory was within 90% of its
// share; none in a job that fails no allocation).
func (p *Pool) setFine(k uint64) {
	h := p.vmm
	if h == nil {
		return
	}
	capped, _ := p.capFrom(0)
	f := p.opts.ReleaseFraction
	h.fine = f > 0 && capped || capped && !p.underPressure()
	h.releasePages = 0
	if f > 0 && !capped {
		peak := max(p.c.activePeak, p.used()+k)
		h.releasePages = max(1, min(maxHandlePages, uint64(f/releaseHandleDivisor*float64(peak))/h.gran)>>min(h.releaseShift, 63))
	}
}

// releaseHandleDivisor: under ReleaseFraction f (no cap), new handles hold
// at most f/releaseHandleDivisor of the peak of memory in use, halved for
// each move that could not keep reserved memory within (1 + f) × that
// peak (vmmHeap.releaseShift): a handle moves only when no live block
// touches it, and large ones partly under live blocks pin memory the line
// counts on. So memory moves at a grain below the excess f allows where
// it can, and a growth costs a few handles rather than one per page.
//
// Measured on the simulated H200 (2026-12-02, peak reserved over peak live
// after a cold and ten warm replays; the modelled driver time per
// operation of the cold replay · of a warm one), f = 0.05 · 0.03: lstm
// 1.050 (4.9 · 1.1 µs) · 1.030 (7.8 · 1.9 µs), tdnn 1.039 (7.8 · 4.7 µs) ·
// 1.030 (11.8 · 11.0 µs), ResNet-50 inference (bench/traces) 1.035 (18.2 ·
// 8.6 µs) · 1.026 (15.7 · 7.4 µs) (1.049 · 1.019 at 5.0 and 4.8 µs warm
// since the switch on severe fragmentation); with one-page handles
// (before): 1.050 (54 · 2.4 µs) · 1.030 (58 · 7.3 µs), 1.049 (61 · 34 µs)
// · 1.029 (61 · 33 µs), 1.035 (21 · 9.0 µs) · 1.026 (22 · 9.5 µs). Peak
// reserved over the peak in use, f = 0.01 and 0.05, with and without
// GoodFit, the shared traces and bench/traces (two replays): within 1 + f
// in 35 of 36 cases (MobileNetV3 with GoodFit at 0.01: 1.015; before: vit
// with GoodFit at 0.01, 1.011); without the halving, in 27, the worst 1.12
// at f = 0.05 (vit, GoodFit); with handles of f/32, in all 36, at three to
// eight times these driver times.
const releaseHandleDivisor = 2

// sharedFraction: other processes holding at least this fraction of the
// device's total memory make it shared (Pool.setShared). 1/16 is 8.9 GiB
// on an H200: more than the contexts of 16 processes hold (526 MiB each,
// sim.H200ContextBytes), far less than one other training job.
const sharedFraction = 1.0 / 16

// sharedGrowthFraction and sharedGrowthMin: other processes holding more
// than they held at New, or at any growth since (othersLow), by at least
// this fraction of the device's total memory and at least sharedGrowthMin
// bytes also make it shared (Pool.setShared). Jobs started together each
// see the others hold little at first: with sharedFraction alone, each
// mapped its first sixteenth or more of the device (5,600 pages of 2 MiB
// per process in tlsf-stress multi, K = 2, on the simulated H200) in
// one-page handles, and released them one by one as they moved, a third
// of its driver calls. 1/128 is 1.1 GiB on an H200, two idle contexts
// of other processes (526 MiB each there, sim.H200ContextBytes); on a
// smaller GPU, sharedGrowthMin keeps a context or a library's workspace
// that appears after New from making a pool alone on it shared (on a
// 16 GiB GPU it equals sharedFraction). A pool that counts the device as
// shared wrongly maps larger handles and may need a slightly larger cap.
// On the H200 (tlsf-stress multi, K = 2, seeds 5 and 6) a minimum of 2
// GiB, which delays the switch, made 1.17 calls per operation against
// 0.88 for seeds 1 to 4 with 1/128 alone (the code before: 1.80 and
// 1.62).
const (
	sharedGrowthFraction = 1.0 / 128
	sharedGrowthMin      = 1 << 30
)

// sharedHandleDivisor bounds those handles to 1/1024 of the cap (up to
// maxHandlePages, 128 MiB, from a cap of 128 GiB): memory in handles
// partly in use cannot move, and small handles keep it a small part of
// what a pool within 90% of its cap has free. Caps below 8 GiB get
// handles of up to 8 MiB or a 256th of the cap, whichever is smaller, as
// all caps did before (below 1 GiB, one page).
//
// Measured on the H200 (2026-12-02, tlsf-stress multi --ops 20000, seeds 3
// and 4, medians over the processes; bench/multi/h200), K = 2, 3, 4:
// divisor 1024 with sharedGrowthFraction 0.91, 0.82 and 0.97 driver calls
// per operation at 3,176, 2,883 and 2,855 operations per second per
// process; 256 without sharedGrowthFraction (the code before) 1.72, 1.30
// and 1.85 at 2,584, 2,234 and 1,960; 1024 alone 1.54, 1.05 and 1.11; with
// sharedGrowthFraction, 512: 1.09, 0.93 and 1.32; 2048: 1.08, 0.96 and
// 1.04; 4096: 1.63, 1.57 and 1.55. Failures within 90% of the share still
// within at return: none with 1024, 0, 1 and 3 before. Smaller handles
// leave less memory pinned under the live part of a handle, so fewer
// pages move per request; much smaller ones cost a cuMemMap per handle.
// The final code (with sharedGrowthMin and othersLow), seeds 5 and 6:
// 1.10, 0.77 and 0.94 at 3,241, 3,105 and 3,052, against 1.67, 1.44 and
// 1.99 at 3,078, 2,233 and 2,120 before. The simulated H200 agrees when
// multi runs as many goroutines per process as on the H200's 16-core
// host (-g 16, seeds 5 to 8): 0.54, 0.54 and 0.48 calls per operation
// with 1024, 0.55, 0.66 and 0.62 with 256, 1.22, 0.93 and 0.88 before;
// failures still within 90% at return 0, 0 and 0 with 1024, 0, 9 and 233
// with 256. With two goroutines (a 2-core machine's default) a process
// fails a quarter as many requests, gathers memory more often, and 1024
// makes more calls than 256 (1.75 against 1.33 at K = 2).
//
// On the H200 (2026-12-04, seeds 30 to 35, K = 2 and 4, medians over the
// processes; bench/multi/h200/2026-12-04) with two goroutines per
// process: 1.64 and 1.59 calls per operation, 1.24 and 1.17 of them
// cuMemMap, nearly all moving spares to where a request within 90% of
// the cap goes (a move costs a cuMemMap per handle). A 512th of the cap
// made 1.19 and 1.10, and handles of up to an eighth of the block they
// are made for (at least a 1024th of the cap) 1.25 and 0.98; but with 16
// goroutines, as many operations per second fell by 13% and 14% (a
// 512th) and 12% and 24% (an eighth) from 4,821 and 4,151, at 0.47–0.58
// calls per operation against 0.50: larger handles fit fewer holes, so
// more spares are released and created again, and the out-of-memory path
// moves memory more often, each move waiting for the streams first
// (cuStreamSynchronize 390 and 416 against 304 per process at K = 2).
// A 1024th stays.
const sharedHandleDivisor = 1024

// declaredShareFraction and declaredShareHandleDivisor: a MaxFraction of
// at most one half declares the device shared, since it leaves room for at
// least one other job as large. Until others hold enough of it to make it
// shared by the rules above, such a pool's growths map the interior of
// each block in handles of up to a 2048th of its cap (one page below a cap
// of 8 GiB, as handles of less than two pages are one-page ones), half
// what a shared device gives from a cap of 8 GiB on: jobs started
// together each grow alone at first, and the first to start mapped
// thousands of one-page handles before the others held a 128th of the
// device, which it later moved one by one (half a driver call per
// operation in such a process on the H200: an instrumented run of
// 2026-12-02, K = 2 and 4).
//
// Measured on the simulated H200 (tlsf-stress multi -g 16, 20,000
// operations per process, seeds 13 to 20, 2026-12-02), K = 2, 3, 4, the
// largest driver calls per operation of any process: 0.71 and 0.73
// against 1.24 and 1.34 before at K = 2 and 3, and at K = 4 within the
// runs' spread (1.27 against 1.36 in one run, 1.22 against 1.21 in
// another); medians 0.48, 0.51, 0.49 against 0.64, 0.51, 0.56; processes
// above 1: 4 of 72 against 8. With a 1024th (as shared): 0.61, 0.82 and
// 1.12. The price is paid by a job alone on its GPU at such a fraction:
// memory moves only in whole handles, so its smallest feasible cap grows,
// on the nine traces (replayed with the cap as MaxFraction of a device
// 2.2 times their peak live bytes), from at most 1.0040–1.0049 to at most
// 1.0057–1.0060 × peak live, and with every size five times larger, as a
// job filling half an H200 would be, from at most 1.0011–1.0012 to
// 1.0067–1.0068 (1.0096 with a 1024th), over several runs;
// BenchmarkDeclaredShareMinCap in bench/ replays this. Above one half, and for a cap set by MaxBytes
// alone, nothing changes: one-page handles.
const (
	declaredShareFraction      = 0.5
	declaredShareHandleDivisor = 2048
)

// smallCapHandleDivisor and smallCapHandleMax bound a shared device's
// handles below a cap of 8 GiB, where a 1024th of the cap is under 8 MiB:
// a 256th of the cap, at most 8 MiB, as every cap had before
// sharedHandleDivisor became 1024 (setShared).
const (
	smallCapHandleDivisor = 256
	smallCapHandleMax     = 8 << 20
)

// setShared tells a VMM heap, before it grows, whether other processes
// hold much of the device: total − free − the pool's own reserved memory,
// with free as cuMemGetInfo just read it, at least sharedFraction of the
// total, or more than they held at New or any growth since by
// sharedGrowthFraction of the total and sharedGrowthMin. A growth of a
// capped pool on a shared device then maps the interior of its block in
// larger handles rather than one-page ones (vmmHeap.growthRange; for a
// block aligned above a page, the free head the alignment cuts off may
// share them). Until then, a MaxFraction of at most one half declares the
// device shared, with handles half as large (declaredShareFraction). A
// pool with no cap is left alone (under ReleaseFraction
// its handles are sized to its peak: setFine).
//
// One-page handles let a pool fit under its cap (setFine): alone on a
// GPU, it moves memory 2 MiB at a time to where its next block goes, and
// its smallest feasible cap is 1.009, 1.004 and 1.004 × peak live on the
// shared traces, against 1.043, 1.013 and 1.067 with large handles from
// the start. On a GPU shared with other jobs, memory moves between the
// processes as well, at the handles' granularity: every page a pool
// releases may be taken by a neighbour, and moving a pool's share in
// one-page handles costs a cuMemCreate and a cuMemMap per 2 MiB to fill
// it and a cuMemUnmap and a cuMemRelease per 2 MiB to move it. Measured
// with tlsf-stress multi, K processes at 1/K each, 1.5× oversubscribed,
// 20,000 operations each, the rule of a sixteenth (sharedFraction), the
// early release of spares in mapRun and the 90% rule's rounding
// (mayRecycle) against the code before them, in the same run
// (2026-12-01; sharedGrowthFraction and sharedHandleDivisor give the
// figures since): on the H200, K = 2
// at 1,984 operations per second per process and 9.99 driver calls per
// operation against 1,595 and 11.71, K = 4 at 1,508 and 6.67 against
// 1,270 and 7.37 (medians over three seeds); on the simulated H200, with
// the contexts' memory modelled (sim.H200ContextBytes), 3.4 and 2.5–2.6
// calls against 8.56 and 5.30. A pool alone on its GPU, the replays and
// their smallest caps above, is not affected.
func (p *Pool) setShared(free uint64) {
	h := p.vmm
	if h == nil {
		return
	}
	h.sharedPages = 0
	capped, limit := p.capFrom(0)
	if !capped {
		return // no cap: large handles, or ReleaseFraction's (setFine)
	}
	others := p.total - min(p.total, free+p.reserved())
	p.othersLow = min(p.othersLow, others)
	grown := others - p.othersLow
	switch {
	case float64(others) >= sharedFraction*float64(p.total) || grown >= max(uint64(sharedGrowthFraction*float64(p.total)), sharedGrowthMin):
		small := min(limit/smallCapHandleDivisor, smallCapHandleMax)
		h.sharedPages = max(limit/sharedHandleDivisor, small) / h.gran
	case p.opts.MaxFraction <= declaredShareFraction:
		h.sharedPages = limit / declaredShareHandleDivisor / h.gran
	}
}

// underPressure reports whether an allocation failed in the last
// recyclePressureAllocs (share.go).
func (p *Pool) underPressure() bool {
	return p.pressure != 0 && p.c.allocs-(p.pressure-1) < recyclePressureAllocs
}

// cap returns whether reserved memory is capped, and the cap in bytes.
// It makes no driver call; the error is always nil.
func (p *Pool) cap() (bool, uint64, error) {
	capped, limit := p.capFrom(0)
	return capped, limit, nil
}

// capFrom computes the cap: the smaller of MaxBytes and MaxFraction's
// (fractionCap). free is unused since the cap became a fraction of total
// memory (share.go).
func (p *Pool) capFrom(free uint64) (bool, uint64) {
	limit := uint64(math.MaxUint64)
	capped := false
	if p.opts.MaxBytes > 0 {
		limit, capped = p.opts.MaxBytes, true
	}
	if p.opts.MaxFraction < 1 {
		limit, capped = min(limit, p.fractionCap()), true
	}
	return capped, limit
}

// fractionCap is MaxFraction's cap in bytes: a fraction of the device's
// total memory, less what it leaves for the process's context
// (contextShareDivisor; share.go, doc.go).
func (p *Pool) fractionCap() uint64 {
	share := p.fractionShare()
	return share - min(share/2, p.context)
}

// fractionShare is MaxFraction × the device's total memory, in bytes.
func (p *Pool) fractionShare() uint64 { return uint64(p.opts.MaxFraction * float64(p.total)) }

// contextShareDivisor bounds what a MaxFraction share leaves for the
// process's own CUDA context: the device's memory in use at New (total −
// free: the context, and whatever the process or others had allocated),
// at most total/256 (559 MiB on an H200, where a context holds 526 MiB:
// sim.H200ContextBytes) and at most half the share. A pool made when its
// process's context was the only memory in use counts just that; one made
// on a busy GPU, the bound: caps at the same fraction differ by what
// their contexts held below the bound (33 MiB on an H200 between a first
// process and later ones), never by more. A context's memory does not
// shrink with the GPU's, so on GPUs below about 132 GiB the bound is less
// than a context (320 MiB on an 80 GB one): the caps there still add up
// to a little more than the device holds beside the contexts (the
// package doc's 1/K − 1% leaves room). A bound in bytes would count up to
// that much of other processes' memory as this one's context wherever the
// first process's context is smaller, and was not measured on such GPUs.
//
// Why: MaxFraction × total for each of K processes at 1/K adds up to the
// whole device, but each process's context holds memory no pool can have,
// so the caps could not all be held at once. All the processes peaked at
// their caps, at different moments; in each run the device ran out first
// for one of them, below its cap, leaving it less room than the others
// above its 90% line (share.go), and it made 1.4 to 1.7 times their
// cuMemMap calls per operation and 2.0 to 3.2 times their cuMemGetInfo:
// 1.2–1.5 driver calls per operation against 0.7–0.9 (H200, 2026-12-02,
// tlsf-stress multi, K = 4, seeds 20 to 23, bench/multi/h200 head-*; one
// such process in each run). With the contexts counted in, the caps add
// up to what the device can hold beside them. On the H200 (seeds 24 to
// 27, against the code before in the same run; ctx-* and noctx-*),
// medians [ranges] over the processes, K = 2, 3, 4: 0.53 [0.49–0.58],
// 0.51 [0.49–0.55] and 0.49 [0.44–0.53] driver calls per operation against
// 0.80 [0.58–0.88], 0.68 [0.56–0.96] and 0.90 [0.73–1.15], at 9% to 15%
// more operations per second, max share / min share 1.0000. On the
// simulated H200 (contexts modelled, tlsf-stress multi --device sim -g 16,
// seeds 13 to 20), the largest calls per operation of any process 0.50,
// 0.61 and 0.48 against 0.62, 0.76 and 1.12 (a rerun: 0.48, 0.50, 0.47).
// The price: each cap is 0.55 GiB lower on an H200.
const contextShareDivisor = 256

func (p *Pool) reserved() uint64 {
	if p.pt != nil {
		return p.pt.reserved
	}
	return p.heap.reserved() + p.probeBytes
}

func (p *Pool) noteReserved() {
	p.c.reservedPeak = max(p.c.reservedPeak, p.reserved())
}

// sizeString writes n bytes for a person: "12345 bytes", or with the
// binary unit beside the exact figure, "64.00 MiB (67108864 bytes)".
func sizeString(n uint64) string {
	units := []string{"KiB", "MiB", "GiB", "TiB"}
	if n < 1<<10 {
		return fmt.Sprintf("%d bytes", n)
	}
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	return fmt.Sprintf("%.2f %s (%d bytes)", v, units[u], n)
}

// AllocPitch allocates height rows of at least widthBytes each, for use on
// the default stream, and returns the pointer and the row pitch in bytes:
// the pitch cuMemAllocPitch would return (widthBytes rounded up to the
// driver's pitch unit, 512 bytes on an H200, found by asking the driver
// once). The pointer is aligned to that unit. Statistics (Allocated,
// Active) count the allocation at its block size, as Stats.Allocated
// says: pitch × height rounded up to its size class, in every backend
// (where the pitch unit is 256 bytes or less, a pooled backend's block is
// pitch × height rounded up to 256 bytes instead). A passthrough pool's
// Reserved counts pitch × height, what the driver allocated.
//
// Errors: ErrInvalidSize (zero width or height), ErrTooLarge (pitch ×
// height overflows or exceeds tlsf.MaxSize), and those of Alloc.
func (p *Pool) AllocPitch(widthBytes, height uint64) (uintptr, uint64, error) {
	if widthBytes == 0 || height == 0 {
		return 0, 0, fmt.Errorf("%w: pitch allocation of %d × %d bytes", ErrInvalidSize, widthBytes, height)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, 0, ErrClosed
	}
	if widthBytes > tlsf.MaxSize || height > tlsf.MaxSize/widthBytes {
		return 0, 0, fmt.Errorf("%w: pitch allocation of %d × %d bytes", ErrTooLarge, widthBytes, height)
	}
	if p.pt != nil {
		return p.pt.allocPitch(p, widthBytes, height)
	}
	unit, err := p.pitchUnit()
	if err != nil {
		return 0, 0, err
	}
	pitch := roundUp(widthBytes, unit)
	if height > tlsf.MaxSize/pitch {
		return 0, 0, fmt.Errorf("%w: pitch %d × height %d bytes", ErrTooLarge, pitch, height)
	}
	p.pitched = true
	defer func() { p.pitched = false }() // also if OnOutOfMemory panics
	ptr, err := p.allocLocked(pitch*height, unit, 0)
	if p.dbg != nil && err == nil {
		p.dbg.notePitch(ptr, pitch*height)
	}
	return ptr, pitch, err
}

// pitchUnit asks the driver once for the pitch of a one-byte-wide row:
// the unit cuMemAllocPitch rounds pitches to.
func (p *Pool) pitchUnit() (uint64, error) {
	p.freeProbe()
	if p.pitchAlign == 0 {
		ptr, pitch, err := p.dev.MemAllocPitch(1, 1, 4)
		if err != nil {
			if isOOM(err) {
				p.c.ooms++
				return 0, fmt.Errorf("%w: probing the pitch alignment: %w", ErrOutOfMemory, err)
			}
			return 0, fmt.Errorf("pool: probing the pitch alignment: %w", err)
		}
		if p.dev.MemFree(ptr) != nil {
			p.probe, p.probeBytes = ptr, pitch
			p.noteReserved()
		}
		if pitch == 0 || pitch&(pitch-1) != 0 {
			pitch = 512
		}
		p.pitchAlign = pitch
	}
	return p.pitchAlign, nil
}

// freeProbe frees the pitch probe's allocation if an earlier free failed.
func (p *Pool) freeProbe() error {
	if p.probe == 0 {
		return nil
	}
	if err := p.dev.MemFree(p.probe); err != nil {
		return err
	}
	p.probe, p.probeBytes = 0, 0
	return nil
}

// Free frees ptr as used on the default stream: FreeOn(ptr, 0).
func (p *Pool) Free(ptr uintptr) error { return p.FreeOn(ptr, 0) }

// FreeOn frees ptr, whose last use is queued on stream s (or done). The
// block can serve a later request on s at once; other streams and the
// driver get it only after that use. The default-stream rule: Alloc and
// Free are AllocOn and FreeOn with stream 0, the legacy default stream,
// so memory used on other streams must be freed with FreeOn on the stream
// of its last use, or after synchronizing.
//
// A ptr of 0 is a no-op that returns nil, as cuMemFree(0) and
// cudaFree(NULL) are, even on a closed pool.
//
// In guard mode (Options.Guard) FreeOn blocks: before it frees a block
// with a red zone it synchronizes s when s is not 0, and the stream the
// block was allocated on when that is another (cuStreamSynchronize,
// without the pool's lock), then reads the red zone back (cuMemcpyDtoH).
//
// Errors: ErrDoubleFree, ErrUnknownPointer (foreign, or inside an
// allocation; from a pooled backend these may also match
// tlsf.ErrDoubleFree or tlsf.ErrUnknownAddress: see ErrDoubleFree and
// ErrUnknownPointer), ErrClosed, ErrCorrupted (guard mode: the block's
// red zone was overwritten; the block stays allocated, its zone filled
// again, so that a second free frees it); device errors from recording
// the free's event, and in guard mode from synchronizing the streams or
// reading the red zone (the block stays allocated). s is not validated,
// as in AllocOn. Safe for concurrent use, as every method.
func (p *Pool) FreeOn(ptr uintptr, s device.Stream) error { return p.freeOn(ptr, 0, s, true) }

// freeLayered is a caller's free (FreeOn, FreeSizedOn) of a null pointer,
// or through the debug layer or history, which call freeOn back with
// outer false.
func (p *Pool) freeLayered(ptr uintptr, s device.Stream) error {
	switch {
	case ptr == 0:
		return nil // as cuMemFree(0) and cudaFree(NULL)
	case p.dbg != nil:
		return p.dbg.free(ptr, s) // guard mode, memory checker (debug.go)
	case p.hist != nil:
		return p.freeRecorded(ptr, s) // history.go
	default: // not reached from freeOn, whose test sent it here
		return p.freeOn(ptr, 0, s, false)
	}
}

// FreeSized frees ptr, allocated with a request of size bytes, as used on
// the default stream: FreeSizedOn(ptr, size, 0).
func (p *Pool) FreeSized(ptr uintptr, size uint64) error { return p.FreeSizedOn(ptr, size, 0) }

// FreeSizedOn is FreeOn for a caller that knows the size in bytes it
// asked AllocOn for, as PyTorch's pluggable allocator does (its free
// passes the size; tlsf_free hands it on). The size tells at once
// whether a per-P cache may hold the block: a request above
// CacheOptions.MaxSize never came from one, so its free goes straight to
// the pool's lock, with no probe of the caches' filter or of the
// current P's table; a small one goes to the cache without the filter.
// On the simulated H200 that took warm replays from 40.9–42.6 to
// 37.9–38.4 ns per operation on lstm, 52.2–53.3 to 49.0–50.0 on
// mobilenet, 45.8–46.6 to 42.9–43.7 on bert (BenchmarkPoolReplay's
// median of 20 replays, three runs each, pinned to one core of the
// 2-core AMD EPYC development VM, 2026-12-04).
//
// size is a hint, never trusted: 0 (unknown) frees as FreeOn does, and a
// size other than the request's frees the block all the same, only
// without the shortcut. Errors and concurrency: as FreeOn.
func (p *Pool) FreeSizedOn(ptr uintptr, size uint64, s device.Stream) error {
	return p.freeOn(ptr, size, s, true)
}

// freeOn is FreeSizedOn, size 0 meaning unknown (FreeOn's case). With
// outer, a caller's free: a null pointer, and every free of a pool with
// the debug layer or history, go to freeLayered; those layers call it
// back without outer. FreeOn and FreeSizedOn are then one call each,
// which the compiler inlines into their callers: before, FreeSizedOn made
// the checks and called freeOn, about 2 instructions more per free (the
// call's 6, less the outer test's; callgrind, 50 warm replays of lstm:
// 90.30M instructions before, 90.12M after). With a size, the caches'
// size filter (cacheSet.serves) tells at once whether a per-P cache may
// hold the block; without one, their filter of small granules
// (maybeCached) does. A block a wrong hint sent to the lock is still
// found: a cached block meets the stateCached case (freeBlock), as one
// freed on another P does.
//
// The common locked case, a live block of a single-stream pool freed on
// its stream (the gate, Pool.gate, tells which), is written out here: one
// probe of the index's address table (Detach, FreeDetached),
// afterLockedFree inlined, the unlock not deferred (nothing here runs a
// caller's code but a start-over's log event, whose Options.Logger
// handler must neither call the pool nor panic). Every other case goes to
// freeRare or freeBlock. The size branch above cost warm replays 1% once,
// against a FreeSizedOn of its own that called freeLocked; the figures
// below include it.
//
// Each call saved counts, on the alloc path as here. Warm replays on the
// simulated H200 (BenchmarkPoolReplay, pinned to one core of the 2-core
// AMD EPYC development VM), in ns per operation:
//   - one call for AllocOn's case (allocFast) in place of allocLocked,
//     search, place and the heap's interface: lstm, resnet50 and tdnn
//     from 46.8, 52.6 and 43.9 to 43.7, 51.1 and 42.6 (the minimum per
//     replay, medians of ten runs alternating with the code before,
//     2026-12-02);
//   - AllocOn's unlock not deferred: lstm, resnet50, tdnn and
//     resnet50-infer from 42.0, 48.3, 39.1 and 40.6 to 41.2, 48.1, 38.6
//     and 39.7 (medians of six, 2026-12-03); a deferred unlock on the
//     free path cost 2–3%;
//   - both cases written out where they are now, in place of AllocOn →
//     allocOn → lockedAlloc → allocFast and FreeSizedOn → freeLocked →
//     afterLockedFree: 3.5%, 0.1% and 2.6% fewer instructions over 50
//     warm replays of lstm, resnet50 and tdnn (Valgrind's callgrind);
//     with the block's state in the index's tag as well (state), 55.6,
//     54.4 and 48.9 ns against 57.7, 55.2 and 51.5 (medians of ten runs'
//     medians per replay alternating with the code before, 2026-12-07);
//   - the lock biased toward the goroutine using the pool alone
//     (biasMutex: the section in place of TryLock and Unlock): 37.7,
//     44.0 and 36.5 ns against 38.9, 44.9 and 37.9 (tlsf-stress replay,
//     200 warm replays, medians of ten runs alternating with the code
//     before, 2026-12-07).
func (p *Pool) freeOn(ptr uintptr, size uint64, s device.Stream, outer bool) error {
	if outer && (ptr == 0 || p.layered) {
		return p.freeLayered(ptr, s)
	}
	if c := p.cache; c != nil {
		if size != 0 {
			if c.serves(size, uintptr(s)) && c.free(ptr) {
				return nil
			}
		} else if s == 0 && ptr%indexGranularity == 0 && c.maybeCached(ptr) && c.free(ptr) {
			return nil
		}
	}
	biased := p.mu.enter() // as in AllocOn
	if !biased {
		if p.mu.mu.TryLock() {
			p.mu.tried()
		} else {
			p.lockContended()
		}
	}
	if !p.freeGate || ptr%indexGranularity != 0 || s != p.gateStream {
		p.mu.relock(biased)
		err := p.freeRare(ptr, s)
		p.mu.Unlock()
		return err
	}
	b, err := p.x.Detach(uint64(ptr))
	switch {
	case err != nil:
		err = p.translate(uint64(ptr), err)
	case p.state(b.ID) != stateLive:
		p.x.Attach(b)
		if biased { // freeBlock may call the driver: under the lock, looked up again
			p.mu.relock(true)
			biased = false
			err = p.freeRare(ptr, s)
			break
		}
		err = p.freeBlock(b, s)
	default:
		p.x.FreeDetached(b)
		p.ss.first.dirty = true
		c := &p.c
		c.frees++
		c.allocated -= b.Size
		c.allocations--
		c.active -= b.Size
		if rare, floor := p.countLockedFree(); rare {
			p.mu.relock(biased) // the rare cases may call the driver
			biased = false
			p.afterLockedFreeRare(floor)
		}
	}
	if biased { // as in AllocOn
		p.mu.leave()
	} else {
		p.mu.unlocking()
		p.mu.mu.Unlock()
	}
	return err
}

// freeRare is freeOn under the pool's lock for a closed or passthrough
// pool, a pointer no block can start at, a pool with no stream yet, in
// multi-stream mode or freeing on a stream other than its one, and one
// with blocks whose uses RecordStream recorded.
func (p *Pool) freeRare(ptr uintptr, s device.Stream) error {
	if p.closed || p.pt != nil || ptr%indexGranularity != 0 {
		return p.freeOdd(ptr, s)
	}
	b, err := p.x.Lookup(uint64(ptr))
	if err != nil {
		return p.translate(uint64(ptr), err)
	}
	return p.freeBlock(b, s)
}

// freeOdd is freeRare for a closed or passthrough pool, or a pointer
// no block can start at.
func (p *Pool) freeOdd(ptr uintptr, s device.Stream) error {
	if p.closed {
		return ErrClosed
	}
	if p.pt != nil {
		if err := p.syncUses(ptr); err != nil {
			return err
		}
		if err := p.pt.free(p, ptr, s); err != nil {
			return err
		}
		delete(p.ss.uses, uint64(ptr))
		p.ss.onChange()
		return nil
	}
	// No block starts there. (Nor may 2^64−1 reach the index's address
	// table, where it marks empty slots.)
	return fmt.Errorf("%w: %#x is not %d-byte aligned", ErrUnknownPointer, ptr, indexGranularity)
}

// freeBlock frees block b, allocated in the index, in every case but
// freeOn's common one: a block cached by a P's cache, pending, or
// freed already; a stream seen for the first time; multi-stream mode.
func (p *Pool) freeBlock(b tlsf.Block, s device.Stream) error {
	ptr := b.Addr
	switch p.state(b.ID) {
	case stateLive:
	case stateCached:
		// Handed out by a cache, freed on another P (or meeting a busy
		// cache, or on another stream): take it from its owner's table.
		// On the default stream the freeing P's cache adopts it; else it
		// is freed here. In no table, it sits on a stack: freed already.
		ok, last := p.cache.takeLive(b)
		if !ok {
			return fmt.Errorf("%w: %#x", ErrDoubleFree, ptr)
		}
		if s == 0 && p.cache.adopt(b) {
			if last {
				p.startOver()
			}
			return nil // now cached by this P
		}
		// Live in the pool's own counters from now on, so that a failure
		// below leaves it a consistent live block.
		p.uncache(b)
	default:
		return fmt.Errorf("%w: %#x", ErrDoubleFree, ptr)
	}
	if _, err := p.ss.use(s); err != nil {
		return fmt.Errorf("pool: registering stream %#x: %w", uintptr(s), err)
	}
	p.c.frees++
	p.c.allocated -= b.Size
	p.c.allocations--
	p.c.active -= b.Size
	p.setState(b, 0)
	if err := p.releaseFreed(b, s); err != nil {
		// The free did not happen: the block is still the caller's.
		p.setState(b, stateLive)
		p.c.frees--
		p.c.allocated += b.Size
		p.c.allocations++
		p.c.active += b.Size
		return err
	}
	p.afterLockedFree()
	return nil
}

// uncache moves block b, handed out by a P's cache and just taken from
// its owner's table (cacheSet.takeLive), out of the caches' count and
// into the pool's own: a live block of the pool from now on. Pool lock
// held.
func (p *Pool) uncache(b tlsf.Block) {
	p.cache.sysBytes -= b.Size
	p.cache.sysBlocks--
	p.setState(b, stateLive)
	p.c.allocated += b.Size
	p.c.active += b.Size
	p.c.allocations++
}

// releaseFreed makes block b, freed on stream s and no longer counted
// anywhere, reusable: pending on s in multi-stream mode, else straight
// back to the index (s marked dirty). Pool lock held; s registered.
func (p *Pool) releaseFreed(b tlsf.Block, s device.Stream) error {
	if held, err := p.holdForUses(b, s); held || err != nil {
		return err // held until the events of its recorded streams (record.go)
	}
	st, err := p.ss.use(s)
	if err != nil {
		return fmt.Errorf("pool: registering stream %#x: %w", uintptr(s), err)
	}
	if p.ss.multi {
		p.ss.defer_(st, b)
		p.pend(b)
		if p.ss.frees >= pollInterval {
			_ = p.pollPending(false)
		}
		return nil
	}
	if _, err := p.x.Free(b.Addr); err != nil {
		return p.translate(b.Addr, err) // not reached: b is allocated in the index
	}
	st.dirty = true
	return nil
}

// translate turns index errors about address addr into the pool's
// sentinels.
func (p *Pool) translate(addr uint64, err error) error {
	if h := p.vmm; h != nil && h.standby > 0 && addr >= h.end && addr-h.end < h.standby*h.gran && errors.Is(err, tlsf.ErrUnknownAddress) {
		// Free space the index gave up when the pool started over.
		err = fmt.Errorf("%w: %#x lies in free pages on standby", tlsf.ErrDoubleFree, addr)
	}
	switch {
	case errors.Is(err, tlsf.ErrDoubleFree):
		// Free space: a block freed already, or an address the pool never
		// returned; the index cannot tell which, so the error is both.
		return fmt.Errorf("%w (or %w): %w", ErrDoubleFree, ErrUnknownPointer, err)
	case errors.Is(err, tlsf.ErrUnknownAddress):
		return fmt.Errorf("%w: %w", ErrUnknownPointer, err)
	}
	return err
}

// pollPending reclaims blocks whose stream-ordered frees completed.
func (p *Pool) pollPending(wait bool) error {
	if !p.ss.polls() {
		return nil
	}
	return p.ss.poll(wait, p.reclaimPending)
}

// reclaimPending returns a pending block, whose stream has passed its
// free, to the index.
func (p *Pool) reclaimPending(addr uint64) {
	b, err := p.x.Free(addr)
	if err != nil {
		return // not reached: pending blocks are allocated in the index
	}
	p.unpend(b)
	p.c.active -= b.Size
}

// afterLockedFree lets a pool whose last block was freed start over
// (startOver) and applies FreeFloorFraction every ReleaseCheckInterval
// frees under the lock. Small enough to inline, the rare cases out of
// line (afterLockedFreeRare).
func (p *Pool) afterLockedFree() {
	if rare, floor := p.countLockedFree(); rare {
		p.afterLockedFreeRare(floor)
	}
}

// countLockedFree counts a free under the lock and tells whether
// afterLockedFreeRare must run (rare: the pool is empty, or a floor
// check is due) and whether the floor check is (floor). Pool lock held.
func (p *Pool) countLockedFree() (rare, floor bool) {
	p.lockedFree++
	floor = p.lockedFree%ReleaseCheckInterval == 0
	return floor || p.c.allocations == 0, floor
}

// afterLockedFreeRare is afterLockedFree's work; floor: this free was
// the ReleaseCheckInterval-th (told before a biased section relocked,
// after which other frees may have counted).
func (p *Pool) afterLockedFreeRare(floor bool) {
	if p.c.allocations == 0 {
		p.startOver()
	}
	if floor && p.opts.FreeFloorFraction > 0 {
		p.checkFloor()
	}
}

// checkFloor returns all unused memory if the device's free memory is
// below FreeFloorFraction of its total; its calls count for
// PathScavenge. Pool lock held.
func (p *Pool) checkFloor() {
	prev := p.dev.enter(PathScavenge)
	defer p.dev.leave(prev)
	if free, total, err := p.dev.MemGetInfo(); err == nil && float64(free) < p.opts.FreeFloorFraction*float64(total) {
		_, _ = p.releaseUnused(math.MaxUint64)
	}
}

// makeRoom applies ReleaseFraction before the pool maps k more bytes: it
// keeps reserved memory within (1 + ReleaseFraction) × the peak of memory
// in use (blocks live, pending or in caches, the new one included). When
// mapping k bytes would cross that line, it first returns unused memory,
// from under the largest free blocks, down to (1 + ReleaseFraction/2) ×
// the peak: the half-way mark spaces releases out.
//
// Measuring against the peak rather than the memory in use now is what
// keeps a program whose use rises and falls in steps (a training loop)
// from unmapping memory between steps and mapping it again in the next:
// memory it needed at its peak stays mapped, and only the excess that
// fragmentation of the address range would add beyond it is recycled.
func (p *Pool) makeRoom(k uint64, growing bool) error {
	line, ok := p.releaseLine(k)
	if !ok {
		return nil
	}
	used := p.used()
	res := p.reserved()
	if res+k <= line {
		return nil
	}
	f := p.opts.ReleaseFraction
	peak := float64(max(p.c.activePeak, used+k))
	excess := res + k - min(res+k, uint64((1+f/2)*peak))
	unused := res - min(res, used)
	if err := p.ss.syncDirty(); err != nil {
		return err
	}
	// Move the pages rather than return them: the mapping about to be
	// made takes them back at once. (A chunk heap frees chunks.) Before a
	// growth, not from the free top of the heap, which the growth covers;
	// for holes under a block already placed, from anywhere (recycle).
	var n uint64
	var err error
	h := p.vmm
	if h != nil && !growing {
		n, err = h.recycle(min(excess, unused, k))
	} else {
		n, err = p.heap.release(min(excess, unused, k), true)
	}
	if h != nil && err == nil && h.releasePages > 1 && res+k-min(res+k, n) > max(line, p.c.reservedPeak) {
		// Memory under free blocks lies in handles that live blocks
		// still touch, and the mapping that follows sets a peak above
		// the line: map smaller handles from now on (setFine).
		h.releaseShift++
	}
	if p.backend == BackendChunks {
		p.noteReleased(n)
	} else {
		p.noteMoved(n)
	}
	return err
}

// used is the memory in use: live and pending blocks, and blocks in
// caches, in bytes.
func (p *Pool) used() uint64 {
	u := p.c.active
	if p.cache != nil {
		u += p.cache.sysBytes
	}
	return u
}

// releaseLine returns the most memory ReleaseFraction lets the pool
// reserve once it maps k more bytes for a request: (1 + ReleaseFraction)
// × the peak of memory in use, that request included; false when
// ReleaseFraction is off.
func (p *Pool) releaseLine(k uint64) (uint64, bool) {
	f := p.opts.ReleaseFraction
	if f <= 0 {
		return 0, false
	}
	peak := float64(max(p.c.activePeak, p.used()+k))
	return uint64((1 + f) * peak), true
}

// releaseUnused returns about limit bytes of device memory under free
// blocks (math.MaxUint64: all), after making sure the GPU no longer uses
// it.
func (p *Pool) releaseUnused(limit uint64) (uint64, error) {
	if p.heap == nil {
		return 0, nil
	}
	if err := p.ss.syncDirty(); err != nil {
		return 0, err
	}
	n, err := p.heap.release(limit, false)
	p.noteReleased(n)
	return n, err
}

// noteMoved counts n bytes a VMM heap unmapped to move them: those it
// released instead of keeping (vmmHeap.dropped) as a release, the rest
// as recycled.
func (p *Pool) noteMoved(n uint64) {
	h := p.vmm
	if h == nil {
		return
	}
	d := min(h.dropped, n)
	h.dropped = 0
	p.c.recycledBytes += n - d
	p.noteReleased(d)
}

// noteMapping notes what a VMM heap's mapping (grow, back) left to note:
// a cuMemCreate refused for want of memory (noteRefused), the spares it
// released (noteDropped), and the peak of reserved memory, which a failed
// mapping may raise too (pages whose unmap failed stay mapped as strays,
// counted as reserved). Every mapping site calls it, error or not.
func (p *Pool) noteMapping() {
	p.noteRefused()
	p.noteDropped()
	p.noteReserved()
}

// noteDropped counts the spares a VMM heap released while mapping
// (vmmHeap.dropSpares) as a release.
func (p *Pool) noteDropped() {
	if h := p.vmm; h != nil && h.dropped > 0 {
		p.noteReleased(h.dropped)
		h.dropped = 0
	}
}

// noteReleased counts a release of n bytes to the driver.
func (p *Pool) noteReleased(n uint64) {
	if n > 0 {
		p.c.releases++
		p.c.releasedBytes += n
		p.noteRelease(n)
	}
}

// ForgetStream waits for the work queued on stream s
// (cuStreamSynchronize), makes the blocks freed on s reusable by every
// stream (those of the per-P caches stay theirs, for the default stream),
// takes s off the uses RecordStream recorded for live blocks (their
// frees no longer wait for it, nor name it), and forgets s. Call it
// before destroying a stream used with AllocOn, FreeOn or RecordStream:
// the pool synchronizes the streams it knows before it returns memory to
// the driver, and a destroyed stream cannot be synchronized (see
// "Destroyed streams" in streams.go). Forgetting a stream the pool does
// not know, or one dropped already, does nothing (in guard mode, a stream
// a live block's red-zone fill was queued on is synchronized, and taken
// off that block's record, all the same).
// Errors: ErrClosed, device errors (nothing changed).
func (p *Pool) ForgetStream(s device.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	// Guard mode's records may name s where the stream set does not
	// know it (a passthrough pool's): s is synchronized then too, once,
	// before anything changes.
	named := p.dbg != nil && p.dbg.names(s)
	if err := p.ss.forget(s, named, p.reclaimPending); err != nil {
		return err
	}
	if named {
		p.dbg.forgetStream(s)
	}
	return nil
}

// Trim returns unused device memory to the driver: it flushes the
// caches, waits for pending stream-ordered frees, synchronizes streams
// that freed memory, and releases every physical allocation whose memory
// lies wholly under free blocks: a VMM pool's handles (cuMemUnmap,
// cuMemRelease), a chunk pool's chunks (cuMemFree). A handle or chunk a
// live block touches stays whole: the driver frees physical memory only
// as the allocation it made, and a pool with no cap maps each growth as
// one handle of up to 128 MiB (vmm.go), so a 1 MiB block can keep up to
// that much reserved. A pool with a cap, or a ReleaseFraction, maps
// smaller handles (one 2 MiB page each near its cap). It returns the
// bytes released. On a device error, what Trim did before it stays done
// (the caches flushed, as with several streams blocks pending on the
// default stream; the frees waited for; the memory released), as
// capi/tlsf.h says of tlsf_trim: the statistics show it.
// Errors: ErrClosed, device errors.
func (p *Pool) Trim() (uint64, error) {
	p.lockAside()
	defer p.unlockAside()
	if p.closed {
		return 0, ErrClosed
	}
	prev := p.dev.enter(PathTrim)
	defer p.dev.leave(prev)
	p.flushCaches()
	if err := p.pollPending(true); err != nil {
		return 0, err
	}
	if p.c.allocations == 0 {
		// Where the last free left its block pending (several streams, or
		// a stream recorded with RecordStream), the free could not start
		// the heap over (startOver): now that nothing is pending, it does
		// (a no-op where the free did).
		p.startOver()
	}
	_ = p.freeProbe() // counted as reserved until it succeeds
	n, err := p.releaseUnused(math.MaxUint64)
	p.logTrim(n, err)
	return n, err
}

// Close returns all device memory to the driver, live allocations
// included (their pointers become invalid), after waiting for pending
// stream-ordered frees; a pool made by NewCUDA also releases its device.
// It does not wait for work still queued on live allocations (it
// synchronizes only the streams that freed memory): finish that work
// first (cuStreamSynchronize, cuCtxSynchronize), as before freeing them.
// After Close every method that returns an error returns ErrClosed,
// except that a free of a null pointer (Free(0), FreeOn(0, s),
// FreeSized(0, n), FreeSizedOn(0, n, s)) still returns nil, and an
// AllocPitch with a zero width or height still returns ErrInvalidSize;
// ResetPeaks does nothing; Stats (as its doc says), History, PeerAccess,
// Backend and Device still answer. Errors: ErrClosed (closed already), device
// errors (the pool is closed regardless).
func (p *Pool) Close() error {
	p.scav.halt() // before the lock: the scavenger may be waiting for it
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	prev := p.dev.enter(PathSetup)
	defer p.dev.leave(prev)
	var errs []error
	if p.dbg != nil {
		p.dbg.forget()
	}
	if p.cache != nil {
		// Blocks that cannot go back to the index go with the heap.
		errs = append(errs, p.cache.drainLocked(false))
		p.cache.forget()
	}
	errs = append(errs, p.pollPending(true))
	errs = append(errs, p.ss.syncDirty())
	errs = append(errs, p.ss.close(func(uint64) {}))
	if p.pt != nil {
		errs = append(errs, p.pt.close(p))
	} else {
		errs = append(errs, p.freeProbe(), p.heap.close())
	}
	if p.owned {
		errs = append(errs, p.dev.Device.Close())
	}
	p.closed = true
	p.fastMax = 0
	p.updateGate()
	p.closedFlag.Store(true)
	return errors.Join(errs...)
}

// flushCaches drains the per-P caches into the index (blocks whose free
// the driver cannot order stay cached). Pool lock held.
func (p *Pool) flushCaches() {
	if p.cache != nil {
		_ = p.cache.drainLocked(true)
	}
}
