package pool

// IdleRelease (scavenge.go, "Idle"): an idle pool gives its unused memory
// to a process started or grown since, driven one wake at a time.

import (
	"runtime"
	"testing"
	"time"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idleContext is what each simulated process's context holds in these
// tests: more than idleOthersGrowth, as a CUDA context does.
const idleContext = 128 * miB

// idleDevice is a 1 GiB simulated GPU whose processes' contexts hold
// idleContext each.
func idleDevice() *sim.Device {
	return sim.New(sim.Config{Capacity: giB, ContextBytes: idleContext})
}

// idlePool makes a pool with o on a new idleDevice, its scavenger's
// goroutine off (the tests drive the wakes) and IdleRelease at its
// default unless o sets it (openPool turns it off).
func idlePool(t *testing.T, o Options) (*sim.Device, testDevice, *Pool) {
	t.Helper()
	sa := idleDevice()
	da := onSim(sa)
	o.NoScavenger = true
	if o.IdleRelease == 0 {
		o.IdleRelease = defaultIdleRelease
	}
	return sa, da, openPool(t, da, o)
}

// churnUnused allocates n blocks of size bytes from p and frees them: the pool
// holds them unused.
func churnUnused(t *testing.T, p *Pool, n int, size uint64) {
	t.Helper()
	for _, ptr := range allocBlocks(t, p, n, size) {
		require.NoError(t, p.Free(ptr))
	}
}

// releaseForANewcomer runs churn on a, lets it go idle, starts a newcomer
// process on sa, and runs wakes until a has returned its memory for it;
// it returns the newcomer and the time after the last wake.
func releaseForANewcomer(t *testing.T, sa *sim.Device, a *Pool, churn func()) (*sim.Device, time.Time) {
	t.Helper()
	churn()
	t0 := time.Unix(1000, 0)
	idleWake(t, a, t0)
	newcomer := sa.NewProcess()
	at := idleWakes(t, a, t0.Add(a.opts.IdleRelease), 32)
	require.Less(t, a.Stats().Reserved, 64*miB, "released for the newcomer")
	return newcomer, at
}

// idleWake runs one wake of IdleRelease's rule at time at.
func idleWake(t *testing.T, p *Pool, at time.Time) uint64 {
	t.Helper()
	p.mu.Lock()
	n, err := p.idleReleaseLocked(at)
	p.mu.Unlock()
	require.NoError(t, err)
	return n
}

// idleWakes runs k wakes, scavengePeriod apart, from at, and returns the
// time after the last.
func idleWakes(t *testing.T, p *Pool, at time.Time, k int) time.Time {
	t.Helper()
	for range k {
		idleWake(t, p, at)
		at = at.Add(scavengePeriod)
	}
	return at
}

// A job that filled most of the device and freed it, then went idle,
// gives its memory to a job started after it, with no option set; only
// once it has been idle for IdleRelease, and it keeps what it uses.
func TestAnIdlePoolGivesItsUnusedMemoryToANewcomer(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				sa, da, a := idlePool(t, Options{Backend: be, Cache: cm.opts()})
				keep, err := a.Alloc(64 * miB)
				require.NoError(t, err)
				ptrs := append(allocBlocks(t, a, 40, 16*miB), allocBlocks(t, a, 64, 4*kiB)...)
				for _, ptr := range ptrs {
					require.NoError(t, a.Free(ptr))
				}
				held := a.Stats().Reserved
				require.Greater(t, held, 700*miB)

				t0 := time.Unix(1000, 0)
				require.Zero(t, idleWake(t, a, t0), "the first wake sees the pool's activity")
				idleWakes(t, a, t0.Add(a.opts.IdleRelease), 20)
				assert.Equal(t, held, a.Stats().Reserved, "alone on the device: kept")

				sb := sa.NewProcess() // its context: others grow
				db := onSim(sb)
				b := openPool(t, db, Options{Backend: be, NoScavenger: true})
				_, err = b.Alloc(512 * miB)
				require.ErrorIs(t, err, ErrOutOfMemory, "the idle job holds the memory")

				at := idleWakes(t, a, t0.Add(a.opts.IdleRelease+time.Second), 32)
				s := a.Stats()
				assert.Less(t, s.Reserved, held/4, "the unused memory went back")
				assert.Equal(t, 64*miB, s.Allocated, "the block in use stays")
				assert.Equal(t, held-s.Reserved, s.ScavengedBytes, "counted as scavenged")
				assert.LessOrEqual(t, s.ScavengedBytes, s.ReleasedBytes)
				assert.Positive(t, s.DeviceCallsByPath[PathScavenge].Total(), "on the scavenger's path")
				checkStep(t, a, da)

				// Done: nothing returned again while others hold what they held.
				reserved := a.Stats().Reserved
				idleWakes(t, a, at, 64)
				assert.Equal(t, reserved, a.Stats().Reserved)

				ptr, err := b.Alloc(512 * miB)
				require.NoError(t, err, "the newcomer gets it")
				checkStep(t, b, db)
				require.NoError(t, b.Free(ptr))
				require.NoError(t, a.Free(keep))
				checkStep(t, a, da)
			})
		}
	}
}

// An idle pool alone on its device keeps its memory through a pause,
// however little the device has free, looking at the device once per
// idleCheckPeriod; one whose neighbour was there before it, and holds no
// more since, keeps it too (FreeFloorFraction's case).
func TestAnIdlePoolKeepsItsMemoryWhileNoOtherProcessGrows(t *testing.T) {
	for _, neighbour := range []bool{false, true} {
		sd := idleDevice()
		d := onSim(sd)
		if neighbour {
			n := sd.NewProcess()
			_, err := n.MemAlloc(64 * miB)
			require.NoError(t, err)
		}
		p := openPool(t, d, Options{Backend: BackendVMM, NoScavenger: true, IdleRelease: defaultIdleRelease})
		for _, ptr := range allocBlocks(t, p, 22, 32*miB) {
			require.NoError(t, p.Free(ptr))
		}
		held := p.Stats().Reserved
		free, _, err := sd.MemGetInfo()
		require.NoError(t, err)
		require.Less(t, free, held, "the device has less free than the pool unused")
		t0 := time.Unix(1000, 0)
		idleWake(t, p, t0)
		before := p.Stats().DeviceCalls.Total()
		idleWakes(t, p, t0.Add(p.opts.IdleRelease), int(time.Second/scavengePeriod))
		assert.Equal(t, held, p.Stats().Reserved, "neighbour %v", neighbour)
		assert.Equal(t, before+uint64(time.Second/idleCheckPeriod), p.Stats().DeviceCalls.Total(), "a cuMemGetInfo per idleCheckPeriod")
		checkStep(t, p, d)
	}
}

// Any request or free makes the pool busy again, the caches' hits and a
// failed request included: idleness restarts from the wake that sees it.
func TestAnyActivityRestartsTheIdleClock(t *testing.T) {
	for _, op := range []struct {
		name string
		do   func(t *testing.T, p *Pool, cached, big uintptr)
	}{
		{"alloc", func(t *testing.T, p *Pool, _, _ uintptr) {
			_, err := p.Alloc(miB)
			require.NoError(t, err)
		}},
		{"free", func(t *testing.T, p *Pool, _, big uintptr) {
			require.NoError(t, p.Free(big))
		}},
		{"cache hit", func(t *testing.T, p *Pool, _, _ uintptr) {
			_, err := p.Alloc(256)
			require.NoError(t, err)
		}},
		{"cached free", func(t *testing.T, p *Pool, cached, _ uintptr) {
			require.NoError(t, p.Free(cached))
		}},
		{"failed request", func(t *testing.T, p *Pool, _, _ uintptr) {
			_, err := p.Alloc(2 * giB) // above the device: fails at once, nothing released
			require.ErrorIs(t, err, ErrOutOfMemory)
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			sa, da, p := idlePool(t, Options{Backend: BackendVMM, Cache: CacheOptions{Eager: true}})
			ptrs := allocBlocks(t, p, 20, 32*miB)
			for _, ptr := range ptrs[2:] {
				require.NoError(t, p.Free(ptr))
			}
			warm, err := p.Alloc(256) // a refill: the caches hold more blocks of its class
			require.NoError(t, err)
			require.NoError(t, p.Free(warm))
			cached, err := p.Alloc(256)
			require.NoError(t, err)
			_, err = sa.NewProcess().MemAlloc(32 * miB) // a newcomer
			require.NoError(t, err)
			held := p.Stats().Reserved
			t0 := time.Unix(1000, 0)
			idleWake(t, p, t0)
			op.do(t, p, cached, ptrs[1])
			at := t0.Add(p.opts.IdleRelease)
			idleWake(t, p, at) // sees the activity
			idleWakes(t, p, at.Add(scavengePeriod), int(p.opts.IdleRelease/scavengePeriod)-2)
			assert.Equal(t, held, p.Stats().Reserved, "busy %v ago: kept", p.opts.IdleRelease-scavengePeriod)
			idleWakes(t, p, at.Add(p.opts.IdleRelease), 8)
			assert.Less(t, p.Stats().Reserved, held, "idle since: returned")
			checkStep(t, p, da)
		})
	}
}

// Frees on other streams are pending until a poll; the idle rule polls
// before it counts the pool's unused memory, and a free still pending on
// a busy stream at the release goes back once that stream is done.
func TestAnIdlePoolReturnsFreesPendingOnOtherStreams(t *testing.T) {
	sa, da, a := idlePool(t, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	keep, err := a.Alloc(miB) // the default stream: frees on others are stream-ordered
	require.NoError(t, err)
	s1, err := sa.StreamCreate()
	require.NoError(t, err)
	s2, err := sa.StreamCreate()
	require.NoError(t, err)
	p1 := make([]uintptr, 0, 16)
	for range 16 {
		ptr, err := a.AllocOn(32*miB, s1)
		require.NoError(t, err)
		p1 = append(p1, ptr)
	}
	p2 := make([]uintptr, 0, 4)
	for range 4 {
		ptr, err := a.AllocOn(32*miB, s2)
		require.NoError(t, err)
		p2 = append(p2, ptr)
	}
	require.NoError(t, sa.HoldStream(s2)) // s2 busy
	for _, ptr := range p1 {
		require.NoError(t, a.FreeOn(ptr, s1)) // fewer than pollInterval: not polled
	}
	for _, ptr := range p2 {
		require.NoError(t, a.FreeOn(ptr, s2))
	}
	require.NoError(t, sa.StreamSynchronize(s1))
	held := a.Stats().Reserved
	require.Greater(t, held, 600*miB)
	db := onSim(sa.NewProcess())
	b := openPool(t, db, Options{Backend: BackendVMM, NoScavenger: true})

	t0 := time.Unix(1000, 0)
	idleWake(t, a, t0)
	at := idleWakes(t, a, t0.Add(a.opts.IdleRelease), 32)
	s := a.Stats()
	assert.Less(t, s.Reserved, held-400*miB, "frees the GPU finished count as unused")
	assert.GreaterOrEqual(t, s.Reserved, 128*miB, "those on the busy stream stay")
	checkStep(t, a, da)
	ptr, err := b.Alloc(512 * miB)
	require.NoError(t, err, "the newcomer gets what went back")
	checkStep(t, b, db)

	require.NoError(t, sa.ReleaseStream(s2)) // s2's work completes
	idleWakes(t, a, at, 32)
	assert.Less(t, a.Stats().Reserved, 32*miB, "then the rest goes back")
	checkStep(t, a, da)
	require.NoError(t, b.Free(ptr))
	require.NoError(t, a.Free(keep))
}

// The default, a negative IdleRelease, and its configuration key.
func TestIdleReleaseOption(t *testing.T) {
	o, err := Options{}.withDefaults()
	require.NoError(t, err)
	assert.Equal(t, 500*time.Millisecond, o.IdleRelease)
	o, err = Options{IdleRelease: -1}.withDefaults()
	require.NoError(t, err)
	assert.Negative(t, o.IdleRelease)

	c, err := ParseConf("idle_release:2s")
	require.NoError(t, err)
	assert.Equal(t, 2*time.Second, c.Options.IdleRelease)
	c, err = ParseConf("idle_release:off")
	require.NoError(t, err)
	assert.Negative(t, c.Options.IdleRelease)
	c, err = ParseConf("idle_release:0")
	require.NoError(t, err)
	assert.Zero(t, c.Options.IdleRelease, "0: the default")
	for _, bad := range []string{"idle_release:-2s", "idle_release:soon", "idle_release:5"} {
		_, err := ParseConf(bad)
		assert.ErrorIs(t, err, ErrBadOptions, bad)
	}

	// Negative: the wake never looks.
	sd := idleDevice()
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, NoScavenger: true, IdleRelease: -1})
	for _, ptr := range allocBlocks(t, p, 20, 32*miB) {
		require.NoError(t, p.Free(ptr))
	}
	_, err = sd.NewProcess().MemAlloc(64 * miB)
	require.NoError(t, err)
	held, calls := p.Stats().Reserved, p.Stats().DeviceCalls
	p.mu.Lock()
	for i := range 200 {
		p.wakeLocked(time.Unix(1000, 0).Add(time.Duration(i) * scavengePeriod))
	}
	p.mu.Unlock()
	assert.Equal(t, held, p.Stats().Reserved)
	assert.Equal(t, calls, p.Stats().DeviceCalls)
}

// With the scavenger's goroutine (the default IdleRelease, which openPool
// turns off unless given), a newcomer's retries succeed once the idle
// job's memory came back.
func TestANewcomerGetsAnIdleJobsMemoryInTheBackground(t *testing.T) {
	sa := idleDevice()
	a := openPool(t, onSim(sa), Options{IdleRelease: defaultIdleRelease})
	for _, ptr := range allocBlocks(t, a, 44, 16*miB) {
		require.NoError(t, a.Free(ptr))
	}
	b := openPool(t, onSim(sa.NewProcess()), Options{})
	deadline := time.Now().Add(30 * time.Second) // a bound for a loaded machine, not a target
	var ptr uintptr
	var err error
	for time.Now().Before(deadline) {
		if ptr, err = b.Alloc(640 * miB); err == nil {
			break
		}
		require.ErrorIs(t, err, ErrOutOfMemory)
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, err)
	require.NoError(t, b.Free(ptr))
	assert.Positive(t, a.Stats().ScavengedBytes)
}

// A pool dropped without Close stops its scavenger (its goroutine holds
// the pool through a weak pointer).
func TestADroppedPoolsScavengerStops(t *testing.T) {
	p, err := New(sim.New(sim.Config{Capacity: giB}), Options{})
	require.NoError(t, err)
	sc := p.scav
	require.NotNil(t, sc)
	p = nil
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		runtime.GC()
		select {
		case <-sc.done:
			return
		case <-time.After(20 * time.Millisecond):
		}
	}
	t.Fatal("the scavenger of a dropped pool still runs")
}

// A newcomer that comes after an earlier one left is served as the first
// was: the busy pool looks at the device every idleLowPeriod, and the
// least others held falls to what they hold without the first.
func TestASecondNewcomerIsServedAfterTheFirstLeft(t *testing.T) {
	sa, da, a := idlePool(t, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	churn := func() { churnUnused(t, a, 22, 32*miB) }
	first, at := releaseForANewcomer(t, sa, a, churn)
	require.NoError(t, first.Close())
	for range 12 { // busy for eleven seconds after the first left
		churn()
		idleWake(t, a, at)
		at = at.Add(time.Second)
	}
	held := a.Stats().Reserved
	second := sa.NewProcess()
	defer func() { require.NoError(t, second.Close()) }()
	idleWakes(t, a, at.Add(a.opts.IdleRelease), 32)
	assert.Less(t, a.Stats().Reserved, held, "served the second as the first")
	checkStep(t, a, da)
}

// Wakes come a few µs early as often as not; the rule keeps its pace
// all the same: the release begins at the wake IdleRelease after the
// last activity, not one idleCheckPeriod later.
func TestWakesAFewMicrosecondsEarlyKeepThePace(t *testing.T) {
	sa, _, a := idlePool(t, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	churnUnused(t, a, 22, 32*miB)
	other := sa.NewProcess()
	defer func() { require.NoError(t, other.Close()) }()
	t0 := time.Unix(1000, 0)
	idleWake(t, a, t0)
	var first time.Duration
	for k := 1; k <= 10 && first == 0; k++ {
		at := t0.Add(time.Duration(k)*idleCheckPeriod - time.Microsecond)
		if idleWake(t, a, at) > 0 {
			first = at.Sub(t0).Round(idleCheckPeriod)
		}
	}
	assert.Equal(t, a.opts.IdleRelease, first)
}

// InitialFraction's reserve stays until the pool is first used: a pool
// that never served a request is not idle, it is waiting.
func TestAnInitialReserveStaysUntilThePoolIsUsed(t *testing.T) {
	sa, da, a := idlePool(t, Options{Backend: BackendVMM, InitialFraction: 0.8})
	held := a.Stats().Reserved
	require.Greater(t, held, 600*miB)
	other := sa.NewProcess()
	defer func() { require.NoError(t, other.Close()) }()
	t0 := time.Unix(1000, 0)
	at := idleWakes(t, a, t0, 100)
	assert.Equal(t, held, a.Stats().Reserved, "never used: kept")
	ptr, err := a.Alloc(miB)
	require.NoError(t, err)
	require.NoError(t, a.Free(ptr))
	idleWakes(t, a, at, 100)
	assert.Less(t, a.Stats().Reserved, held, "used, then idle: returned")
	checkStep(t, a, da)
}

// A neighbour that came and stays as it is gets one release: the pool,
// used again and idle again, keeps its memory (the looks it took before
// the neighbour came count no more).
func TestAStaticNeighbourGetsOneRelease(t *testing.T) {
	sa, da, a := idlePool(t, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	churn := func() { churnUnused(t, a, 12, 32*miB) }
	b, at := releaseForANewcomer(t, sa, a, churn)
	defer func() { require.NoError(t, b.Close()) }()
	churn()
	idleWake(t, a, at)
	held := a.Stats().Reserved
	idleWakes(t, a, at.Add(a.opts.IdleRelease), 100)
	assert.Equal(t, held, a.Stats().Reserved, "the neighbour holds what it held: kept")
	checkStep(t, a, da)
}
