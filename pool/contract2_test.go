package pool

// Contracts a new user's trial and a review broke (2026-12-07, this
// session): each test failed on dbefb73 or on ac71728.

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// halfFreeAtCap fills a VMM pool capped at 64 MiB with 2 MiB blocks
// until a request fails, then frees every other one: 32 MiB free in
// 2 MiB pieces, each between live blocks.
func halfFreeAtCap(t *testing.T, d testDevice, o Options) *Pool {
	t.Helper()
	o.Backend, o.MaxBytes, o.NoScavenger = BackendVMM, 64*miB, true
	p := openPool(t, d, o)
	var live []uintptr
	for {
		x, err := p.Alloc(2 * miB)
		if err != nil {
			require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
			break
		}
		live = append(live, x)
	}
	for i := 0; i < len(live); i += 2 {
		require.NoError(t, p.Free(live[i]))
	}
	return p
}

// A growth that found the heap fragmented badly kept its free top
// (Stats.TopKept) before it checked the cap: a request that then failed
// left TopKept switched on. The switch now holds only where the growth
// served the request.
func TestAFailedGrowthLeavesTheTopAsItWas(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := halfFreeAtCap(t, d, Options{})
	before := p.Stats()
	require.False(t, before.TopKept)
	_, err := p.Alloc(30 * miB)
	require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
	require.False(t, p.Stats().TopKept, "a failed request changes no statistic")
	checkStep(t, p, d)
}

// Guard mode gave OnOutOfMemory and the error's message the request
// with its red zone, and the message's allocated bytes with the red
// zones of live blocks, where Stats gives neither.
func TestGuardModesOutOfMemoryNamesTheCallersRequest(t *testing.T) {
	for _, cacheOff := range []bool{true, false} {
		d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
		var got []uint64
		p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, MaxBytes: 64 * miB, NoScavenger: true,
			Cache:         CacheOptions{Disable: cacheOff, Eager: !cacheOff},
			OnOutOfMemory: func(n uint64) { got = append(got, n) }})
		x, err := p.Alloc(60 * miB)
		require.NoError(t, err)
		_, err = p.Alloc(10 * miB)
		require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
		require.Equal(t, []uint64{10 * miB}, got)
		require.Contains(t, err.Error(), "request of 10.00 MiB (10485760 bytes)")
		require.Contains(t, err.Error(), "allocated 60.00 MiB (62914560 bytes)")
		require.Equal(t, uint64(60*miB), p.Stats().Allocated)
		checkStep(t, p, d)
		require.NoError(t, p.Free(x))
	}
}

// A capped VMM pool moves pages from under free blocks to back a
// request (share.go), but the out-of-memory message's largest block
// counted only the pages it could map: 2 MiB where 24 MiB was served.
// It now counts the pages the pool would move for a block of that size,
// and says when a recent failure keeps it from moving them.
func TestOutOfMemoryMessageCountsPagesThePoolWouldMove(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := halfFreeAtCap(t, d, Options{})
	_, err := p.Alloc(40 * miB)
	require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
	msg := err.Error()
	t.Log(msg)
	// Having failed, the pool moves pages only within 90% of its cap
	// (57.6 MiB) with 32 MiB in use.
	require.Contains(t, msg, "only within 90% of the cap")
	largest := largestInMessage(t, msg)
	require.Greater(t, largest, 16*miB, msg)
	require.LessOrEqual(t, largest, 26*miB, msg)
	x, err := p.Alloc(largest)
	require.NoError(t, err, "the size the message gave: %s", msg)
	checkStep(t, p, d)
	require.NoError(t, p.Free(x))
}

// The out-of-memory message's largest block should be a request Alloc
// serves right after (a review's randomized check, 2026-12-07): it gave
// pieces starting after a hole in a free block, where the index places
// a block at the bottom, and sizes that good fit or the caches round up
// past it; 22 to 60 of 60 seeds failed. Each seed allocates and frees at
// random in a capped VMM pool until five requests failed; each failure
// must leave TopKept as it was and its message's largest block must be
// served. (Seeds 62 and 126 of 300 still fail: the figure is an estimate
// where pages must move, Pool.largestAllocatable.)
func TestTheLargestBlockInTheMessageIsServed(t *testing.T) {
	seeds := uint64(12)
	if testing.Short() {
		seeds = 3
	}
	for _, guard := range []uint64{0, 64} {
		for _, cacheOff := range []bool{false, true} {
			for _, goodFit := range []bool{false, true} {
				for _, rf := range []float64{0, 0.05} {
					o := Options{Backend: BackendVMM, NoScavenger: true, Guard: guard,
						Cache: CacheOptions{Disable: cacheOff}, GoodFit: goodFit, ReleaseFraction: rf}
					t.Run(fmt.Sprintf("guard%d-cacheoff%v-goodfit%v-rf%v", guard, cacheOff, goodFit, rf), func(t *testing.T) {
						for seed := range seeds {
							servesTheMessagesLargest(t, seed, o)
						}
					})
				}
			}
		}
	}
}

func servesTheMessagesLargest(t *testing.T, seed uint64, o Options) {
	r := rand.New(rand.NewPCG(seed, 7))
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: o.Guard > 0}))
	o.MaxBytes = uint64(32+r.IntN(96)) * miB
	p := openPool(t, d, o)
	var live []uintptr
	failed := 0
	for step := 0; step < 5000 && failed < 5; step++ {
		if len(live) > 0 && r.IntN(3) == 0 {
			i := r.IntN(len(live))
			require.NoError(t, p.Free(live[i]))
			live[i] = live[len(live)-1]
			live = live[:len(live)-1]
			continue
		}
		n := uint64(1 + r.IntN([]int{64 << 10, 1 << 20, 12 << 20, 12 << 20}[r.IntN(4)]))
		kept := p.Stats().TopKept
		x, err := p.Alloc(n)
		if err == nil {
			live = append(live, x)
			continue
		}
		failed++
		require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
		require.Equal(t, kept, p.Stats().TopKept, "seed %d: a failed request changes no statistic", seed)
		checkStep(t, p, d)
		if largest := largestInMessage(t, err.Error()); largest > 0 {
			y, err2 := p.Alloc(largest)
			require.NoError(t, err2, "seed %d: the largest block of %q", seed, err.Error())
			live = append(live, y)
		}
	}
	for _, x := range live {
		require.NoError(t, p.Free(x))
	}
	checkStep(t, p, d)
}

// A request on a new stream whose growth turned the wilderness list on,
// then failed to register the stream, left TopKept on.
func TestAJoinFailingAfterAGrowthLeavesTheTopAsItWas(t *testing.T) {
	sd, d, b, p, _ := holedWithAStream(t) // b's registration records an event
	require.False(t, p.Stats().TopKept)
	sd.FailNth(device.CallEventRecord, 1, nil)
	_, err := p.AllocOn(12*miB, b)
	sd.ClearFaults()
	require.True(t, errors.Is(err, device.ErrInjected), "%v", err)
	checkStep(t, p, d)
	require.False(t, p.Stats().TopKept, "a failed request changes no statistic")
}

// In guard mode AllocPitch adds no red zone, yet the hook and the
// message took one off its request.
func TestGuardModesOutOfMemoryNamesAPitchRequestWhole(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
	var got []uint64
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 4096, MaxBytes: 64 * miB, NoScavenger: true,
		Cache: CacheOptions{Disable: true}, OnOutOfMemory: func(n uint64) { got = append(got, n) }})
	x, err := p.Alloc(60 * miB)
	require.NoError(t, err)
	_, _, err = p.AllocPitch(miB, 10)
	require.True(t, errors.Is(err, ErrOutOfMemory), "%v", err)
	require.Equal(t, []uint64{10 * miB}, got, "the hook's size")
	require.Contains(t, err.Error(), "request of 10.00 MiB (10485760 bytes)")
	require.NoError(t, p.Free(x))
}
