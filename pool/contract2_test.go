package pool

// Contracts a new user's trial broke (2026-12-07, second review): each
// test failed on dbefb73.

import (
	"errors"
	"testing"

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
