package pool

// IdleRelease (scavenge.go, "Idle"): an idle pool gives its unused memory
// to a device that has less free, driven one wake at a time.

import (
	"testing"
	"time"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// idleWake runs one wake of IdleRelease's rule at time at.
func idleWake(t *testing.T, p *Pool, at time.Time) uint64 {
	t.Helper()
	p.mu.Lock()
	n, err := p.idleReleaseLocked(at)
	p.mu.Unlock()
	require.NoError(t, err)
	return n
}

// idleWakes runs wakes every scavengePeriod from at until one returns
// nothing after a release (or k wakes), and returns the time after the
// last.
func idleWakes(t *testing.T, p *Pool, at time.Time, k int) time.Time {
	t.Helper()
	for range k {
		idleWake(t, p, at)
		at = at.Add(scavengePeriod)
	}
	return at
}

// A job that filled the device and freed everything, then went idle,
// gives its memory to a job started after it, with no option set; only
// once it has been idle for IdleRelease, and it keeps what it uses.
func TestAnIdlePoolGivesItsUnusedMemoryToANewcomer(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				sa := sim.New(sim.Config{Capacity: giB})
				da := onSim(sa)
				a := openPool(t, da, Options{Backend: be, NoScavenger: true, Cache: cm.opts()})
				keep, err := a.Alloc(64 * miB)
				require.NoError(t, err)
				var ptrs []uintptr
				for range 48 {
					ptr, err := a.Alloc(16 * miB)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
				}
				for range 64 {
					ptr, err := a.Alloc(4 * kiB)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
				}
				for _, ptr := range ptrs {
					require.NoError(t, a.Free(ptr))
				}
				held := a.Stats().Reserved
				require.Greater(t, held, 800*miB)

				sb := sa.NewProcess()
				db := onSim(sb)
				b := openPool(t, db, Options{Backend: be, NoScavenger: true})
				_, err = b.Alloc(512 * miB)
				require.ErrorIs(t, err, ErrOutOfMemory, "the idle job holds the memory")

				t0 := time.Unix(1000, 0)
				require.Zero(t, idleWake(t, a, t0), "the first wake sees the pool's activity")
				before := a.Stats()
				require.Zero(t, idleWake(t, a, t0.Add(a.opts.IdleRelease-time.Millisecond)), "not idle long enough")
				assert.Equal(t, before.DeviceCalls, a.Stats().DeviceCalls, "no look at the device before")
				at := idleWakes(t, a, t0.Add(a.opts.IdleRelease), 16)
				s := a.Stats()
				assert.Less(t, s.Reserved, held/4, "the unused memory went back")
				assert.Equal(t, 64*miB, s.Allocated, "the block in use stays")
				assert.Equal(t, held-s.Reserved, s.ScavengedBytes, "counted as scavenged")
				assert.LessOrEqual(t, s.ScavengedBytes, s.ReleasedBytes)
				assert.Positive(t, s.DeviceCallsByPath[PathScavenge].Total(), "on the scavenger's path")
				checkStep(t, a, da)

				// Done: no more looks at the device until the pool is used.
				calls := a.Stats().DeviceCalls
				idleWakes(t, a, at, 32)
				assert.Equal(t, calls, a.Stats().DeviceCalls, "nothing more to return, no look")

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

// An idle pool alone on its device, holding less unused memory than the
// device has free, keeps it: its next request is served warm. It looks at
// the device once per idleCheckPeriod.
func TestAnIdlePoolKeepsItsMemoryWhileTheDeviceHasMoreFree(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, NoScavenger: true})
	ptrs := allocBlocks(t, p, 8, 32*miB)
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
	}
	held := p.Stats().Reserved
	require.Positive(t, held)
	t0 := time.Unix(1000, 0)
	idleWake(t, p, t0)
	before := p.Stats().DeviceCalls.Total()
	// One second of wakes: ten looks, nothing returned.
	idleWakes(t, p, t0.Add(p.opts.IdleRelease), int(time.Second/scavengePeriod))
	assert.Equal(t, held, p.Stats().Reserved)
	assert.Equal(t, before+uint64(time.Second/idleCheckPeriod), p.Stats().DeviceCalls.Total(), "a cuMemGetInfo per idleCheckPeriod")
	checkStep(t, p, d)
}

// Any request or free makes the pool busy again, the caches' included,
// and a failed request too: idleness restarts from the wake that sees it.
func TestAnyActivityRestartsTheIdleClock(t *testing.T) {
	for _, op := range []struct {
		name string
		do   func(t *testing.T, p *Pool)
	}{
		{"alloc and free", func(t *testing.T, p *Pool) {
			ptr, err := p.Alloc(miB)
			require.NoError(t, err)
			require.NoError(t, p.Free(ptr))
		}},
		{"cached alloc", func(t *testing.T, p *Pool) {
			_, err := p.Alloc(256)
			require.NoError(t, err)
		}},
		{"failed request", func(t *testing.T, p *Pool) {
			_, err := p.Alloc(2 * giB) // above the device: fails at once, nothing released
			require.ErrorIs(t, err, ErrOutOfMemory)
		}},
	} {
		t.Run(op.name, func(t *testing.T) {
			sa := sim.New(sim.Config{Capacity: giB})
			da := onSim(sa)
			p := openPool(t, da, Options{Backend: BackendVMM, NoScavenger: true, Cache: CacheOptions{Eager: true}})
			ptrs := allocBlocks(t, p, 24, 32*miB)
			for _, ptr := range ptrs[1:] {
				require.NoError(t, p.Free(ptr))
			}
			sb := sa.NewProcess()
			other, err := sb.MemAlloc(256 * miB) // the device has less free than the pool unused
			require.NoError(t, err)
			held := p.Stats().Reserved
			t0 := time.Unix(1000, 0)
			idleWake(t, p, t0)
			op.do(t, p)
			at := t0.Add(p.opts.IdleRelease)
			idleWake(t, p, at) // sees the activity
			idleWakes(t, p, at.Add(scavengePeriod), int(p.opts.IdleRelease/scavengePeriod)-2)
			assert.Equal(t, held, p.Stats().Reserved, "busy %v ago: kept", p.opts.IdleRelease-scavengePeriod)
			idleWakes(t, p, at.Add(p.opts.IdleRelease), 8)
			assert.Less(t, p.Stats().Reserved, held, "idle since: returned")
			checkStep(t, p, da)
			require.NoError(t, sb.MemFree(other))
		})
	}
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
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, NoScavenger: true, IdleRelease: -1})
	for _, ptr := range allocBlocks(t, p, 24, 32*miB) {
		require.NoError(t, p.Free(ptr))
	}
	_, err = sd.NewProcess().MemAlloc(256 * miB)
	require.NoError(t, err)
	held := p.Stats().Reserved
	p.mu.Lock()
	for i := range 200 {
		p.wakeLocked(time.Unix(1000, 0).Add(time.Duration(i) * scavengePeriod))
	}
	p.mu.Unlock()
	assert.Equal(t, held, p.Stats().Reserved)
}

// With the scavenger's goroutine and default options in both jobs (the
// default IdleRelease, which openPool turns off unless given), the
// newcomer's retries succeed once the idle job's memory came back.
func TestANewcomerGetsAnIdleJobsMemoryInTheBackground(t *testing.T) {
	sa := sim.New(sim.Config{Capacity: giB})
	a := openPool(t, onSim(sa), Options{IdleRelease: defaultIdleRelease})
	for _, ptr := range allocBlocks(t, a, 56, 16*miB) {
		require.NoError(t, a.Free(ptr))
	}
	b := openPool(t, onSim(sa.NewProcess()), Options{})
	deadline := time.Now().Add(30 * time.Second) // a bound for a loaded machine, not a target
	var ptr uintptr
	var err error
	for time.Now().Before(deadline) {
		if ptr, err = b.Alloc(768 * miB); err == nil {
			break
		}
		require.ErrorIs(t, err, ErrOutOfMemory)
		time.Sleep(5 * time.Millisecond)
	}
	require.NoError(t, err)
	require.NoError(t, b.Free(ptr))
	assert.Positive(t, a.Stats().ScavengedBytes)
}
