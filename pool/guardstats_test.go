package pool

// Guard mode's statistics without red zones (debug.go): found by a
// review of 2026-12-07, each test failing before its fix.

import (
	"bytes"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// Guard mode with caches: Stats after Close counts the blocks live at
// Close that the pool itself served, not those the caches handed out
// (Pool.Stats; cacheSet.forget drops the caches' live bytes). The layer
// keeps its red-zone count across Close (debugLayer.forget), cached
// blocks' red zones included, and subtracts it from the index's blocks
// alone: Allocated after Close fell below the bytes of the index's blocks.
func TestGuardModesAllocatedAfterCloseLeavesTheCachesBlocksOut(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, NoScavenger: true, Cache: CacheOptions{Eager: true}})
	big, err := p.Alloc(4 * miB) // above the caches: the index's block
	require.NoError(t, err)
	s1 := p.Stats()
	for range 8 {
		_, err := p.Alloc(1000) // the caches' blocks
		require.NoError(t, err)
	}
	require.Greater(t, p.Stats().Allocated, s1.Allocated)
	require.NoError(t, p.Close())
	after := p.Stats()
	require.Equal(t, s1.Allocated, after.Allocated, "the index's block live at Close, without its red zone")
	_ = big
}

// A request above a lowered cap that memory the pool holds serves
// (heldServes) succeeds, yet allocMissPath builds hopeless's
// ErrOutOfMemory first, and oomError logs "out of memory" at Warn
// (logOOM): a request that succeeded is logged as out of memory. (It
// may also ask the driver for free memory, for a message it discards.)
func TestARequestHeldMemoryServesLogsNoOutOfMemory(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			var buf bytes.Buffer
			log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			ss := newStreams(t, d, 2)
			a, b := ss[0], ss[1]
			p := openPool(t, d, Options{Backend: be, NoScavenger: true, Logger: log, Cache: CacheOptions{Disable: true}})
			y, err := p.AllocOn(miB, b)
			require.NoError(t, err)
			x, err := p.AllocOn(32*miB, a)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, a))
			require.NoError(t, p.SetMaxBytes(16*miB))
			x3, err := p.AllocOn(32*miB, b)
			require.NoError(t, err, "served by memory the pool holds")
			require.Zero(t, p.Stats().OutOfMemory)
			require.NotContains(t, buf.String(), "out of memory", "a request that succeeded")
			require.NoError(t, p.FreeOn(x3, b))
			require.NoError(t, p.FreeOn(y, b))
		})
	}
}

// Guard mode: between the pool's allocation of size+Guard bytes and the
// layer's record of the block's red zone (debugLayer.alloc releases the
// pool's lock in between, then retakes it in lockedGuard), Stats counts
// the red zone in Allocated and Active but not in the layer's extra:
// AllocatedPeak = max(userPeak, Allocated) and ActivePeak = max(activePeak,
// Active) then report a figure that includes the red zone, and fall back
// once the layer has recorded the block. A peak must never fall without
// ResetPeaks, nor report more than was ever allocated without red zones.
func TestGuardModesPeaksDoNotFallUnderConcurrentStats(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, NoScavenger: true, Cache: CacheOptions{Disable: true}})
	// One block live at a time: 1000 bytes are a 1024-byte block without
	// the red zone, 1280 with it.
	var stop atomic.Bool
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		allocAndFree(t, p, 1000, 20000, &stop)
		stop.Store(true)
	}()
	var prevAlloc, prevActive uint64
	var fellAlloc, fellActive, over int
	for !stop.Load() {
		s := p.Stats()
		if s.AllocatedPeak < prevAlloc {
			fellAlloc++
		}
		if s.ActivePeak < prevActive {
			fellActive++
		}
		if s.AllocatedPeak > 1024 || s.ActivePeak > 1024 {
			over++
		}
		prevAlloc, prevActive = max(prevAlloc, s.AllocatedPeak), max(prevActive, s.ActivePeak)
	}
	stop.Store(true)
	wg.Wait()
	final := p.Stats()
	t.Logf("over %d, AllocatedPeak fell %d, ActivePeak fell %d", over, fellAlloc, fellActive)
	require.Zero(t, over, "a peak above the 1024 bytes ever live without red zones (final %d/%d)", final.AllocatedPeak, final.ActivePeak)
	require.Zero(t, fellAlloc, "AllocatedPeak fell")
	require.Zero(t, fellActive, "ActivePeak fell")
}

// Guard mode: the layer raises its peak of Active without red zones at
// each allocation (noteActive) from the pool's Active less the red zones
// it knows; a block another goroutine has allocated from the pool but
// whose red zone the layer has not recorded yet (the pool's lock is
// released between allocUnchecked and lockedGuard) counts with its red
// zone, and the peak keeps that figure for good. Two goroutines, each
// with at most one 1000-byte block (1024 bytes without its red zone)
// live at a time, never had more than 2048 bytes live or pending.
func TestGuardModesActivePeakKeepsNoRedZoneOfABlockInFlight(t *testing.T) {
	for _, cacheOff := range []bool{true, false} {
		t.Run(configName(BackendVMM, cacheOff), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: true}))
			p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, NoScavenger: true,
				Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
			var wg sync.WaitGroup
			for range 2 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					allocAndFree(t, p, 1000, 20000, nil)
				}()
			}
			wg.Wait()
			s := p.Stats()
			require.Zero(t, s.Allocated)
			require.LessOrEqual(t, s.AllocatedPeak, 2*kiB)
			require.LessOrEqual(t, s.ActivePeak, 2*kiB, "ActivePeak counts red zones of blocks the layer had not recorded yet")
		})
	}
}

// allocAndFree allocates and frees a block of size bytes n times, or
// until stop (if not nil) is set; errors are the test's, from any
// goroutine.
func allocAndFree(t *testing.T, p *Pool, size uint64, n int, stop *atomic.Bool) {
	for i := 0; i < n && (stop == nil || !stop.Load()); i++ {
		ptr, err := p.Alloc(size)
		if err != nil {
			t.Error(err)
			return
		}
		if err := p.Free(ptr); err != nil {
			t.Error(err)
			return
		}
	}
}

// A randomized mix of guard-mode operations on several streams: after
// every step the pool's invariants hold, the peaks never fall without
// ResetPeaks, and the figures are consistent with each other.
func TestGuardModesStatisticsOverRandomSteps(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cacheOff := range []bool{false, true} {
			for _, goodFit := range []bool{false, true} {
				for seed := uint64(1); seed <= 12; seed++ {
					t.Run(fmt.Sprintf("%s/goodfit=%v/seed=%d", configName(be, cacheOff), goodFit, seed), func(t *testing.T) {
						randomGuardSteps(t, be, cacheOff, goodFit, seed, 400)
					})
				}
			}
		}
	}
}

type guardLiveBlock struct {
	ptr    uintptr
	stream device.Stream
	delta  uint64 // Allocated's rise at its allocation
}

func randomGuardSteps(t *testing.T, be Backend, cacheOff, goodFit bool, seed uint64, steps int) {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	ss := newStreams(t, d, 2)
	streams := []device.Stream{0, ss[0], ss[1]}
	p := openPool(t, d, Options{Backend: be, Guard: 64, GoodFit: goodFit, NoScavenger: true,
		Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
	rng := rand.New(rand.NewPCG(seed, seed*7+1))
	var live []guardLiveBlock
	var prev Stats
	held := map[device.Stream]bool{}
	size := func() uint64 {
		switch rng.IntN(4) {
		case 0:
			return 1 + rng.Uint64N(512)
		case 1:
			return 1 + rng.Uint64N(64*kiB)
		case 2:
			return 1 + rng.Uint64N(2*miB)
		default:
			return []uint64{256, 512, 1024, 4096, 64 * kiB, miB}[rng.IntN(6)] - uint64(rng.IntN(2))*64
		}
	}
	check := func(step int, what string, reset bool) Stats {
		t.Helper()
		checkStep(t, p, d)
		s := p.Stats()
		ctx := fmt.Sprintf("step %d (%s): %+v\nprev %+v", step, what, s, prev)
		require.GreaterOrEqual(t, s.AllocatedPeak, s.Allocated, ctx)
		require.GreaterOrEqual(t, s.ActivePeak, s.Active, ctx)
		require.GreaterOrEqual(t, s.Active, s.Allocated, ctx)
		require.LessOrEqual(t, s.Pending, s.Active, ctx)
		require.Equal(t, s.Active, s.Allocated+s.Pending, "Active is live plus pending; "+ctx)
		require.GreaterOrEqual(t, s.ActivePeak, s.AllocatedPeak, ctx)
		if !reset {
			require.GreaterOrEqual(t, s.AllocatedPeak, prev.AllocatedPeak, "AllocatedPeak fell; "+ctx)
			require.GreaterOrEqual(t, s.ActivePeak, prev.ActivePeak, "ActivePeak fell; "+ctx)
			require.GreaterOrEqual(t, s.ReservedPeak, prev.ReservedPeak, "ReservedPeak fell; "+ctx)
			require.GreaterOrEqual(t, s.AllocationsPeak, prev.AllocationsPeak, "AllocationsPeak fell; "+ctx)
		}
		prev = s
		return s
	}
	prev = p.Stats()
	for step := 0; step < steps; step++ {
		before := p.Stats()
		op := rng.IntN(100)
		what := ""
		reset := false
		switch {
		case op < 35:
			s := streams[rng.IntN(len(streams))]
			n := size()
			what = fmt.Sprintf("AllocOn(%d, %#x)", n, uintptr(s))
			fail := rng.IntN(8) == 0
			if fail {
				what += " with its fill failing"
				sd.FailNth(device.CallMemsetD8Async, 1, nil)
			}
			ptr, err := p.AllocOn(n, s)
			sd.ClearFaults()
			if fail {
				if err == nil {
					live = append(live, guardLiveBlock{ptr: ptr, stream: s, delta: p.Stats().Allocated - before.Allocated})
				}
				break
			}
			if err != nil {
				require.True(t, errors.Is(err, ErrOutOfMemory), "%s: %v", what, err)
				break
			}
			after := p.Stats()
			live = append(live, guardLiveBlock{ptr: ptr, stream: s, delta: after.Allocated - before.Allocated})
		case op < 40:
			w, h := 1+rng.Uint64N(4096), 1+rng.Uint64N(64)
			what = fmt.Sprintf("AllocPitch(%d, %d)", w, h)
			ptr, _, err := p.AllocPitch(w, h)
			if err != nil {
				require.True(t, errors.Is(err, ErrOutOfMemory), "%s: %v", what, err)
				break
			}
			after := p.Stats()
			live = append(live, guardLiveBlock{ptr: ptr, stream: 0, delta: after.Allocated - before.Allocated})
		case op < 70 && len(live) > 0:
			i := rng.IntN(len(live))
			b := live[i]
			s := b.stream
			if rng.IntN(4) == 0 {
				s = streams[rng.IntN(len(streams))]
				if s != b.stream {
					require.NoError(t, p.RecordStream(b.ptr, s))
				}
			}
			what = fmt.Sprintf("FreeOn(%#x, %#x) of a block of %#x", b.ptr, uintptr(s), uintptr(b.stream))
			require.NoError(t, p.FreeOn(b.ptr, s), what)
			live = append(live[:i], live[i+1:]...)
			after := p.Stats()
			require.Equal(t, before.Allocated-b.delta, after.Allocated, "a free takes back what its allocation added; %s", what)
		case op < 78 && len(live) > 0:
			b := live[rng.IntN(len(live))]
			s := streams[1+rng.IntN(2)]
			what = fmt.Sprintf("RecordStream(%#x, %#x)", b.ptr, uintptr(s))
			require.NoError(t, p.RecordStream(b.ptr, s))
		case op < 84:
			s := streams[rng.IntN(len(streams))]
			if held[s] {
				what = fmt.Sprintf("ReleaseStream(%#x)", uintptr(s))
				require.NoError(t, sd.ReleaseStream(s))
				held[s] = false
			} else {
				what = fmt.Sprintf("HoldStream(%#x)", uintptr(s))
				require.NoError(t, sd.HoldStream(s))
				held[s] = true
			}
		case op < 88:
			what = "Trim"
			_, err := p.Trim()
			require.NoError(t, err)
			clear(held) // Trim synchronizes
		case op < 92:
			what = "ResetPeaks"
			p.ResetPeaks()
			reset = true
		case op < 97:
			n := []uint64{0, 2 * miB, 8 * miB, 32 * miB, 1}[rng.IntN(5)]
			what = fmt.Sprintf("SetMaxBytes(%d)", n)
			require.NoError(t, p.SetMaxBytes(n))
		default:
			s := streams[1+rng.IntN(2)]
			what = fmt.Sprintf("StreamSynchronize(%#x)", uintptr(s))
			require.NoError(t, d.StreamSynchronize(s))
			held[s] = false
		}
		check(step, what, reset)
	}
	for _, s := range streams {
		_ = sd.ReleaseStream(s)
	}
	require.NoError(t, p.SetMaxBytes(0))
	for _, b := range live {
		require.NoError(t, p.FreeOn(b.ptr, b.stream))
	}
	_, err := p.Trim()
	require.NoError(t, err)
	s := check(steps, "end", false)
	require.Zero(t, s.Allocated)
	require.Zero(t, s.Active)
	require.Zero(t, s.Pending)
}

// Guard mode: a block's red-zone bytes (allocMeta.red) are cleared when
// it stops being pending (unpend) or goes back from a cache (giveBack),
// but not when a live block is freed straight to the index (single-stream
// mode): its record's ID, reused by the index for the next block, keeps
// the old figure. A block that becomes pending without the layer having
// recorded its own red zone (debugLayer.undo, after a failed fill) then
// counts that stale figure in redPending, and Stats takes it off Pending
// and Active: a pending block of 1280 bytes showed as 0 pending bytes.
func TestGuardModesPendingCountsNoStaleRedZoneOfAReusedBlockID(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	ss := newStreams(t, d, 2)
	a, b := ss[0], ss[1]
	p := openPool(t, d, Options{Backend: BackendVMM, Guard: 64, GoodFit: true, NoScavenger: true, Cache: CacheOptions{Disable: true}})
	// Good fit: 64 MiB - 32 bytes is a 64 MiB block, with its red zone a
	// 65 MiB one: 1 MiB of red zone recorded for each block's ID.
	x1, err := p.Alloc(64*miB - 32)
	require.NoError(t, err)
	x2, err := p.Alloc(64*miB - 32)
	require.NoError(t, err)
	// One stream: straight to the index, the records' red kept.
	require.NoError(t, p.Free(x1))
	require.NoError(t, p.Free(x2))
	y, err := p.AllocOn(256, a) // a second stream: multi-stream mode; takes one of the two IDs
	require.NoError(t, err)
	before := p.Stats()
	require.Zero(t, before.PendingBlocks)
	require.NoError(t, sd.HoldStream(b)) // b busy: a free on it stays pending
	sd.FailNth(device.CallMemsetD8Async, 1, nil)
	_, err = p.AllocOn(1000, b) // takes the other ID; the fill fails: undo frees the block on b
	require.Error(t, err)
	sd.ClearFaults()
	checkStep(t, p, d)
	s := p.Stats()
	require.Equal(t, int64(1), s.PendingBlocks, "the undone block waits for b")
	require.Equal(t, sizeClass(1000+64), s.Pending, "the pending block's bytes (it has no red zone of its own)")
	require.NoError(t, sd.ReleaseStream(b))
	require.NoError(t, p.FreeOn(y, a))
}
