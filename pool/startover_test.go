package pool

// A VMM pool whose every block is freed starts over (startOver): its pages
// stay mapped on standby and the next growths take them back bottom-up,
// as a new pool's growths mapped them, with no driver call.

import (
	"math/rand/v2"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// startOverRun allocates and frees blocks of 8 KiB to 24 MiB from a fixed
// seed, then frees what is left, and returns the pointers in order.
func startOverRun(t *testing.T, p *Pool, d testDevice) []uintptr {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 11))
	var out, live []uintptr
	for range 400 {
		if len(live) > 0 && r.IntN(3) == 0 {
			k := r.IntN(len(live))
			require.NoError(t, p.Free(live[k]))
			live = append(live[:k], live[k+1:]...)
			continue
		}
		ptr, err := p.Alloc(8<<10 + r.Uint64N(24<<20))
		require.NoError(t, err)
		out = append(out, ptr)
		live = append(live, ptr)
	}
	for _, ptr := range live {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
	return out
}

func TestAPoolWhoseBlocksAreAllFreedStartsOver(t *testing.T) {
	for _, cm := range cacheModes {
		t.Run(cm.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
			p := openPool(t, d, Options{Cache: cm.opts()})
			first := startOverRun(t, p, d)
			s := p.Stats()
			require.Zero(t, s.Allocated)
			require.Positive(t, s.Reserved)
			require.Equal(t, s.Reserved, s.IndexFree, "standby pages count as free")
			require.Equal(t, s.Reserved, s.LargestFree)
			require.Zero(t, s.Fragmentation)
			require.Equal(t, 1, s.FreeBlocks)
			require.Equal(t, s.Reserved/p.vmm.gran, p.vmm.standby)

			snap, err := p.Snapshot()
			require.NoError(t, err)
			var segs, blocks uint64
			for _, sg := range snap.Segments {
				segs += sg.Size
				for _, b := range sg.Blocks {
					blocks += b.Size
				}
			}
			require.Equal(t, s.Reserved, segs)
			require.Equal(t, s.Reserved, blocks, "the segments' blocks cover them")

			// The same run again: the same blocks, and no driver call.
			second := startOverRun(t, p, d)
			require.Equal(t, first, second)
			after := p.Stats()
			require.Equal(t, s.DeviceCalls.Total(), after.DeviceCalls.Total())
			require.Equal(t, s.Reserved, after.ReservedPeak)
		})
	}
}

func TestADoubleFreeAfterStartingOverIsReported(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
	p := openPool(t, d, Options{Cache: CacheOptions{Eager: true}})
	a, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Free(b))
	require.Positive(t, p.vmm.standby)
	before := p.Stats()
	require.ErrorIs(t, p.Free(b), ErrDoubleFree)
	require.ErrorIs(t, p.Free(a), ErrDoubleFree)
	require.Equal(t, before, p.Stats())
	checkStep(t, p, d)
}

func TestALiveBlockKeepsThePoolFromStartingOver(t *testing.T) {
	for _, size := range []uint64{4 * kiB, 8 * miB} { // cached, and the pool's own
		d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
		p := openPool(t, d, Options{Cache: CacheOptions{Eager: true}})
		keep, err := p.Alloc(size)
		require.NoError(t, err)
		startOverRun(t, p, d)
		require.Zero(t, p.vmm.standby)
		require.NoError(t, p.Free(keep))
		require.Positive(t, p.vmm.standby, "the last free starts over")
		checkStep(t, p, d)
	}
}

// onePPool returns a VMM pool with caches on the simulated device and
// sets GOMAXPROCS to 1 for the test: every goroutine runs on P 0.
func onePPool(t *testing.T) (*Pool, testDevice) {
	prev := runtime.GOMAXPROCS(1)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
	p := openPool(t, d, Options{Cache: CacheOptions{Eager: true}})
	require.NotNil(t, p.cache)
	return p, d
}

// duringScanOfP0 makes the next scan of the caches by startOver
// (markBlocker) run f in a new goroutine right after P 0's cache was
// scanned, its lock released (testHookScannedP), and wait there until f
// returned or waiting was closed (nil: never). The returned channel is
// closed when f returned; started reports whether the scan ran f.
func duringScanOfP0(t *testing.T, f func(), waiting <-chan struct{}) (done <-chan struct{}, started func() bool) {
	d := make(chan struct{})
	ran := false
	testHookScannedP = func(i int) {
		if i != 0 || ran {
			return
		}
		ran = true
		go func() {
			defer close(d)
			f()
		}()
		select {
		case <-d:
		case <-waiting:
		case <-time.After(time.Minute):
			t.Error("the goroutine run during the scan neither returned nor waited for the pool's lock")
		}
	}
	t.Cleanup(func() { testHookScannedP = nil })
	return d, func() bool { return ran }
}

// A cache free on a P that startOver's scan of the caches (markBlocker)
// has passed, of that P's last handed-out block, still starts the pool
// over: the scan saw the block live, and the free must see mayEmpty set.
// The free runs inside the scan, right after P 0's cache was scanned, and
// the scan waits until it returned or waits for the pool's lock
// (testHookLastFree), which the scan's caller holds.
func TestACacheFreeDuringTheScanLetsThePoolStartOver(t *testing.T) {
	p, d := onePPool(t)
	s, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	require.Equal(t, int64(1), p.cache.ps[0].liveBlocks, "s is handed out by P 0's cache")
	l, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.Equal(t, int64(1), p.cache.ps[0].liveBlocks, "l is the pool's own")
	require.Zero(t, p.vmm.standby)

	waiting := make(chan struct{}) // the free of s waits for the pool's lock
	var once sync.Once
	testHookLastFree = func() { once.Do(func() { close(waiting) }) }
	t.Cleanup(func() { testHookLastFree = nil })
	var freeErr error
	done, started := duringScanOfP0(t, func() { freeErr = p.Free(s) }, waiting)

	require.NoError(t, p.Free(l)) // starts over as far as the caches let it: the scan
	<-done
	require.True(t, started(), "the free of l scanned the caches")
	require.NoError(t, freeErr)
	require.Zero(t, p.Stats().Allocations)
	require.Positive(t, p.vmm.standby, "the free of s, the last live block, starts the pool over")
	checkStep(t, p, d)
}

// A block taken from the stack of a P that startOver's scan has passed
// (a cache alloc takes no pool lock) keeps the heap from starting over at
// that free; when it comes back, its free starts the pool over: mayEmpty
// stays set until the heap started over. The alloc runs inside the scan,
// right after P 0's cache was scanned.
func TestABlockTakenDuringTheScanStartsThePoolOverWhenFreed(t *testing.T) {
	p, d := onePPool(t)
	s, err := p.Alloc(4 * kiB) // a refill: s and more 4 KiB blocks on P 0's stack
	require.NoError(t, err)
	l, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(s)) // back on P 0's stack
	require.Positive(t, p.cache.ps[0].stackBlocks)

	var q uintptr
	var allocErr error
	done, started := duringScanOfP0(t, func() { q, allocErr = p.Alloc(4 * kiB) }, nil)

	require.NoError(t, p.Free(l)) // the scan, during which q is taken
	<-done
	require.True(t, started(), "the free of l scanned the caches")
	require.NoError(t, allocErr)
	require.Zero(t, p.vmm.standby, "q is live: no start-over yet")
	checkStep(t, p, d)

	require.NoError(t, p.Free(q))
	require.Zero(t, p.Stats().Allocations)
	require.Positive(t, p.vmm.standby, "the free of q, the last live block, starts the pool over")
	checkStep(t, p, d)
}

func TestTrimReturnsStandbyPages(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
	p := openPool(t, d, Options{Cache: CacheOptions{Eager: true}})
	startOverRun(t, p, d)
	reserved := p.Stats().Reserved
	require.Positive(t, p.vmm.standby)
	n, err := p.Trim()
	require.NoError(t, err)
	require.Equal(t, reserved, n)
	require.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
	// And the pool still serves.
	ptr, err := p.Alloc(64 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(ptr))
	checkStep(t, p, d)
}

// Once startOver's scan found a P holding handed-out blocks (the
// blocker), the frees that empty another P's table take no pool lock to
// look for a start-over (testHookLastFree does not run): they cannot
// leave the pool empty. The blocker's last free does, and starts the pool
// over. The pool has caches for two Ps, and every goroutine runs on P 0;
// the held block is moved to P 1's table, as if allocated there.
func TestOnlyTheBlockersLastFreeLooksForAStartOver(t *testing.T) {
	p, d, _ := twoPPool(t)
	held, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	moveToP1(t, p, held)
	checkStep(t, p, d)

	looked := 0
	testHookLastFree = func() { looked++ }
	t.Cleanup(func() { testHookLastFree = nil })
	l, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(l)) // the scan: P 1 is the blocker
	require.Equal(t, emptyBlocker, p.mayEmpty.Load())
	require.Zero(t, p.vmm.standby, "held is live: no start-over")
	for range 100 {
		s, err := p.Alloc(4 * kiB)
		require.NoError(t, err)
		require.NoError(t, p.Free(s)) // empties P 0's table
	}
	require.Zero(t, looked, "P 0's frees looked for a start-over")
	checkStep(t, p, d)

	require.NoError(t, p.Free(held)) // from P 0: the locked path, P 1's table emptied
	require.Positive(t, p.vmm.standby, "the blocker's last free starts the pool over")
	require.Equal(t, emptyNo, p.mayEmpty.Load())
	checkStep(t, p, d)
}

// A blocker that gives its last block up while the pool cannot start over
// (here RecordStream takes it, and its free leaves it pending on another
// stream) is forgotten: once nothing is pending, the next free that
// empties any P's table starts the pool over.
func TestABlockerLeftEmptyWhileAFreeIsPendingIsForgotten(t *testing.T) {
	p, d, sd := twoPPool(t)
	ss := newStreams(t, sd, 1)
	held, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	moveToP1(t, p, held)
	l, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(l)) // the scan: P 1 is the blocker
	require.Equal(t, emptyBlocker, p.mayEmpty.Load())
	require.NoError(t, p.RecordStream(held, ss[0])) // P 1's table empties
	require.NoError(t, p.Free(held))                // pending: no start-over yet
	require.Equal(t, int64(1), p.Stats().PendingBlocks)
	require.Equal(t, emptyAny, p.mayEmpty.Load())
	p.mu.Lock()
	require.NoError(t, p.pollPending(true))
	p.mu.Unlock()
	require.Zero(t, p.Stats().PendingBlocks)
	require.Zero(t, p.vmm.standby)

	s, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	require.NoError(t, p.Free(s)) // P 0's table empties: every block is free
	require.Positive(t, p.vmm.standby, "the pool starts over")
	checkStep(t, p, d)
}

// The blocker's last free that leaves another P holding blocks makes that
// P the blocker, whose last free then starts the pool over.
func TestTheBlockersLastFreeHandsTheMarkOn(t *testing.T) {
	p, d, _ := twoPPool(t)
	mine, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	held, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	moveToP1(t, p, held)
	l, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(l))
	require.True(t, p.cache.ps[0].blocker, "the scan finds P 0 first")
	require.NoError(t, p.Free(mine)) // P 0's last, lock-free: the scan again
	require.False(t, p.cache.ps[0].blocker)
	require.True(t, p.cache.ps[1].blocker)
	require.Zero(t, p.vmm.standby)
	require.NoError(t, p.Free(held))
	require.Positive(t, p.vmm.standby, "the new blocker's last free starts the pool over")
	checkStep(t, p, d)
}

// twoPPool returns a VMM pool with caches for two Ps on the simulated
// device, and sets GOMAXPROCS to 1 for the rest of the test: every
// goroutine runs on P 0.
func twoPPool(t *testing.T) (*Pool, testDevice, *sim.Device) {
	prev := runtime.GOMAXPROCS(2)
	t.Cleanup(func() { runtime.GOMAXPROCS(prev) })
	sd := sim.New(sim.Config{Capacity: 16 * giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Cache: CacheOptions{Eager: true}})
	runtime.GOMAXPROCS(1)
	require.GreaterOrEqual(t, len(p.cache.ps), 2)
	return p, d, sd
}

// moveToP1 moves ptr, a live block handed out by P 0's cache, to P 1's
// table of handed-out blocks.
func moveToP1(t *testing.T, p *Pool, ptr uintptr) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	b, err := p.x.Lookup(uint64(ptr))
	require.NoError(t, err)
	from, to := &p.cache.ps[0], &p.cache.ps[1]
	v, ok := from.live.Take(uint64(ptr))
	require.True(t, ok, "handed out by P 0")
	from.liveBytes -= b.Size
	from.liveBlocks--
	to.live.Put(uint64(ptr), v)
	to.liveBytes += b.Size
	to.liveBlocks++
	p.setOwner(b, 1)
}

// forceStartOver starts p's heap over as startOver would without
// startOverIsNoOp: what the skip must be equivalent to.
func forceStartOver(t *testing.T, p *Pool) {
	t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	require.True(t, p.vmm.startOver(), "every block is free")
	p.mayEmpty.Store(emptyNo)
}

// A pool whose heap is no larger than its next growth would take back
// from standby does not start over: the pages would all come back at the
// next allocation, so its lone block allocated and freed in turn costs
// no RemoveRegion and AddRegion, and what follows is as in a twin pool
// that starts over after each free.
func TestAStartOverThatWouldChangeNothingIsSkipped(t *testing.T) {
	for _, cm := range cacheModes {
		t.Run(cm.name, func(t *testing.T) {
			o := Options{Cache: cm.opts()}
			d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
			p := openPool(t, d, o)
			td := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
			twin := openPool(t, td, o)
			var first uintptr
			var calls uint64
			for i := range 10 {
				ptr, err := p.Alloc(1 * miB) // above the caches' sizes
				require.NoError(t, err)
				tptr, err := twin.Alloc(1 * miB)
				require.NoError(t, err)
				if i == 0 {
					first, calls = ptr, p.Stats().DeviceCalls.Total()
				}
				require.Equal(t, first, ptr, "the same block each time")
				require.Equal(t, ptr-uintptr(p.vmm.base), tptr-uintptr(twin.vmm.base))
				require.NoError(t, p.Free(ptr))
				require.Zero(t, p.vmm.standby, "nothing on standby: no start-over")
				require.NoError(t, twin.Free(tptr))
				forceStartOver(t, twin)
				checkStep(t, p, d)
				checkStep(t, twin, td)
			}
			require.Equal(t, calls, p.Stats().DeviceCalls.Total(), "no driver call after the first growth")

			// What follows is placed as in the twin, with the same memory.
			want := startOverRun(t, twin, td)
			got := startOverRun(t, p, d)
			for i := range want {
				require.Equal(t, want[i]-uintptr(twin.vmm.base), got[i]-uintptr(p.vmm.base), "block %d placed as in the twin", i)
			}
			ws, gs := twin.Stats(), p.Stats()
			require.Equal(t, ws.Reserved, gs.Reserved)
			require.Equal(t, ws.ReservedPeak, gs.ReservedPeak)
			require.Equal(t, ws.IndexFree, gs.IndexFree)
			require.Equal(t, ws.LargestFree, gs.LargestFree)
		})
	}
}

// Standby pages are reserved memory: under a cap lowered below them
// (SetMaxBytes), a request they hold is served, as it is by a heap that
// skipped its start-over, and one they do not hold fails at once.
func TestARequestAboveALoweredCapIsServedFromStandby(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
	p := openPool(t, d, Options{Cache: CacheOptions{Disable: true}})
	first := startOverRun(t, p, d) // leaves its pages on standby
	require.NotEmpty(t, first)
	standby := p.vmm.standby * p.vmm.gran
	require.Greater(t, standby, 8*miB)
	require.NoError(t, p.SetMaxBytes(2*miB))
	calls := p.Stats().DeviceCalls.Total()

	ptr, err := p.Alloc(3 * miB)
	require.NoError(t, err, "the standby pages hold it")
	require.Equal(t, calls, p.Stats().DeviceCalls.Total(), "no driver call")
	checkStep(t, p, d)
	require.NoError(t, p.Free(ptr))

	before := p.Stats()
	_, err = p.Alloc(standby + 1*miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	after := p.Stats()
	require.Equal(t, before.Reserved, after.Reserved, "nothing released")
	require.Equal(t, calls, after.DeviceCalls.Total())
	checkStep(t, p, d)
}
