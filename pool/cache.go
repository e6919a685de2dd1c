package pool

import (
	"fmt"
	"math/bits"
	"runtime"
	"slices"
	"sync/atomic"
	_ "unsafe" // go:linkname

	"github.com/gpumem/tlsf/internal/addrmap"
	"github.com/gpumem/tlsf/tlsf"
)

// Per-P small-block caches: the fast path.
//
// The shape is the Go runtime's mcache → mcentral → mheap: each P (the
// runtime's processor, at most GOMAXPROCS of them) owns a cache of small
// blocks, stacked by size class, and serves Alloc and Free of small
// blocks on the default stream from it without taking the pool's lock. An
// empty stack is refilled with a batch of blocks under the lock: from the
// central list of its class (mcentral) if that holds any, else from the
// TLSF index. A cache holding more than its share of bytes sheds blocks
// onto the central lists until it holds half of it, and the central lists
// keep at most one share in all, giving the oldest blocks beyond it back
// to the index. Blocks in caches and central lists stay allocated in the
// index (the index never sees the churn), keep their size-class size, and
// were all freed on the default stream, so reusing them on it is
// stream-ordered.
//
// No stranded blocks. A block cached by one P must not sit idle while
// another P asks the index (or the driver) for more memory, or which P a
// goroutine ran on would decide the pool's reserved memory. Four rules
// keep that from happening, as the Go runtime's mcache flushing does
// (blocks a P adopts count as its own, within its share: they stay
// cached while it grows the heap, as its own would):
//
//   - sheds go to the central lists, which every P's refill reads first;
//   - a refill the central list cannot serve takes blocks of its class
//     from other Ps' stacks (steal) before it cuts the index: a goroutine
//     that moved to another P finds the blocks it freed on the old one;
//   - every idleScanEvery refills, the refilling P adopts the caches of
//     Ps that neither allocated nor freed since the last scan (a P that
//     stopped allocating, perhaps because its goroutine moved to this
//     one), its share bounding them as its own blocks;
//   - before the heap grows (allocMiss), the current P adopts the caches
//     of Ps not active since the last scan, the central lists are
//     drained into the index, and the index is searched again
//     (reclaimOthers).
//
// Measured on the simulated H200 before the adoption (peak reserved over
// peak live, ten runs each; adoptIdle has the figures since): lstm
// 1.1418 and tdnn 1.1823 in every run at GOMAXPROCS 1, 2, 4
// and 16; resnet50 1.0226 at GOMAXPROCS 1 and 2 and in 5 of 10 runs at
// 16 (1.0215–1.025 in the others), against 1.023–1.033 and one lstm run in
// ten at 1.27–1.35 before the steal and reclaimOthers' rule. What still differs is how blocks split between two Ps' stacks
// after a migration until the next scan, and so when each sheds. A
// refill from the central lists or another P's stack hands out the newest
// block first and leaves the next newest on top of the stack, as the
// stack they came from would have served them.
//
// A goroutine finds its P's cache with runtime.procPin, which also keeps
// it on that P (no preemption) until procUnpin: the same mechanism
// sync.Pool uses. procPin is not exported; it is reached with go:linkname,
// which the Go runtime tolerates for it because widely used packages do
// the same (see the comment on runtime.procPin). The risk: a Go release
// that withdraws it breaks the build of this package; nothing fails
// silently.
//
// Each cache also has a spin lock (one CAS to take, one store to give
// back). Its owner takes it for a few nanoseconds per call, never while
// waiting for anything; it exists so that the pool, holding its own lock,
// can reach into every cache: to drain them on the out-of-memory path,
// Trim and Close, and to take back a block freed by a goroutine on
// another P (the free misses its own cache's table of blocks it handed
// out, takes the pool's lock, finds the block's owner recorded with the
// block, and the freeing P's cache adopts it). The lock order is pool
// lock, then cache lock; an owner never takes the pool's lock while
// holding its cache's.
//
// Statistics: each cache counts its blocks in use and in stacks under its
// lock, and Stats sums them. The pool's own counters see the caches as one
// client holding every block they got (sys); so the peaks of Allocated
// and Active count blocks in caches as in use: exact with caches off, an
// upper bound by at most the caches' capacity with them on.

//go:linkname procPin runtime.procPin
func procPin() int

//go:linkname procUnpin runtime.procUnpin
func procUnpin()

// refillBytes: a refill brings about 64 KiB of blocks of one class, at
// most maxRefill blocks and at least one: enough that a burst of small
// allocations takes the pool's lock once per 32 of them.
const (
	refillBytes = 64 << 10
	maxRefill   = 32
	// minShare is the least each P may cache (bytes), so that a pool that
	// holds little memory still caches a working set of small blocks of
	// many classes (64 KiB refills of a few dozen classes) without
	// shedding and refilling in turn under the pool's lock.
	minShare = 4 << 20
	// idleScanEvery: refills between two scans for idle caches. A scan
	// reads two counters per P under its spin lock (tens of ns each); one
	// per 16 refills (about 500 cached allocations) keeps its cost below
	// 1% of the refills' own while finding a P that stopped within a few
	// hundred of another P's allocations.
	idleScanEvery = 16
	// smallGranuleLog2: the small-block filter (cacheSet.small) has a bit
	// per 64 KiB of a VMM pool's virtual range (per page where pages are
	// smaller), so that a large block that starts near a refill's blocks
	// is taken for a cached one less often than with a bit per 2 MiB
	// page: on lstm (simulated H200, three replays) 6% of frees probe a
	// P's table in vain, against 19%. A range of more than
	// 2^smallFilterLog2 granules (512 GiB of 64 KiB) gets larger ones, but
	// never larger than a page, so that the filter has at most 2^23 bits
	// (1 MiB of address space, most of it never touched; an H200's 280 GiB
	// range: 560 KiB) where pages allow: 2 MiB pages keep ranges up to
	// 16 TiB within it (tlsf.MaxSize: 16 MiB, as with a bit per page).
	smallGranuleLog2 = 16
	smallFilterLog2  = 23
)

// centralOwner is the owner recorded for blocks on the central lists: no
// P. A free of such a block is a double free (it is on a list, not
// handed out).
const centralOwner = ^uint32(0)

// pcache is one P's cache. Fields below lock are guarded by it.
type pcache struct {
	lock atomic.Uint32

	stacks      [][]uint64  // by size class: addresses of free blocks, oldest first
	live        addrmap.Map // address → liveEntry(size, class), of blocks this cache handed out
	stackBytes  uint64
	stackBlocks int64
	liveBytes   uint64
	liveBlocks  int64
	allocs      uint64
	frees       uint64
	bySize      [NumSizeBuckets]uint64 // allocs by sizeBucket

	// seen is allocs+frees at the last idle scan (pool lock).
	seen uint64
	// blocker: the last scan for handed-out blocks (markBlocker) found
	// this P holding some first, so that with mayEmpty at emptyBlocker
	// only the free that empties this P's table looks for a start-over.
	blocker bool

	_ [64]byte // keep neighbouring caches off this one's cache lines
}

// liveEntry packs a block's size (a multiple of 256) and its size class
// (below 4096) into one table value, so a free needs no class lookup.
func liveEntry(size uint64, class int) uint64 { return size<<12 | uint64(class) }

func unpackLive(v uint64) (size uint64, class int) { return v >> 12, int(v & 4095) }

// push stacks a free block's address on its class. A stack's first array
// holds 8 addresses, a whole cache line: the allocator aligns 64-byte
// objects to 64 bytes, so no two caches' stacks share a line (smaller
// first arrays did, and writes from different Ps to one line throttled
// the caches to the speed of one).
func (pc *pcache) push(class int, addr uint64) {
	st := pc.stacks[class]
	if cap(st) == 0 {
		st = make([]uint64, 0, 8)
	}
	pc.stacks[class] = append(st, addr)
}

func (pc *pcache) tryLock() bool { return pc.lock.CompareAndSwap(0, 1) }

// ownerSpins bounds how long an owner waits for its cache: the pool holds
// a cache's lock for tens of nanoseconds (a drain, a Stats, a search for a
// block freed on another P), about a microsecond of spinning covers it.
const ownerSpins = 1000

// ownerLock takes the lock for the cache's owner, which is pinned to its
// P and so must not yield: it spins, reading before it tries, and gives
// up (the caller takes the pool's lock) only after ownerSpins. Giving up
// at once would be worse: while the pool searches the caches for a block
// freed on another P it holds each cache's lock in turn, and owners that
// meet it would all fall back to the pool's lock, whose holders search
// the caches again.
func (pc *pcache) ownerLock() bool {
	for i := 0; i < ownerSpins; i++ {
		if pc.lock.Load() == 0 && pc.tryLock() {
			return true
		}
	}
	return false
}
func (pc *pcache) unlock() { pc.lock.Store(0) }

// lockWait takes the lock, spinning: the owner holds it for nanoseconds.
func (pc *pcache) lockWait() {
	for !pc.tryLock() {
		runtime.Gosched()
	}
}

type cacheSet struct {
	p       *Pool
	classes tlsf.Classes // the index's size classes, a private copy
	maxSize uint64       // largest request served once engaged, bytes
	// serving is the largest request served now, bytes: maxSize once the
	// caches are engaged (engage), 0 before. Read by every call that may
	// reach a cache (serves), written once under the pool's lock.
	serving  atomic.Uint64
	fraction float64
	ps       []pcache
	share    atomic.Uint64 // bytes a P's stacks may hold

	// small is a VMM pool's filter of granules (64 KiB: smallGranuleLog2)
	// in which a block given to a cache ever started: bit i of word i/64 for
	// granule i of the range from smallBase, smallShift = log2(granule
	// size). A free of a pointer whose granule has no bit set skips the
	// probe of its P's table (a large block, or a foreign pointer) and
	// takes the lock at once. Bits are set under the pool's lock before a
	// block reaches a cache and are never cleared: a granule in which a
	// cached block once started costs frees of blocks starting in it the
	// probe. Check verifies that every cached block's bit is set. nil for
	// a chunk pool (always probe).
	small      []atomic.Uint64
	smallBase  uint64
	smallShift uint

	// The fields above are read by every P on every call; those below are
	// written under the pool's lock. Keep them on different cache lines.
	_ [64]byte

	// Under the pool's lock: bytes and blocks the caches got from the index
	// (central lists included).
	sysBytes  uint64
	sysBlocks int64

	// central holds, by size class, blocks shed by caches, oldest first,
	// for any P's refill (mcentral). Pool lock.
	central       [][]cblock
	centralBytes  uint64
	centralBlocks int64
	refills       int // refills since New, for idleScanEvery

	// batch and addrs are scratch space reused under the pool's lock, so
	// that refills and sheds allocate no Go memory once they have grown
	// (an adoption does: adoptIdle):
	// a refill's blocks (refillLocked, takeCentral, steal) and the
	// addresses a shed moves (shed, drainIdle); adopted, the stacks
	// adoptIdle moves (their addresses are copied: they join the
	// adopter's).
	batch   []tlsf.Block
	addrs   []uint64
	adopted []adoptedStack
}

// adoptedStack is one class's stack of an idle cache that adoptIdle moves.
type adoptedStack struct {
	class int
	addrs []uint64
}

// cblock is a block on a central list: its address and index block ID.
type cblock struct {
	addr uint64
	id   uint32
}

func newCacheSet(p *Pool, o CacheOptions) *cacheSet {
	c := &cacheSet{p: p, classes: p.x.Classes(), maxSize: min(o.MaxSize, tlsf.MaxSize), fraction: o.MaxFraction}
	maxClass, _ := c.classes.SizeClass(c.maxSize)
	// One cache per P; GOMAXPROCS may rise later (up to the CPU count, as
	// the runtime follows cgroup limits), and a P without a cache takes the
	// pool's lock.
	c.ps = make([]pcache, max(runtime.GOMAXPROCS(0), runtime.NumCPU()))
	for i := range c.ps {
		c.ps[i].stacks = make([][]uint64, maxClass+1)
		c.ps[i].live.Init(8)
	}
	c.central = make([][]cblock, maxClass+1)
	c.share.Store(minShare)
	if h := p.vmm; h != nil {
		// Granules of 64 KiB, or larger where the range has more than
		// 2^smallFilterLog2 of them, but never above a page.
		shift := max(smallGranuleLog2, uint(bits.Len64(h.vsize-1))-min(smallFilterLog2, uint(bits.Len64(h.vsize-1))))
		shift = min(shift, uint(bits.TrailingZeros64(h.gran)))
		granules := (h.vsize + 1<<shift - 1) >> shift
		c.small = make([]atomic.Uint64, (granules+63)/64)
		c.smallBase, c.smallShift = h.base, shift
	}
	return c
}

// markSmall sets the filter bit of the granule block b starts in: a free
// names a block by its start, so only that granule is asked about. Pool
// lock held.
func (c *cacheSet) markSmall(b tlsf.Block) {
	if c.small == nil {
		return
	}
	g := (b.Addr - c.smallBase) >> c.smallShift
	w := &c.small[g/64]
	if bit := uint64(1) << (g % 64); w.Load()&bit == 0 {
		w.Or(bit)
	}
}

// maybeCached reports whether ptr may be a block a cache handed out
// (false: certainly not).
func (c *cacheSet) maybeCached(ptr uintptr) bool {
	if c.small == nil {
		return true
	}
	pg := (uint64(ptr) - c.smallBase) >> c.smallShift // its granule
	if pg/64 >= uint64(len(c.small)) {
		return false // outside the range: foreign
	}
	return c.small[pg/64].Load()&(1<<(pg%64)) != 0
}

// serves reports whether a request of size bytes on stream s is a cache's.
func (c *cacheSet) serves(size uint64, s uintptr) bool {
	return s == 0 && size-1 < c.serving.Load()
}

// engage turns the caches on: from now, requests of up to maxSize bytes
// on the default stream go to them. Pool lock held (or New).
func (c *cacheSet) engage() { c.serving.Store(c.maxSize) }

// engaged reports whether the caches serve requests.
func (c *cacheSet) engaged() bool { return c.serving.Load() != 0 }

// lockAside takes the pool's lock for work other than an allocation or a
// free, whose holding it does not count toward engaging the caches
// (lockContended); unlockAside gives it back.
func (p *Pool) lockAside() {
	p.mu.lockAside()
	p.aside.Store(true)
}

func (p *Pool) unlockAside() {
	p.aside.Store(false)
	p.mu.Unlock()
}

// exactClasses reports whether every request the caches would serve has
// the same block size as a size class (as the caches give it) and as
// placed by the pool (best fit rounds to 256 bytes; good fit to the size
// class): then a block allocated before the caches engage and one
// allocated after are alike, as Pool.blockSize counts them. Classes are
// 256 bytes apart up to 2^(SLLog2+9) bytes: 32 KiB with the default 64
// second-level lists per power of two. A larger MaxSize with best fit (or
// SLLog2 2 or less with the default 4 KiB) engages the caches from New.
func exactClasses(x *tlsf.Index, maxSize uint64, goodFit bool) bool {
	if goodFit {
		return true
	}
	cl := x.Classes()
	// Clamped as newCacheSet clamps it: rounding a MaxSize within 255
	// bytes of 2^64 up would wrap to 0 and skip the loop.
	for r := uint64(indexGranularity); r <= roundUp(min(maxSize, tlsf.MaxSize), indexGranularity); r += indexGranularity {
		if _, got := cl.SizeClass(r); got != r {
			return false
		}
	}
	return true
}

// When the caches engage. Caches cost memory: a block freed into one
// stays allocated in the index, so it does not merge with its free
// neighbours, and its next use lands where it lay rather than where best
// fit would put it. For one goroutine (a training loop, a C++ toolkit
// allocating from one thread) they save only the uncontended lock: on
// the development VM a single goroutine replayed resnet50 7% faster with
// them and tdnn 3% (2026-12-07, BenchmarkPoolReplay's vmm-caches
// against vmm, ten alternating runs, bench/replay-dev/2026-12-07d), while
// on the simulated H200 best fit without them reserved 0.0066, 0.0085,
// 0.0009 and 0.0008 × peak live less on deeplab, ResNet-50 inference,
// vit and bert (1.0335, 1.1424, 1.0275, 1.0028), 0.0008 more on resnet50
// (1.0203, PyTorch's expandable segments' figure to the byte) and 0.0002
// on mobilenet, the rest the same: all nine traces at or below
// expandable segments. Where goroutines contend for the pool's lock, the
// caches are what keeps small requests from queueing on it. So by
// default (CacheOptions.Eager false) a pool starts with its caches off
// and engages them, for good, once the lock is
// contended: contentionEngage acquisitions on the alloc and free paths
// found it held by another alloc or free within contentionWindow locked
// operations. Work that is neither (Stats, Check, Size, Trim, Snapshot,
// ResetPeaks, the scavenger, which may hold the lock for milliseconds
// when the device runs low) takes the lock with lockAside and does not
// count; two goroutines allocating at once reach the count within
// microseconds.
const (
	contentionEngage = 8
	contentionWindow = 4096
)

// lockContended takes the pool's lock after a TryLock on the alloc or
// free path found it held, and counts the contention toward engaging the
// caches, unless the holder was lockAside's.
func (p *Pool) lockContended() {
	aside := p.aside.Load()
	if testHookContended != nil {
		testHookContended()
	}
	p.mu.lockContended()
	c := p.cache
	if c == nil || c.engaged() || aside {
		return
	}
	ops := p.c.allocs + p.c.frees
	if ops-p.contendedSince > contentionWindow {
		p.contendedSince, p.contended = ops, 0
	}
	if p.contended++; p.contended >= contentionEngage {
		c.engage()
		if testHookEngaged != nil {
			testHookEngaged()
		}
	}
}

// alloc pops a block of size's class from the current P's cache.
func (c *cacheSet) alloc(size uint64) (uintptr, bool) {
	class, r := c.classes.SizeClass(size)
	pid := procPin()
	if pid >= len(c.ps) {
		procUnpin()
		return 0, false
	}
	pc := &c.ps[pid]
	if !pc.ownerLock() {
		procUnpin()
		return 0, false
	}
	st := pc.stacks[class]
	n := len(st)
	if n == 0 {
		pc.unlock()
		procUnpin()
		return 0, false
	}
	addr := st[n-1]
	pc.stacks[class] = st[:n-1]
	pc.live.Put(addr, liveEntry(r, class))
	pc.stackBytes -= r
	pc.stackBlocks--
	pc.liveBytes += r
	pc.liveBlocks++
	pc.allocs++
	pc.bySize[sizeBucket(r)]++
	pc.unlock()
	procUnpin()
	return uintptr(addr), true
}

// free pushes ptr on the current P's cache if that cache handed it out.
// It reports false when it did not (the caller takes the locked path).
func (c *cacheSet) free(ptr uintptr) bool {
	pid := procPin()
	if pid >= len(c.ps) {
		procUnpin()
		return false
	}
	pc := &c.ps[pid]
	if !pc.ownerLock() {
		procUnpin()
		return false
	}
	v, ok := pc.live.Take(uint64(ptr))
	if !ok {
		pc.unlock()
		procUnpin()
		return false
	}
	r, class := unpackLive(v)
	pc.push(class, uint64(ptr))
	pc.liveBytes -= r
	pc.liveBlocks--
	pc.stackBytes += r
	pc.stackBlocks++
	pc.frees++
	over := pc.stackBytes > c.share.Load()
	last := pc.lastOut(c.p.mayEmpty.Load()) // perhaps the pool's last live block
	pc.unlock()
	procUnpin()
	if over || last {
		if last && testHookLastFree != nil {
			testHookLastFree()
		}
		c.p.mu.Lock()
		if !c.p.closed && over {
			c.shed(pid)
		}
		if last {
			c.p.startOver()
		}
		c.p.mu.Unlock()
	}
	return true
}

// markBlocker scans every P's cache for blocks it handed out that are
// live, marks the first P found holding some as the blocker (clearing the
// mark of every other), and reports whether it found one. Pool lock held.
func (c *cacheSet) markBlocker() bool {
	found := false
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		pc.blocker = !found && pc.liveBlocks > 0
		found = found || pc.blocker
		pc.unlock()
		if testHookScannedP != nil {
			testHookScannedP(i)
		}
	}
	return found
}

// lastOut reports whether the cache, whose table of handed-out blocks
// may just have lost one, is to look for a start-over, mayEmpty being m:
// its table is empty and m names every P or this one. Cache lock held.
func (pc *pcache) lastOut(m uint32) bool {
	return pc.liveBlocks == 0 && (m == emptyAny || m == emptyBlocker && pc.blocker)
}

// Test hooks, nil outside tests: testHookScannedP runs in markBlocker
// after P i's cache was scanned (its lock released); testHookLastFree in
// cacheSet.free when a P's last handed-out block came back, before it
// takes the pool's lock; testHookContended in lockContended before it
// waits, and testHookEngaged when the caches engage. These paths are
// rare.
var (
	testHookScannedP  func(i int)
	testHookLastFree  func()
	testHookEngaged   func()
	testHookContended func()
)

// refillLocked serves a request of size bytes that the current P's cache
// could not: it allocates a batch of blocks of its class from the index
// (growing the heap if needed, for the first one only), hands out the
// first and stacks the rest on the current P's cache. Pool lock held.
//
// The batch is allocated before the goroutine pins itself to its P: the
// allocation may reach the driver and the out-of-memory path, and a
// pinned goroutine must not wait that long. Once pinned, it takes its
// cache's lock with lockWait, which never waits here: every other holder
// of a cache's lock but its owner's fast path holds the pool's lock
// first, which this goroutine holds, and the owner's fast path runs on
// this P, where this goroutine is pinned.
func (c *cacheSet) refillLocked(size uint64) (uintptr, error) {
	p := c.p
	if p.closed {
		return 0, ErrClosed
	}
	p.full.reqs++
	p.asked = size // for the hook and the error, which see the class size r
	defer func() { p.asked = 0 }()
	pid := procPin()
	procUnpin()
	class, r := c.classes.SizeClass(size)
	if pid >= len(c.ps) { // GOMAXPROCS grew after New: no cache for this P
		// The class size r, as a cached block: Pool.blockSize counts it so.
		return p.allocLocked(r, 0, 0)
	}
	c.refills++
	if c.refills%idleScanEvery == 0 {
		// An idle cache adopted may hold the class: its newest block
		// first, as that cache would have served it.
		if c.drainIdle(pid) {
			if ptr, ok := c.alloc(size); ok {
				return ptr, nil
			}
		}
	}
	want := int(min(max(refillBytes/r, 1), maxRefill))
	batch := c.takeCentral(class, want, r)
	if len(batch) == 0 {
		batch = c.steal(pid, class, want, r)
	}
	if len(batch) == 0 {
		// The class size r, not size: cached blocks of a class are alike.
		b, reused, err := p.allocBlock(r, 0, 0)
		if err != nil {
			return 0, err
		}
		if reused { // it was pending on the default stream
			p.unpend(b)
			p.c.active -= b.Size
		}
		// The batch's scratch space only now: the allocation may have run
		// the OnOutOfMemory hook with the pool's lock released.
		batch = append(c.batch[:0], b)
		for len(batch) < want {
			nb, err := p.search(r, 0) // existing space only: no growth
			if err != nil {
				break
			}
			batch = append(batch, nb)
		}
		for _, nb := range batch {
			c.sysBytes += nb.Size
			c.sysBlocks++
			c.markSmall(nb)
		}
		p.notePeaks()
	}
	b := batch[0]
	c.batch = batch[:0] // keep its capacity; the pool's lock stays held below
	c.updateShare()

	pid = procPin()
	if pid >= len(c.ps) { // moved to a P without a cache meanwhile
		procUnpin()
		for _, nb := range batch[1:] {
			p.setState(nb, stateCached)
			_ = c.giveBack(nb.Addr, true)
		}
		c.sysBytes -= b.Size
		c.sysBlocks--
		p.noteAlloc(b, false)
		return uintptr(b.Addr), nil
	}
	for _, nb := range batch {
		p.setState(nb, stateCached)
		p.setOwner(nb, uint32(pid))
	}
	pc := &c.ps[pid]
	pc.lockWait()
	for _, nb := range batch[1:] {
		pc.push(class, nb.Addr)
		pc.stackBytes += nb.Size
		pc.stackBlocks++
	}
	pc.live.Put(b.Addr, liveEntry(b.Size, class))
	pc.liveBytes += b.Size
	pc.liveBlocks++
	pc.allocs++
	pc.bySize[sizeBucket(b.Size)]++
	over := pc.stackBytes > c.share.Load()
	pc.unlock()
	procUnpin()
	if over {
		c.shed(pid)
	}
	return uintptr(b.Addr), nil
}

// reclaimOthers gives the current P's cache the stacks of the caches of
// Ps that neither allocated nor freed since the last idle scan
// (adoptIdle; beyond its share, it sheds down to half of it), then gives the
// index back every block on the central lists, and reports whether it
// gave any (c may be nil: caches off; not engaged, no block was ever
// cached, and it scans nothing). The caches of the current P and
// of Ps active since the scan are left alone: their blocks are where
// their next requests go, and emptying them would only move them to new
// places. Keeping every recently active P's cache, not only the current
// one's, makes the outcome the same whether a goroutine stayed on its P
// or moved to another since the scan (which its blocks then still sit
// on): lstm on the simulated H200 peaked at 1.142 × live, and at 1.27 or
// 1.35 in about one run in ten at GOMAXPROCS 16, when only the current
// P's cache was kept; and adopting the idle ones, rather than giving
// their blocks to the index, makes it the same for a goroutine that
// moved before the scan (adoptIdle has the figures). Where the current P
// has no cache (GOMAXPROCS grew after New), the idle caches' blocks go
// back to the index. Pool lock held.
func (c *cacheSet) reclaimOthers() bool {
	if c == nil || !c.engaged() {
		return false
	}
	self := procPin()
	procUnpin()
	return c.reclaimOthersOn(self)
}

// reclaimOthersOn is reclaimOthers with the current P given (tests name
// it, so that a migration cannot change it midway).
func (c *cacheSet) reclaimOthersOn(self int) bool {
	if self < len(c.ps) {
		for i := range c.ps {
			if i != self {
				c.adoptIdle(self, i) // if idle since the scan
			}
		}
		c.shedOver(self)
	}
	out := c.takeAll(func(i int, pc *pcache) bool { return i == self || pc.allocs+pc.frees != pc.seen })
	for _, a := range out {
		_ = c.giveBack(a, true)
	}
	return len(out) > 0
}

// takeAll empties the stacks of every P's cache but those keep reports
// (nil: none; called with the cache's lock held) and the central lists,
// and returns the addresses of the blocks they held, still counted cached
// (sysBytes, sysBlocks) for giveBack to settle. Pool lock held.
func (c *cacheSet) takeAll(keep func(i int, pc *pcache) bool) []uint64 {
	var out []uint64
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		if keep != nil && keep(i, pc) {
			pc.unlock()
			continue
		}
		for class, st := range pc.stacks {
			out = append(out, st...)
			pc.stacks[class] = st[:0]
		}
		pc.stackBytes, pc.stackBlocks = 0, 0
		pc.unlock()
	}
	for class, l := range c.central {
		for _, cb := range l {
			out = append(out, cb.addr)
		}
		c.central[class] = l[:0]
	}
	c.centralBytes, c.centralBlocks = 0, 0
	return out
}

// updateShare recomputes each P's share of the cache budget. Pool lock
// held.
func (c *cacheSet) updateShare() {
	budget := uint64(c.fraction * float64(c.p.reserved()))
	// Store only a change: every P reads share on every free. The central
	// lists hold one share too: len(ps)+1 shares in all.
	if share := max(budget/uint64(len(c.ps)+1), minShare); share != c.share.Load() {
		c.share.Store(share)
	}
}

// shed gives blocks of P pid's cache back to the index until it holds
// half its share, those of the largest classes first (the fewest blocks
// for the bytes), the oldest of each class first. Pool lock held.
func (c *cacheSet) shed(pid int) {
	c.updateShare()
	pc := &c.ps[pid]
	pc.lockWait()
	target := c.share.Load() / 2
	out := c.addrs[:0]
	for class := len(pc.stacks) - 1; class >= 0 && pc.stackBytes > target; class-- {
		st := pc.stacks[class]
		if len(st) == 0 {
			continue
		}
		r := c.classes.Size(class)
		k := 0
		for k < len(st) && pc.stackBytes > target {
			pc.stackBytes -= r
			pc.stackBlocks--
			out = append(out, st[k])
			k++
		}
		pc.stacks[class] = append(st[:0], st[k:]...)
	}
	pc.unlock()
	c.toCentral(out)
	c.addrs = out[:0]
}

// toCentral puts blocks that left a cache's stack on the central lists,
// then gives the oldest back to the index while the lists hold more than
// one P's share. Pool lock held.
func (c *cacheSet) toCentral(addrs []uint64) {
	p := c.p
	for _, a := range addrs {
		b, err := p.x.Lookup(a)
		if err != nil {
			continue // not reached: cached blocks are allocated in the index
		}
		class, _ := c.classes.SizeClass(b.Size)
		c.central[class] = append(c.central[class], cblock{a, b.ID})
		p.setOwner(b, centralOwner)
		c.centralBytes += b.Size
		c.centralBlocks++
	}
	limit := c.share.Load()
	for class := len(c.central) - 1; class >= 0 && c.centralBytes > limit; class-- {
		l := c.central[class]
		r := c.classes.Size(class)
		k := 0
		for k < len(l) && c.centralBytes > limit {
			c.centralBytes -= r
			c.centralBlocks--
			k++
		}
		for _, cb := range l[:k] {
			_ = c.giveBack(cb.addr, true)
		}
		c.central[class] = l[:copy(l, l[k:])]
	}
}

// takeCentral takes up to n blocks of class (r bytes each) from its
// central list, the newest first (the most likely still in the GPU's
// caches), in c.batch. Pool lock held.
func (c *cacheSet) takeCentral(class, n int, r uint64) []tlsf.Block {
	l := c.central[class]
	k := min(n, len(l))
	if k == 0 {
		return nil
	}
	// The newest first, handed out now; the others in list order, so
	// that the refill's pushes leave the next newest on top of the stack
	// (refillLocked).
	taken := l[len(l)-k:]
	out := append(c.batch[:0], tlsf.Block{Addr: taken[k-1].addr, Size: r, ID: taken[k-1].id})
	for _, cb := range taken[:k-1] {
		out = append(out, tlsf.Block{Addr: cb.addr, Size: r, ID: cb.id})
	}
	c.central[class] = l[:len(l)-k]
	c.centralBytes -= uint64(k) * r
	c.centralBlocks -= int64(k)
	return out
}

// steal takes up to n blocks of class (r bytes each) from the stacks of
// other Ps' caches, the newest first, so that a block cached by one P is
// used before the index is cut again for another: the goroutine that
// freed them may simply have moved to this P. Without it, which P a
// goroutine ran on after a migration changed the pool's placement and
// its peak reserved (resnet50 on the simulated H200: 1.0226 at
// GOMAXPROCS 1, 1.024–1.030 at 4 to 16). It costs one spin lock per P
// per refill that the central list could not serve, held for an index
// lookup per block taken. The blocks are returned in c.batch. Pool lock
// held.
func (c *cacheSet) steal(self, class, n int, r uint64) []tlsf.Block {
	out := c.batch[:0]
	for i := range c.ps {
		if i == self || len(out) == n {
			continue
		}
		pc := &c.ps[i]
		pc.lockWait()
		st := pc.stacks[class]
		k := min(n-len(out), len(st))
		// Read under the cache's lock: its owner's next push reuses the
		// stack's array.
		for _, a := range slices.Backward(st[len(st)-k:]) {
			if b, err := c.p.x.Lookup(a); err == nil { // cached blocks are allocated in the index
				out = append(out, tlsf.Block{Addr: b.Addr, Size: r, ID: b.ID})
			}
		}
		pc.stacks[class] = st[:len(st)-k]
		pc.stackBytes -= uint64(k) * r
		pc.stackBlocks -= int64(k)
		pc.unlock()
	}
	if len(out) > 2 {
		// The newest is handed out now; the refill pushes the rest in
		// order, so the next newest goes last, on top of the stack.
		slices.Reverse(out[1:])
	}
	return out
}

// drainIdle gives P self's cache (adoptIdle) the stacks of every other
// cache whose owner neither allocated nor freed since the last scan, and
// reports whether it adopted any; where self names no P's cache (−1), it
// moves them onto the central lists instead. Pool lock held.
func (c *cacheSet) drainIdle(self int) bool {
	adopting := self >= 0 && self < len(c.ps)
	adopted := false
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		ops := pc.allocs + pc.frees
		idle := ops == pc.seen && i != self && pc.stackBlocks > 0
		pc.seen = ops
		out := c.addrs[:0]
		if idle && !adopting {
			for class, st := range pc.stacks {
				out = append(out, st...)
				pc.stacks[class] = st[:0]
			}
			pc.stackBytes, pc.stackBlocks = 0, 0
		}
		pc.unlock()
		switch {
		case idle && adopting:
			adopted = c.adoptIdle(self, i) || adopted
		case len(out) > 0:
			c.toCentral(out)
			c.addrs = out[:0]
		}
	}
	if adopted {
		c.shedOver(self)
	}
	return adopted
}

// shedOver sheds P pid's cache (shed) if it holds more than its share.
// Pool lock held.
func (c *cacheSet) shedOver(pid int) {
	pc := &c.ps[pid]
	pc.lockWait()
	over := pc.stackBytes > c.share.Load()
	pc.unlock()
	if over {
		c.shed(pid)
	}
}

// adoptIdle moves the stacks of P from's cache, idle, under those of P
// self's, class by class: from's blocks are older than self's (its
// goroutine has stopped there), so self serves its own first, then
// from's newest first, as from would have. A goroutine that moved from
// one P to another then finds its cache as it left it, and the pool
// places its blocks as if it had not moved; the caller sheds what
// passes self's share (shedOver). It adopts nothing, and reports false,
// if from's stacks are empty or its owner allocated or freed since the
// last scan (or since the caller found it idle). Each class adopted
// costs a new array (an adoption is rare: once per idle P per scan).
// Measured on the simulated device (one
// goroutine replaying each of the nine traces of the README, one cold
// and one warm replay, moved from one cache to another once at 60
// points of the trace and, at each, also moved back 1/40 of the trace
// later: 1,080 replays; 2026-12-04): 26 of them peaked above the
// unmoved replay's reserved memory (vit 1.0303 against 1.0284 in 22,
// resnet50 up to 1.0226 against 1.0195, llama-bf16 1.0628 against
// 1.0588) when the idle cache went to the central lists and to the index
// before a growth (reclaimOthers); none with it adopted. Pool lock held.
func (c *cacheSet) adoptIdle(self, from int) bool {
	pc := &c.ps[from]
	pc.lockWait()
	if pc.allocs+pc.frees != pc.seen || pc.stackBlocks == 0 {
		pc.unlock()
		return false
	}
	stacks := c.adopted[:0]
	for class, st := range pc.stacks {
		if len(st) > 0 {
			// The array is taken whole: the owner's next push makes a
			// new one, so it cannot write over what is copied below.
			stacks = append(stacks, adoptedStack{class, st})
			pc.stacks[class] = nil
		}
	}
	bytes, blocks := pc.stackBytes, pc.stackBlocks
	pc.stackBytes, pc.stackBlocks = 0, 0
	pc.unlock()
	for _, a := range stacks {
		for _, addr := range a.addrs {
			if b, err := c.p.x.Lookup(addr); err == nil { // cached blocks are allocated in the index
				c.p.setOwner(b, uint32(self))
			}
		}
	}
	me := &c.ps[self]
	me.lockWait()
	for _, a := range stacks {
		mine := me.stacks[a.class]
		st := make([]uint64, 0, max(8, len(a.addrs)+len(mine))) // at least push's 8: no two Ps' stacks on one cache line
		me.stacks[a.class] = append(append(st, a.addrs...), mine...)
	}
	me.stackBytes += bytes
	me.stackBlocks += blocks
	me.unlock()
	clear(stacks) // drop the idle cache's old arrays
	c.adopted = stacks[:0]
	return true
}

// giveBack returns a block that left a cache's stack to the index (or, in
// multi-stream mode, to the default stream's pending set). Pool lock held.
// If the driver can neither record the free's event nor synchronize the
// default stream, the block cannot go back yet; with keep it goes back on
// a cache's stack instead (it was freed on the default stream, so any
// cache may serve it), and the error is returned either way.
func (c *cacheSet) giveBack(addr uint64, keep bool) error {
	p := c.p
	b, err := p.x.Lookup(addr)
	if err != nil {
		return nil // not reached: cached blocks are allocated in the index
	}
	c.sysBytes -= b.Size
	c.sysBlocks--
	p.setState(b, 0)
	p.setRed(b.ID, 0) // a cached block has no red zone of its own, whatever it had live
	err = p.releaseFreed(b, 0)
	if err == nil || !keep {
		return err
	}
	p.setState(b, stateCached)
	p.setOwner(b, 0)
	c.sysBytes += b.Size
	c.sysBlocks++
	class, _ := c.classes.SizeClass(b.Size)
	pc := &c.ps[0]
	pc.lockWait()
	pc.push(class, addr)
	pc.stackBytes += b.Size
	pc.stackBlocks++
	pc.unlock()
	return err
}

// drainLocked empties every cache's stacks into the index: the
// out-of-memory path, Trim and Close. With keep, blocks that cannot go
// back stay cached (see giveBack); without (Close), they are dropped. It
// returns the first error. Caches that never engaged hold nothing, and
// it walks no P. Pool lock held.
func (c *cacheSet) drainLocked(keep bool) error {
	if !c.engaged() {
		return nil
	}
	var first error
	for _, a := range c.takeAll(nil) {
		if err := c.giveBack(a, keep); err != nil && first == nil {
			first = err
		}
	}
	return first
}

// takeLive removes block b, cached in the index's view, from the table of
// blocks its cache handed out, and reports whether the block was there
// (ok; the locked path of a free from another P, or one that met a busy
// cache) and whether the pool is to look for a start-over (last, as
// pcache.lastOut). A block in the caches is either on its owner's stack
// or in its owner's table: if not in the table, it was freed already.
// Pool lock held.
func (c *cacheSet) takeLive(b tlsf.Block) (ok, last bool) {
	owner := c.p.owner(b)
	if int(owner) >= len(c.ps) {
		return false, false
	}
	pc := &c.ps[owner]
	pc.lockWait()
	_, ok = pc.live.Take(b.Addr)
	if ok {
		pc.liveBytes -= b.Size
		pc.liveBlocks--
		last = pc.lastOut(c.p.mayEmpty.Load())
	}
	pc.unlock()
	return ok, last
}

// adopt stacks block b, just taken from another P's table by takeLive and
// freed on the default stream, on the current P's cache, which becomes its
// owner, and reports whether it could (this P has a cache). A goroutine
// that frees what another allocated then keeps serving itself. Pool lock
// held.
func (c *cacheSet) adopt(b tlsf.Block) bool {
	pid := procPin()
	if pid >= len(c.ps) {
		procUnpin()
		return false
	}
	class, _ := c.classes.SizeClass(b.Size)
	pc := &c.ps[pid]
	pc.lockWait() // never waits: see refillLocked
	pc.push(class, b.Addr)
	pc.stackBytes += b.Size
	pc.stackBlocks++
	pc.frees++
	over := pc.stackBytes > c.share.Load()
	pc.unlock()
	procUnpin()
	c.p.setOwner(b, uint32(pid))
	if over {
		c.shed(pid)
	}
	return true
}

// forget empties every cache, stacks and tables (Close: the memory goes
// back with the heap, and later calls take the locked path and see
// ErrClosed). Pool lock held.
func (c *cacheSet) forget() {
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		for class := range pc.stacks {
			pc.stacks[class] = nil
		}
		pc.live.Init(8)
		pc.stackBytes, pc.stackBlocks = 0, 0
		pc.liveBytes, pc.liveBlocks = 0, 0
		pc.unlock()
	}
	for class := range c.central {
		c.central[class] = nil
	}
	c.centralBytes, c.centralBlocks = 0, 0
	c.sysBytes, c.sysBlocks = 0, 0
}

// sum returns f summed over the Ps' caches, each read under its lock; 0
// for caches that never engaged (they hold nothing) or none (c nil). Pool
// lock held.
func (c *cacheSet) sum(f func(pc *pcache) uint64) uint64 {
	if c == nil || !c.engaged() {
		return 0
	}
	var n uint64
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		n += f(pc)
		pc.unlock()
	}
	return n
}

// addStats adds the caches' figures to a snapshot. Pool lock held.
func (c *cacheSet) addStats(ctr *counters, s *Stats) {
	s.Cached += c.centralBytes
	s.CachedBlocks += c.centralBlocks
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		s.Cached += pc.stackBytes
		s.CachedBlocks += pc.stackBlocks
		ctr.allocated += pc.liveBytes
		ctr.active += pc.liveBytes
		ctr.allocations += pc.liveBlocks
		ctr.allocs += pc.allocs
		ctr.frees += pc.frees
		for i, n := range pc.bySize {
			ctr.bySize[i] += n
		}
		pc.unlock()
	}
}

// check verifies that every block of a cache is cached in the index's
// view, and that the caches hold what the pool gave them. Pool lock held.
func (c *cacheSet) check() error {
	var bytes uint64
	var blocks int64
	var bad error
	seen := map[uint64]bool{}
	visit := func(owner int, addr, size uint64) { // owner: a P, or centralOwner
		b, err := c.p.x.Lookup(addr)
		switch {
		case err != nil:
			bad = fmt.Errorf("pool: cached block %#x: %w", addr, err)
		case b.Size != size:
			bad = fmt.Errorf("pool: cached block %#x has %d bytes, the cache says %d", addr, b.Size, size)
		case c.p.state(b.ID) != stateCached:
			bad = fmt.Errorf("pool: cached block %#x in state %d", addr, c.p.state(b.ID))
		case c.p.owner(b) != uint32(owner): // centralOwner converts back
			bad = fmt.Errorf("pool: block %#x in cache %d records owner %d", addr, owner, c.p.owner(b))
		case seen[addr]:
			bad = fmt.Errorf("pool: block %#x held twice by caches", addr)
		case !c.maybeCached(uintptr(addr)):
			bad = fmt.Errorf("pool: cached block %#x is missing from the small-block filter", addr)
		}
		seen[addr] = true
		bytes += size
		blocks++
	}
	for i := range c.ps {
		pc := &c.ps[i]
		pc.lockWait()
		var sb, lb uint64
		for class, st := range pc.stacks {
			for _, a := range st {
				r := c.classes.Size(class)
				sb += r
				visit(i, a, r)
			}
		}
		pc.live.All(func(a, v uint64) bool {
			r, class := unpackLive(v)
			if want, _ := c.classes.SizeClass(r); want != class {
				bad = fmt.Errorf("pool: block %#x of %d bytes recorded in class %d, not %d", a, r, class, want)
			}
			lb += r
			visit(i, a, r)
			return true
		})
		if sb != pc.stackBytes || lb != pc.liveBytes {
			bad = fmt.Errorf("pool: cache %d holds %d/%d bytes (stacks/handed out), counts %d/%d", i, sb, lb, pc.stackBytes, pc.liveBytes)
		}
		pc.unlock()
	}
	var cb uint64
	var cn int64
	for class, l := range c.central {
		r := c.classes.Size(class)
		for _, e := range l {
			cb += r
			cn++
			visit(int(centralOwner), e.addr, r)
			if b, err := c.p.x.Lookup(e.addr); err == nil && b.ID != e.id {
				bad = fmt.Errorf("pool: central block %#x records ID %d, the index %d", e.addr, e.id, b.ID)
			}
		}
	}
	if cb != c.centralBytes || cn != c.centralBlocks {
		bad = fmt.Errorf("pool: central lists hold %d bytes in %d blocks, count %d in %d", cb, cn, c.centralBytes, c.centralBlocks)
	}
	if bad == nil && (bytes != c.sysBytes || blocks != c.sysBlocks) {
		bad = fmt.Errorf("pool: caches hold %d bytes in %d blocks, the pool gave them %d in %d", bytes, blocks, c.sysBytes, c.sysBlocks)
	}
	return bad
}
