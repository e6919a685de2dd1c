package pool

// Placement and sizing options drawn at random (good fit or best fit,
// size classes, the caches' largest size off class boundaries, guard
// zones): the statistics never wrap or drift, whatever the mix of
// requests and streams. Every live block's Size is at least what was
// asked, Allocated is at most what the blocks could hold, and freeing
// everything brings the counts back to zero.

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestRandomPlacementOptionsKeepStatistics(t *testing.T) {
	rapid.Check(t, func(rt *rapid.T) {
		be := rapid.SampledFrom([]Backend{BackendVMM, BackendChunks, BackendPassthrough}).Draw(rt, "backend")
		o := Options{
			Backend: be,
			GoodFit: rapid.Bool().Draw(rt, "goodfit"),
			SLLog2:  rapid.SampledFrom([]uint{0, 1, 3, 6}).Draw(rt, "sllog2"),
			Guard:   rapid.SampledFrom([]uint64{0, 1, 64}).Draw(rt, "guard"),
			Cache: CacheOptions{
				Disable: rapid.Bool().Draw(rt, "cacheoff"),
				MaxSize: rapid.SampledFrom([]uint64{0, 1000, 2600, 4096, 40000, 1 << 20}).Draw(rt, "cachemax"),
			},
			NoScavenger: true,
		}
		sd := sim.New(sim.Config{Capacity: giB, Shadow: o.Guard > 0})
		d := onSim(sd)
		p := openPool(rt, d, o)
		s, err := sd.StreamCreate()
		require.NoError(rt, err)
		defer func() { require.NoError(rt, sd.StreamDestroy(s)) }()
		streams := []device.Stream{0, s}
		live := map[uintptr]uint64{}
		var asked uint64
		for range rapid.IntRange(1, 60).Draw(rt, "ops") {
			if len(live) > 0 && rapid.Bool().Draw(rt, "free") {
				asked -= freeAny(rt, p, live)
			} else {
				n := rapid.SampledFrom([]uint64{1, 255, 2500, 2600, 4096, 4097, 40000, 40001, 300 << 10, 5<<20 + 1000}).Draw(rt, "size")
				st := rapid.SampledFrom(streams).Draw(rt, "stream")
				ptr, err := p.AllocOn(n, st)
				require.NoError(rt, err)
				got, err := p.Size(ptr)
				require.NoError(rt, err)
				require.GreaterOrEqual(rt, got, n, "Size of a %d-byte block", n)
				live[ptr] = n
				asked += n
			}
			stats := p.Stats()
			require.Equal(rt, int64(len(live)), stats.Allocations)
			require.GreaterOrEqual(rt, stats.Allocated, asked, "Allocated counts at least what was asked")
			// A block is its request rounded to a size class at most:
			// 1/2 more with two lists per power of two, 256 bytes at least.
			require.LessOrEqual(rt, stats.Allocated, 2*asked+uint64(len(live))*(256+o.Guard))
			require.NoError(rt, p.Check())
		}
		for ptr := range live {
			require.NoError(rt, p.Free(ptr))
		}
		stats := p.Stats()
		require.Zero(rt, stats.Allocated)
		require.Zero(rt, stats.Allocations)
		require.LessOrEqual(rt, stats.Active, stats.Pending+stats.Cached, "nothing live is active")
		checkStep(rt, p, d)
	})
}
