package pool

// Driver calls counted by the path that made them (Stats.DeviceCallsByPath).

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Each path's calls count for it, and only for it: New's for setup, a
// growth for alloc, the moves of the out-of-memory path for
// out_of_memory, Trim's for trim, the scavenger's for scavenge. By path
// they add up to the calls by kind.
func TestDriverCallsCountForThePathThatMadeThem(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: be, MaxBytes: 64 * miB, FreeFloorFraction: 0.5, NoScavenger: true, Cache: CacheOptions{Disable: true}})
			var last PathCounts
			step := func(what string, want Path) {
				t.Helper()
				checkStep(t, p, d)
				now := p.Stats().DeviceCallsByPath
				for k := range now {
					if Path(k) == want {
						assert.Greater(t, now[k].Total(), last[k].Total(), "%s: calls for %v", what, Path(k))
					} else {
						assert.Equal(t, last[k], now[k], "%s: calls for %v", what, Path(k))
					}
				}
				last = now
			}
			step("New", PathSetup)

			a, err := p.Alloc(30 * miB)
			require.NoError(t, err)
			step("a growth", PathAlloc)
			b, err := p.Alloc(20 * miB)
			require.NoError(t, err)
			require.NoError(t, p.Free(a))
			last = p.Stats().DeviceCallsByPath
			// 50 MiB mapped, 30 of them free; 40 MiB more would pass the cap:
			// the out-of-memory path returns or moves a's memory first.
			c, err := p.Alloc(40 * miB)
			require.NoError(t, err)
			require.NotZero(t, p.Stats().Retries)
			step("the out-of-memory path", PathOutOfMemory)

			require.NoError(t, p.Free(c))
			_, err = p.Trim()
			require.NoError(t, err)
			step("Trim", PathTrim)

			e, err := p.Alloc(40 * miB)
			require.NoError(t, err)
			require.NoError(t, p.Free(e))
			last = p.Stats().DeviceCallsByPath
			require.NoError(t, sd.Occupy(900*miB)) // the device runs low: below half free
			t.Cleanup(func() { sd.Vacate(900 * miB) })
			p.mu.Lock()
			n, err := p.scavengeLocked()
			p.mu.Unlock()
			require.NoError(t, err)
			require.NotZero(t, n)
			step("the scavenger", PathScavenge)
			require.NoError(t, p.Free(b))
		})
	}
}

// The OnOutOfMemory hook runs with the pool's lock released: calls made
// meanwhile (here the hook's own Trim) count for their own path, not for
// the request's out-of-memory path, which resumes after it.
func TestCallsDuringTheOutOfMemoryHookCountForTheirOwnPath(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	var p *Pool
	var atHook PathCounts
	var spare uintptr
	p = openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 64 * miB, NoScavenger: true, Cache: CacheOptions{Disable: true},
		OnOutOfMemory: func(uint64) {
			if spare != 0 {
				require.NoError(t, p.Free(spare))
				spare = 0
			}
			_, err := p.Trim()
			require.NoError(t, err)
			atHook = p.Stats().DeviceCallsByPath
		}})
	a, err := p.Alloc(30 * miB)
	require.NoError(t, err)
	spare, err = p.Alloc(20 * miB)
	require.NoError(t, err)
	before := p.Stats().DeviceCallsByPath
	c, err := p.Alloc(30 * miB) // fits only once the hook freed spare
	require.NoError(t, err)
	assert.Greater(t, atHook[PathTrim].Total(), before[PathTrim].Total(), "the hook's Trim counts for trim")
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Free(c))
}

// A few calls are made without the pool's lock (history's look at free
// memory after a failed allocation, guard mode's stream synchronization
// at a free): they count for PathOther without touching the path the
// lock guards, so Check, run meanwhile, finds no path left set, and by
// path they add up to the calls by kind.
func TestCallsOutsideTheLockCountForOther(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 64 * miB, History: 1 << 10, NoScavenger: true})
	held, err := p.Alloc(48 * miB)
	require.NoError(t, err)
	before := p.Stats()
	var wg sync.WaitGroup
	const workers, fails = 4, 500
	for range workers {
		wg.Go(func() {
			for range fails {
				_, err := p.Alloc(32 * miB)
				assert.ErrorIs(t, err, ErrOutOfMemory)
			}
		})
	}
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	for running := true; running; {
		select {
		case <-done:
			running = false
		default:
			require.NoError(t, p.Check())
		}
	}
	after := p.Stats()
	assert.Equal(t, after.DeviceCalls.Total(), after.DeviceCallsByPath.Total())
	info := device.CallMemGetInfo
	assert.GreaterOrEqual(t, after.DeviceCallsByPath[PathOther][info]-before.DeviceCallsByPath[PathOther][info], uint64(workers*fails),
		"a cuMemGetInfo per failure recorded in the history, outside the lock")
	require.NoError(t, p.Free(held))
	checkStep(t, p, d)
}

// PathCounts prints with each path's name before its counts, and only the
// paths that made calls.
func TestPathCountsString(t *testing.T) {
	var c PathCounts
	require.Equal(t, "", c.String())
	c[PathSetup][device.CallMemGetInfo] = 1
	c[PathSetup][device.CallAddressReserve] = 1
	c[PathOutOfMemory][device.CallMemMap] = 7
	require.Equal(t, "setup: cuMemGetInfo=1 cuMemAddressReserve=1; out_of_memory: cuMemMap=7", c.String())
	require.Equal(t, "setup: cuMemGetInfo=1 cuMemAddressReserve=1; out_of_memory: cuMemMap=7", fmt.Sprint(c))
}
