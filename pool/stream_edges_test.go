package pool

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// A stream destroyed without ForgetStream, then forgotten: drop waits for
// its sealed batches' events, and where that wait failed it reclaimed
// their blocks all the same, so another stream could take one while the
// dead stream's queued write to it still ran. Now such batches wait in
// the set's polls (streamSet.orphaned): their blocks stay pending until
// the event completes, and a reuse comes only after the write.
func TestAFailedWaitInDropKeepsTheSealedBatchPending(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	b := newStreams(t, sd, 1)[0]
	a, err := sd.StreamCreate() // destroyed by the test itself
	require.NoError(t, err)
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 2 * streamBlock})
	x, err := p.AllocOn(streamBlock, a)
	require.NoError(t, err)
	y, err := p.AllocOn(streamBlock, b)
	require.NoError(t, err)
	require.NoError(t, sd.HoldStream(a))
	require.NoError(t, sd.MemsetD32Async(x, 1, wordCount(streamBlock), a)) // a's last use of x, queued
	require.NoError(t, p.FreeOn(x, a))
	p.mu.Lock()
	require.NoError(t, p.pollPending(false)) // seals x's batch: its event waits behind the held write
	p.mu.Unlock()
	require.Equal(t, int64(1), p.Stats().PendingBlocks)
	require.NoError(t, sd.StreamDestroy(a)) // its queued work still runs later

	sd.FailNth(device.CallEventSynchronize, 1, nil) // drop's wait for the sealed batch fails
	require.NoError(t, p.ForgetStream(a))
	sd.ClearFaults()
	checkStep(t, p, d)
	require.Equal(t, int64(1), p.Stats().PendingBlocks, "x waits for its event, without its stream")
	p.mu.Lock()
	require.NoError(t, p.pollPending(false))
	p.mu.Unlock()
	require.Equal(t, int64(1), p.Stats().PendingBlocks, "the event has not completed")
	z, err := p.AllocOn(streamBlock, b) // the out-of-memory path waits for the event
	require.NoError(t, err)
	require.NoError(t, sd.MemsetD32Async(z, 2, wordCount(streamBlock), b))
	checkStep(t, p, d) // no write of b's on memory a's queued write still uses
	require.NoError(t, p.FreeOn(z, b))
	require.NoError(t, p.FreeOn(y, b))
}

// A multi-stream pool never started over: the last free leaves its block
// pending, startOver refuses while PendingBlocks != 0, and nothing looked
// again once the blocks were reclaimed, so a top kept for severe
// fragmentation (Stats.TopKept) stayed kept for the pool's life. Trim now
// starts it over once nothing is pending. Single-stream mode as before.
func TestAMultiStreamPoolWhoseBlocksAreAllFreedForgetsTheKeptTopAtTrim(t *testing.T) {
	for _, multi := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "multi"}[multi], func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: 4 * giB, Shadow: true})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1e-12, Cache: CacheOptions{Disable: true}, NoScavenger: true})
			if multi {
				toMultiStream(t, p, sd)
				_, err := p.Trim() // nothing pending
				require.NoError(t, err)
			}
			placed, holes := eightMiBBlocks(t, p, 17, 8)
			for _, h := range holes {
				require.NoError(t, p.Free(h))
			}
			if multi {
				p.mu.Lock()
				require.NoError(t, p.pollPending(true)) // the holes back in the index, as in single mode
				p.mu.Unlock()
			}
			big, err := p.Alloc(12 * miB) // grows, fragmented: the top is kept
			require.NoError(t, err)
			require.True(t, p.Stats().TopKept)
			for _, ptr := range append(placed, big) {
				require.NoError(t, p.Free(ptr))
			}
			st := trimEmpty(t, p, d) // waits for every pending free
			require.False(t, st.TopKept, "every block freed, none pending: the heap should have started over and forgotten the kept top")
		})
	}
}

// A Trim failing midway keeps what it did (the caches flushed, with
// several streams into blocks pending on the default stream: Pool.Trim,
// errors.go): the pool stays consistent, and the next Trim finishes.
func TestATrimFailingMidwayLeavesAConsistentPoolThatTheNextTrimEmpties(t *testing.T) {
	for _, multi := range []bool{false, true} {
		t.Run(map[bool]string{false: "single", true: "multi"}[multi], func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Eager: true}, NoScavenger: true})
			if multi {
				toMultiStream(t, p, sd)
			}
			var ptrs []uintptr
			for range 8 {
				x, err := p.Alloc(4096)
				require.NoError(t, err)
				ptrs = append(ptrs, x)
			}
			for _, x := range ptrs {
				require.NoError(t, p.Free(x))
			}
			require.Positive(t, p.Stats().Cached)
			if multi {
				require.NoError(t, sd.HoldStream(0))
				require.NoError(t, sd.MemsetD32Async(ptrs[0], 1, 1, 0))
				sd.FailNth(device.CallEventSynchronize, 1, nil)
			} else {
				sd.FailNth(device.CallStreamSynchronize, 1, nil)
			}
			_, err := p.Trim()
			require.ErrorIs(t, err, device.ErrInjected)
			sd.ClearFaults()
			checkStep(t, p, d)
			if multi {
				require.NoError(t, sd.ReleaseStream(0))
			}
			s := trimEmpty(t, p, d)
			require.Zero(t, s.Cached)
			require.Zero(t, s.Reserved)
		})
	}
}

// A failed request on a new stream left a single-stream pool in
// multi-stream mode for good (fast paths off, every later free pending):
// the stream is now registered once the request succeeded.
func TestAFailedAllocOnANewStreamLeavesTheModeAsItWas(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	s := newStreams(t, sd, 1)[0]
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 64 * miB, Cache: CacheOptions{Disable: true}})
	x, err := p.Alloc(miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(x))
	_, err = p.AllocOn(128*miB, s) // above the cap: ErrOutOfMemory at once
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.False(t, p.ss.multi, "a failed request switched the pool to multi-stream mode")
	y, err := p.Alloc(miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(y))
	require.Zero(t, p.Stats().PendingBlocks, "a default-stream free in a single-stream pool is never pending")
	checkStep(t, p, d)
}

// A request on a joining stream that grew the heap, then failed to
// register the stream (the driver refused the event or the wait): the
// error left the growth reserved and the peak raised. It is now released
// as allocMiss releases a failed request's growth.
func TestAJoinFailingAfterAGrowthReleasesTheGrowth(t *testing.T) {
	for _, call := range []device.Call{device.CallStreamWaitEvent, device.CallEventRecord, device.CallEventCreate} {
		t.Run(call.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
			d := onSim(sd)
			ss := newStreams(t, sd, 2)
			a, b := ss[0], ss[1]
			p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}, NoScavenger: true})
			x, err := p.AllocOn(miB, a)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, a)) // a dirty: b's registration records and waits for an event
			before := p.Stats()
			sd.FailNth(call, 1, nil)
			_, err = p.AllocOn(before.Reserved+64*miB, b) // the heap must grow
			sd.ClearFaults()
			require.ErrorIs(t, err, device.ErrInjected)
			require.False(t, p.ss.multi)
			checkStep(t, p, d)
			after := p.Stats()
			require.Equal(t, before.Reserved, after.Reserved, "a failed request left its growth reserved")
			require.Equal(t, before.ReservedPeak, after.ReservedPeak, "and raised the peak")
		})
	}
}

// A single-stream pool whose last free a RecordStream held pending did not
// start over either, at the free or at Trim.
func TestAHeldLastFreeStartsTheHeapOverAtTrim(t *testing.T) {
	_, d, s2, p, placed := holedWithAStream(t)
	big, err := p.Alloc(12 * miB)
	require.NoError(t, err)
	require.True(t, p.Stats().TopKept)
	require.NoError(t, p.RecordStream(big, s2))
	for _, ptr := range append(placed, big) {
		require.NoError(t, p.Free(ptr))
	}
	require.False(t, p.ss.multi)
	require.Equal(t, int64(1), p.Stats().PendingBlocks)
	st := trimEmpty(t, p, d)
	require.False(t, st.TopKept, "every block freed, none pending: the heap started over")
}

// holedWithAStream makes a VMM pool on a simulated device with a second
// stream (not yet used by the pool): 17 blocks of 8 MiB, growing by the
// request only, every other one of the first 16 freed (8 MiB holes; the
// default stream has frees then). It returns the blocks left live.
func holedWithAStream(t *testing.T) (*sim.Device, testDevice, device.Stream, *Pool, []uintptr) {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: 4 * giB, Shadow: true})
	d := onSim(sd)
	s2 := newStreams(t, sd, 1)[0]
	p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1e-12, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	placed, holes := eightMiBBlocks(t, p, 17, 8)
	for _, h := range holes {
		require.NoError(t, p.Free(h))
	}
	return sd, d, s2, p, placed
}

// trimEmpty trims a pool whose blocks were all freed, checks it, and
// returns its statistics: no allocation, nothing pending.
func trimEmpty(t *testing.T, p *Pool, d testDevice) Stats {
	t.Helper()
	_, err := p.Trim()
	require.NoError(t, err)
	checkStep(t, p, d)
	st := p.Stats()
	require.Zero(t, st.Allocations)
	require.Zero(t, st.PendingBlocks)
	return st
}
