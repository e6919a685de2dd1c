package pool

// Requests that can never succeed fail at once and release nothing;
// LargestFree is a size Alloc accepts; a cap below the granularity is
// refused at New.

import (
	"errors"
	"fmt"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

func TestHopelessRequestsFailAtOnceAndReleaseNothing(t *testing.T) {
	for _, c := range []struct {
		name      string
		opts      Options
		size      uint64
		deviceOOM bool
	}{
		{"above MaxBytes", Options{MaxBytes: 256 * miB}, 512 * miB, false},
		{"above MaxFraction of the total", Options{MaxFraction: 0.25}, 512 * miB, false},
		{"above the device's total", Options{VirtualSize: 4 * giB}, 1536 * miB, true},
	} {
		for _, be := range pooledBackends {
			t.Run(c.name+"/"+be.String(), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				o := c.opts
				o.Backend = be
				o.Cache.Eager = true
				p := openPool(t, d, o)
				// Memory held and cached: the out-of-memory path would
				// return it.
				var ptrs []uintptr
				for range 16 {
					ptr, err := p.Alloc(4 * miB)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
				}
				small, err := p.Alloc(4 * kiB)
				require.NoError(t, err)
				require.NoError(t, p.Free(small))
				for _, ptr := range ptrs[1:] {
					require.NoError(t, p.Free(ptr))
				}
				before := p.Stats()
				require.Positive(t, before.Cached)

				_, err = p.Alloc(c.size)
				require.ErrorIs(t, err, ErrOutOfMemory)
				if c.deviceOOM {
					require.ErrorIs(t, err, device.ErrOutOfMemory)
				}
				require.Contains(t, err.Error(), "nothing released")
				after := p.Stats()
				require.Equal(t, before.OutOfMemory+1, after.OutOfMemory)
				require.Equal(t, before.Retries, after.Retries, "no out-of-memory path")
				require.Equal(t, before.Reserved, after.Reserved, "nothing released")
				require.Equal(t, before.Cached, after.Cached, "caches kept")
				require.Equal(t, before.DeviceCalls.Total(), after.DeviceCalls.Total()-countInfo(after.DeviceCalls, before.DeviceCalls), "no driver call but queries")
				checkStep(t, p, d)
				require.NoError(t, p.Free(ptrs[0]))
			})
		}
	}
}

// A passthrough pool says why a request fails as the pooled backends do,
// and asks the driver for no allocation (cuMemGetInfo, for the message,
// only).
func TestPassthroughSaysWhyARequestCannotSucceed(t *testing.T) {
	for _, c := range []struct {
		name      string
		opts      Options
		size      uint64
		why       string
		deviceOOM bool
	}{
		{"above the cap", Options{MaxBytes: 256 * miB}, 512 * miB, "exceeds the cap", false},
		{"past the cap", Options{MaxBytes: 256 * miB}, 200 * miB, "past the cap", false},
		{"above the device's total", Options{}, 1536 * miB, "exceeds the device's total memory", true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			o := c.opts
			o.Backend = BackendPassthrough
			p := openPool(t, d, o)
			held, err := p.Alloc(100 * miB)
			require.NoError(t, err)
			before := p.Stats()
			require.Positive(t, before.DeviceCalls.Map()["cuMemAlloc"], "the held block's")
			_, err = p.Alloc(c.size)
			require.ErrorIs(t, err, ErrOutOfMemory)
			require.Equal(t, c.deviceOOM, errors.Is(err, device.ErrOutOfMemory), "%v", err)
			require.Contains(t, err.Error(), c.why)
			after := p.Stats()
			require.Equal(t, before.OutOfMemory+1, after.OutOfMemory)
			require.Equal(t, before.Reserved, after.Reserved)
			require.Zero(t, after.DeviceCalls.Map()["cuMemAlloc"]-before.DeviceCalls.Map()["cuMemAlloc"], "no driver allocation tried")
			checkStep(t, p, d)
			require.NoError(t, p.Free(held))
		})
	}
}

// A passthrough pitch allocation past the cap: where width × height
// alone is past it, no driver allocation is tried; where only the
// driver's pitch takes it past, the probe is freed before the error is
// made, so the free memory the error reports is the device's whole.
// Either way the statistics are as before, but for the failure counted.
func TestPassthroughPitchPastTheCap(t *testing.T) {
	for _, c := range []struct {
		name          string
		width, height uint64
		probes        uint64
	}{
		{"width × height past the cap", 2052, 1024, 0},
		{"pitch × height past the cap", 1030, 1000, 1}, // pitch 1536: 1,536,000 bytes against 1 MiB
	} {
		t.Run(c.name, func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: BackendPassthrough, MaxBytes: miB})
			before := p.Stats()
			_, _, err := p.AllocPitch(c.width, c.height)
			require.ErrorIs(t, err, ErrOutOfMemory)
			require.Contains(t, err.Error(), "cap")
			require.Contains(t, err.Error(), fmt.Sprintf("device free 1.00 GiB (%d bytes) of", giB), "the device's free memory, without the probe: %v", err)
			after := p.Stats()
			require.Equal(t, before.OutOfMemory+1, after.OutOfMemory)
			require.Equal(t, before.Reserved, after.Reserved)
			require.Equal(t, before.Allocated, after.Allocated)
			calls := after.DeviceCalls.Map()
			require.Equal(t, c.probes, calls["cuMemAllocPitch"]-before.DeviceCalls.Map()["cuMemAllocPitch"])
			require.Equal(t, c.probes, calls["cuMemFree"]-before.DeviceCalls.Map()["cuMemFree"])
			require.Zero(t, sd.Mapped())
			checkStep(t, p, d)
		})
	}
}

// countInfo is the cuMemGetInfo calls between two snapshots (the error
// message reports the device's free memory).
func countInfo(after, before device.Counts) uint64 {
	return after.Map()["cuMemGetInfo"] - before.Map()["cuMemGetInfo"]
}

// In guard mode (the second case) LargestFree ignored the red zone the
// layer adds to every request, so Alloc(LargestFree) grew (VMM) or failed
// (chunks).
func TestLargestFreeIsAccepted(t *testing.T) {
	for _, guard := range []uint64{0, 64} {
		for _, be := range pooledBackends {
			t.Run(fmt.Sprintf("%s/guard=%d", be, guard), func(t *testing.T) {
				largestFreeIsAccepted(t, be, guard)
			})
		}
	}
}

func largestFreeIsAccepted(t *testing.T, be Backend, guard uint64) {
	d := onSim(sim.New(sim.Config{Capacity: giB, Shadow: guard > 0}))
	p := openPool(t, d, Options{Backend: be, Guard: guard, MaxBytes: 64 * miB, InitialFraction: 48.0 / 1024})
	a, err := p.Alloc(5*miB + 3*kiB)
	require.NoError(t, err)
	b, err := p.Alloc(7 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	s := p.Stats()
	require.Positive(t, s.LargestFree)
	grows := s.Grows
	c, err := p.Alloc(s.LargestFree)
	require.NoError(t, err, "LargestFree %d", s.LargestFree)
	require.Equal(t, grows, p.Stats().Grows, "served without growing")
	checkStep(t, p, d)
	require.NoError(t, p.Free(b))
	require.NoError(t, p.Free(c))
}

func TestACapBelowTheGranularityIsRefused(t *testing.T) {
	for _, be := range pooledBackends {
		_, err := New(sim.New(sim.Config{Capacity: giB}), Options{Backend: be, MaxBytes: miB})
		require.ErrorIs(t, err, ErrBadOptions, be.String())
		require.Contains(t, err.Error(), "granularity")
		// A fraction whose cap is below a page: 1 MiB of 1 GiB, or a
		// 3 MiB share of which the context takes half.
		_, err = New(sim.New(sim.Config{Capacity: giB}), Options{Backend: be, MaxFraction: 1.0 / 1024})
		require.ErrorIs(t, err, ErrBadOptions, be.String())
		require.Contains(t, err.Error(), "MaxFraction")
		_, err = New(sim.New(sim.Config{Capacity: giB, ContextBytes: 200 * miB}), Options{Backend: be, MaxFraction: 3.0 / 1024})
		require.ErrorIs(t, err, ErrBadOptions, be.String())
		require.Contains(t, err.Error(), "granularity")
	}
}

// A pitch probe whose cuMemFree failed (stuck) counts as reserved: the
// request that made it fails with one out-of-memory counted, and the next
// request it keeps past the cap frees it first, then succeeds; Check
// passes throughout and nothing stays mapped after.
func TestPassthroughStuckProbeIsFreedWhenItBlocks(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendPassthrough, MaxBytes: 2 * miB})
	sd.FailNth(device.CallMemFree, 1, nil)
	_, _, err := p.AllocPitch(1030, 2000) // 2,060,000 bytes fit; the pitch's 3,072,000 do not
	require.ErrorIs(t, err, ErrOutOfMemory)
	st := p.Stats()
	require.Equal(t, uint64(1), st.OutOfMemory)
	require.Equal(t, uint64(1536*2000), st.Reserved, "the stuck probe")
	require.NoError(t, p.Check())

	ptr, err := p.Alloc(miB)
	require.NoError(t, err, "the stuck probe freed to make room")
	st = p.Stats()
	require.Equal(t, uint64(1), st.OutOfMemory)
	require.Equal(t, uint64(miB), st.Reserved)
	require.NoError(t, p.Free(ptr))
	checkStep(t, p, d)
	require.Zero(t, sd.Stats().LinearAllocs)
}
