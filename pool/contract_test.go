package pool

// Contracts that rare paths broke (a review of 2026-12-07): each test
// failed on 9011cb8.

import (
	"errors"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// A cap lowered below a request (SetMaxBytes) refused, as hopeless, a
// request that memory the pool already held would serve: a block freed on
// another stream whose work completed (as for RecordStream's held blocks
// and other Ps' cached blocks), which the search polls for only after the
// hopeless check. Now that memory serves it (Pool.heldServes).
func TestALoweredCapServesARequestFromMemoryThePoolHolds(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			ss := newStreams(t, d, 2)
			a, b := ss[0], ss[1]
			p := openPool(t, d, Options{Backend: be, NoScavenger: true, Cache: CacheOptions{Disable: true}})
			y, err := p.AllocOn(miB, b) // a second stream: frees on a now wait for events
			require.NoError(t, err)
			x, err := p.AllocOn(32*miB, a)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, a)) // a has no work queued: reusable once polled
			res := p.Stats().Reserved

			require.NoError(t, p.SetMaxBytes(16*miB)) // below what the pool holds
			x3, err := p.AllocOn(32*miB, b)
			require.NoError(t, err, "served by memory the pool holds: no growth needed")
			require.Equal(t, res, p.Stats().Reserved)
			checkStep(t, p, d)
			require.NoError(t, p.FreeOn(x3, b))
			require.NoError(t, p.FreeOn(y, b))
		})
	}
}

// Best fit with caches serving up to 1 MiB: the caches round a request
// up to its size class, so Stats.LargestFree, the largest free block at
// 256-byte granularity, was not a request Alloc served without growing.
// It is now rounded down to a class where the caches serve it.
func TestLargestFreeIsAcceptedWhereTheCachesRoundIt(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be, MaxBytes: 2 * miB, NoScavenger: true,
				Cache: CacheOptions{Eager: true, MaxSize: miB}})
			big, err := p.Alloc(miB + 256*kiB + 256) // above the caches: best fit
			require.NoError(t, err)
			s := p.Stats()
			require.Positive(t, s.LargestFree)
			c, err := p.Alloc(s.LargestFree)
			require.NoError(t, err, "LargestFree %d", s.LargestFree)
			require.Equal(t, s.Grows, p.Stats().Grows, "served without growing")
			require.NoError(t, p.Free(c))
			require.NoError(t, p.Free(big))
			checkStep(t, p, d)
		})
	}
}

// Guard mode: freeing a block on a stream (pending) raised Active (the
// red zone of the pending block was counted again), and ActivePeak then
// fell without ResetPeaks once the free completed. Pending blocks' red
// zones are now counted (Pool.pend) and the layer keeps its own peak.
func TestGuardModesActiveCountsNoRedZoneOfAPendingBlock(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
	ss := newStreams(t, d, 2)
	a, b := ss[0], ss[1]
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	y, err := p.AllocOn(256, b) // a second stream: frees on a go pending
	require.NoError(t, err)
	x, err := p.AllocOn(256, a)
	require.NoError(t, err)
	live := p.Stats()
	require.NoError(t, p.FreeOn(x, a))
	pending := p.Stats()
	require.LessOrEqual(t, pending.Active, live.Active, "a free does not add to Active")
	_, err = p.Trim() // waits for the free: the block goes back to the index
	require.NoError(t, err)
	after := p.Stats()
	require.GreaterOrEqual(t, after.ActivePeak, pending.ActivePeak, "a peak must not fall")
	require.NoError(t, p.FreeOn(y, b))
	checkStep(t, p, d)
}

// Guard mode: a pitch allocation's bytes were recorded as pitch × height,
// not its block size (size class), so AllocatedPeak fell below an
// Allocated figure Stats had reported, once the block was freed.
func TestGuardModesPeaksCountAPitchAllocationAsAllocatedDoes(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, Cache: CacheOptions{Disable: true}})
	ptr, _, err := p.AllocPitch(512, 1025) // 524800 bytes, class 532480
	require.NoError(t, err)
	live := p.Stats()
	require.NoError(t, p.Free(ptr))
	after := p.Stats()
	require.GreaterOrEqual(t, after.AllocatedPeak, live.Allocated)
	require.GreaterOrEqual(t, after.ActivePeak, live.Active)
	checkStep(t, p, d)
}

// OnOutOfMemory "is called with the request in bytes"; through the
// caches it (and the error's "request of ...") got the size class.
func TestTheHookAndTheErrorNameTheRequestTheCachesRounded(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	var got []uint64
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 2 * miB, NoScavenger: true,
		Cache:         CacheOptions{Eager: true},
		OnOutOfMemory: func(n uint64) { got = append(got, n) }})
	big, err := p.Alloc(2 * miB)
	require.NoError(t, err)
	_, err = p.Alloc(3000)
	require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
	require.Equal(t, []uint64{3000}, got)
	require.Contains(t, err.Error(), "request of 2.93 KiB (3000 bytes)")
	require.NoError(t, p.Free(big))
}

// Guard mode: Close zeroed the layer's red-zone count, so Stats after
// Close counted red zones in Allocated: it grew across Close.
func TestGuardModesAllocatedStaysAcrossClose(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	_, err := p.Alloc(1000)
	require.NoError(t, err)
	before := p.Stats()
	require.NoError(t, p.Close())
	after := p.Stats()
	require.Equal(t, before.Allocated, after.Allocated, "Allocated still counts the blocks live at Close")
}
