package pool

// The background scavenger (scavenge.go), driven one step at a time.

import (
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestScavengerReturnsUnusedMemoryWhenTheDeviceRunsLow(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: giB})
				d := onSim(sd)
				p := openPool(t, d, Options{Backend: be, FreeFloorFraction: 0.5, Cache: cm.opts()})
				keep, err := p.Alloc(16 * miB)
				require.NoError(t, err)
				var ptrs []uintptr
				for range 40 {
					ptr, err := p.Alloc(8 * miB)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
				}
				for range 64 {
					ptr, err := p.Alloc(64 * kiB)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
				}
				for _, ptr := range ptrs {
					require.NoError(t, p.Free(ptr))
				}
				checkStep(t, p, d)
				held := p.Stats().Reserved
				require.Greater(t, held, 300*miB)

				// Above the floor: nothing to do.
				p.mu.Lock()
				n, err := p.scavengeLocked()
				p.mu.Unlock()
				require.NoError(t, err)
				require.Zero(t, n)

				// Another process takes memory: the device falls below half.
				op := sd.NewProcess()
				other, err := op.MemAlloc(300 * miB)
				require.NoError(t, err)
				for range 64 {
					p.mu.Lock()
					_, err := p.scavengeLocked()
					p.mu.Unlock()
					require.NoError(t, err)
					checkStep(t, p, d)
				}
				free, total, err := sd.MemGetInfo()
				require.NoError(t, err)
				s := p.Stats()
				require.GreaterOrEqual(t, free, total/2, "the floor is met")
				require.Less(t, s.Reserved, held)
				require.Positive(t, s.ScavengedBytes)
				require.LessOrEqual(t, s.ScavengedBytes, s.ReleasedBytes)
				require.Equal(t, 16*miB, s.Allocated, "live memory untouched")
				require.NoError(t, op.MemFree(other))
				require.NoError(t, p.Free(keep))
				checkStep(t, p, d)
			})
		}
	}
}

func TestScavengerStepsArePaced(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, FreeFloorFraction: 0.9, MaxBytes: giB})
	var ptrs []uintptr
	for range 256 {
		ptr, err := p.Alloc(2 * miB)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
	}
	p.mu.Lock()
	n, err := p.scavengeLocked()
	p.mu.Unlock()
	require.NoError(t, err)
	require.Equal(t, uint64(scavengeStep), n, "one step returns scavengeStep of one-page handles")
	checkStep(t, p, d)
}

// The pace is in driver calls, not bytes: an uncapped pool's memory is in
// large handles, and one wake returns GiBs of it to a neighbour.
func TestScavengerReturnsLargeHandlesQuickly(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 8 * giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, FreeFloorFraction: 0.5, NoScavenger: true})
	ptrs := allocBlocks(t, p, 16, 256*miB)
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
	}
	op := sd.NewProcess()
	other, err := op.MemAlloc(3 * giB)
	require.NoError(t, err)
	before := p.Stats().DeviceCalls.Total()
	p.mu.Lock()
	n, err := p.scavengeLocked()
	p.mu.Unlock()
	require.NoError(t, err)
	calls := p.Stats().DeviceCalls.Total() - before
	assert.GreaterOrEqual(t, n, uint64(2*giB), "one wake: 2 GiB or more")
	assert.LessOrEqual(t, calls, uint64(scavengeCalls+8), "within the wake's driver calls")
	free, total, err := sd.MemGetInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free, total/2, "the floor is met")
	require.NoError(t, op.MemFree(other))
	checkStep(t, p, d)
}

func TestCloseStopsTheScavenger(t *testing.T) {
	p, err := New(sim.New(sim.Config{Capacity: giB}), Options{FreeFloorFraction: 0.1})
	require.NoError(t, err)
	require.NotNil(t, p.scav)
	require.NoError(t, p.Close())
	select {
	case <-p.scav.done:
	default:
		t.Fatal("the scavenger still runs after Close")
	}
	require.ErrorIs(t, p.Close(), ErrClosed)

	q, err := New(sim.New(sim.Config{Capacity: giB}), Options{})
	require.NoError(t, err)
	require.NotNil(t, q.scav, "IdleRelease's rule runs by default")
	require.NoError(t, q.Close())
	<-q.scav.done

	q, err = New(sim.New(sim.Config{Capacity: giB}), Options{IdleRelease: -1})
	require.NoError(t, err)
	require.Nil(t, q.scav, "no goroutine without FreeFloorFraction and IdleRelease")
	require.NoError(t, q.Close())

	q, err = New(sim.New(sim.Config{Capacity: giB}), Options{Passthrough: true})
	require.NoError(t, err)
	require.Nil(t, q.scav, "passthrough holds nothing unused")
	require.NoError(t, q.Close())

	r, err := New(sim.New(sim.Config{Capacity: giB}), Options{FreeFloorFraction: 0.1, NoScavenger: true})
	require.NoError(t, err)
	require.Nil(t, r.scav, "no goroutine with NoScavenger")
	require.NoError(t, r.Close())
}
