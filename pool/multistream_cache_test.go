package pool

import (
	"runtime"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// toMultiStream puts p in multi-stream mode (a block allocated and freed
// on a second stream, then forgotten) with nothing live or pending.
func toMultiStream(t *testing.T, p *Pool, sd *sim.Device) {
	t.Helper()
	s := newStreams(t, sd, 1)[0]
	y, err := p.Alloc(2 * miB)
	require.NoError(t, err)
	x, err := p.AllocOn(256, s)
	require.NoError(t, err)
	require.NoError(t, p.FreeOn(x, s))
	require.NoError(t, p.Free(y))
	require.NoError(t, p.ForgetStream(s))
	require.True(t, p.ss.multi)
}

// bothStreamModes runs f in a pool's single-stream mode and in its
// multi-stream mode.
func bothStreamModes(t *testing.T, f func(t *testing.T, multi bool)) {
	for _, multi := range []bool{false, true} {
		name := "single"
		if multi {
			name = "multi"
		}
		t.Run(name, func(t *testing.T) { f(t, multi) })
	}
}

// Blocks the central lists give back before a growth serve the request in
// multi-stream mode too, where they come back pending on the default
// stream (giveBack): before, the heap grew while they sat pending.
func TestCentralBlocksServeBeforeAGrowthWithSeveralStreams(t *testing.T) {
	bothStreamModes(t, func(t *testing.T, multi bool) {
		sd := sim.New(sim.Config{Capacity: giB})
		d := onSim(sd)
		p := openPool(t, d, Options{Backend: BackendVMM, InitialFraction: 4.0 / 1024, Cache: CacheOptions{Eager: true, MaxSize: miB}})
		if multi {
			toMultiStream(t, p, sd)
		}
		before := cachedSmall(t, p, d, 32, 64*kiB)
		p.mu.Lock()
		p.cache.drainIdle(-1) // two scans: every cache idle, drained to the central lists
		p.cache.drainIdle(-1)
		p.mu.Unlock()
		big, err := p.Alloc(3 * miB)
		require.NoError(t, err)
		st := p.Stats()
		require.Equal(t, before.Grows, st.Grows, "no growth while cached blocks could serve")
		require.Equal(t, 4*miB, st.Reserved)
		require.NoError(t, p.Free(big))
		checkStep(t, p, d)
	})
}

// The scavenger of an idle pool returns the caches' blocks and frees
// pending on streams that passed them, in multi-stream mode too: before,
// the flushed blocks sat pending and the pool kept their memory below
// the floor.
func TestTheScavengerReturnsCachedAndPendingBlocksWithSeveralStreams(t *testing.T) {
	bothStreamModes(t, func(t *testing.T, multi bool) {
		sd := sim.New(sim.Config{Capacity: giB})
		d := onSim(sd)
		p := openPool(t, d, Options{Backend: BackendVMM, FreeFloorFraction: 0.5, NoScavenger: true, Cache: CacheOptions{Eager: true}})
		var s device.Stream
		if multi {
			toMultiStream(t, p, sd)
			s = newStreams(t, sd, 1)[0]
		}
		_, err := p.Trim()
		require.NoError(t, err)
		for _, ptr := range allocBlocks(t, p, 100, 4*kiB) {
			require.NoError(t, p.Free(ptr))
		}
		if multi {
			x, err := p.AllocOn(4*miB, s)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, s))
			require.Positive(t, p.Stats().PendingBlocks)
		}
		require.NotZero(t, p.Stats().Cached)
		free, _, err := sd.MemGetInfo()
		require.NoError(t, err)
		op := sd.NewProcess()
		other, err := op.MemAlloc(free - 64*miB)
		require.NoError(t, err)
		for range 10 {
			p.mu.Lock()
			_, err := p.scavengeLocked()
			p.mu.Unlock()
			require.NoError(t, err)
		}
		st := p.Stats()
		require.Zero(t, st.Cached)
		require.Zero(t, st.Reserved, "pending %d bytes in %d blocks", st.Pending, st.PendingBlocks)
		require.NoError(t, op.MemFree(other))
		checkStep(t, p, d)
	})
}

// The caches hold at most MaxFraction × reserved, or 4 MiB a share (each
// P's and the central lists') in a pool holding little, as
// CacheOptions.MaxFraction says.
func TestTheCachesHoldWhatMaxFractionSays(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Eager: true}})
	keep, err := p.Alloc(64 * kiB)
	require.NoError(t, err)
	for _, ptr := range allocBlocks(t, p, 4096, 4*kiB) {
		require.NoError(t, p.Free(ptr))
	}
	st := p.Stats()
	shares := uint64(runtime.GOMAXPROCS(0) + 1)
	require.LessOrEqual(t, st.Cached, max(st.Reserved/16, shares*minShare), "reserved %d", st.Reserved)
	require.NoError(t, p.Free(keep))
	checkStep(t, p, d)
}

// In guard mode, a ForgetStream whose synchronization fails changes
// nothing, as it promises: before, the stream set had dropped the stream
// and taken back its pending blocks when the guard layer's own, second
// synchronization failed.
func TestAFailedForgetStreamChangesNothingInGuardMode(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	p := openPool(t, d, Options{Guard: 256, Cache: CacheOptions{Disable: true}})
	s := newStreams(t, sd, 1)[0]
	y, err := p.Alloc(miB)
	require.NoError(t, err)
	live, err := p.AllocOn(miB, s)
	require.NoError(t, err)
	x, err := p.AllocOn(miB, s)
	require.NoError(t, err)
	require.NoError(t, p.FreeOn(x, s))
	before := p.Stats()
	require.Positive(t, before.PendingBlocks)
	sd.FailNth(device.CallStreamSynchronize, 1, nil)
	require.ErrorIs(t, p.ForgetStream(s), device.ErrInjected)
	require.Equal(t, before.PendingBlocks, p.Stats().PendingBlocks, "nothing changed")
	// One synchronization, before any change: a failure of it changes
	// nothing (before, a second one failed after the changes).
	syncs := sd.Counts()[device.CallStreamSynchronize]
	require.NoError(t, p.ForgetStream(s))
	require.Equal(t, syncs+1, sd.Counts()[device.CallStreamSynchronize], "one synchronization")
	require.Zero(t, p.Stats().PendingBlocks)
	require.NoError(t, p.Free(live))
	require.NoError(t, p.Free(y))
	checkStep(t, p, d)
}
