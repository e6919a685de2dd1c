package pool

// A VMM pool whose every block is freed starts over (startOver): its pages
// stay mapped on standby and the next growths take them back bottom-up,
// as a new pool's growths mapped them, with no driver call.

import (
	"math/rand/v2"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// startOverRun allocates and frees blocks of 8 KiB to 24 MiB from a fixed
// seed, then frees what is left, and returns the pointers in order.
func startOverRun(t *testing.T, p *Pool, d testDevice) []uintptr {
	t.Helper()
	r := rand.New(rand.NewPCG(7, 11))
	var out, live []uintptr
	for range 400 {
		if len(live) > 0 && r.IntN(3) == 0 {
			k := r.IntN(len(live))
			require.NoError(t, p.Free(live[k]))
			live = append(live[:k], live[k+1:]...)
			continue
		}
		ptr, err := p.Alloc(8<<10 + r.Uint64N(24<<20))
		require.NoError(t, err)
		out = append(out, ptr)
		live = append(live, ptr)
	}
	for _, ptr := range live {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
	return out
}

func TestAPoolWhoseBlocksAreAllFreedStartsOver(t *testing.T) {
	for _, cm := range cacheModes {
		t.Run(cm.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
			p := openPool(t, d, Options{Cache: CacheOptions{Disable: cm.off}})
			first := startOverRun(t, p, d)
			s := p.Stats()
			require.Zero(t, s.Allocated)
			require.Positive(t, s.Reserved)
			require.Equal(t, s.Reserved, s.IndexFree, "standby pages count as free")
			require.Equal(t, s.Reserved, s.LargestFree)
			require.Zero(t, s.Fragmentation)
			require.Equal(t, 1, s.FreeBlocks)
			require.Equal(t, s.Reserved/p.vmm.gran, p.vmm.standby)

			snap, err := p.Snapshot()
			require.NoError(t, err)
			var segs, blocks uint64
			for _, sg := range snap.Segments {
				segs += sg.Size
				for _, b := range sg.Blocks {
					blocks += b.Size
				}
			}
			require.Equal(t, s.Reserved, segs)
			require.Equal(t, s.Reserved, blocks, "the segments' blocks cover them")

			// The same run again: the same blocks, and no driver call.
			second := startOverRun(t, p, d)
			require.Equal(t, first, second)
			after := p.Stats()
			require.Equal(t, s.DeviceCalls.Total(), after.DeviceCalls.Total())
			require.Equal(t, s.Reserved, after.ReservedPeak)
		})
	}
}

func TestADoubleFreeAfterStartingOverIsReported(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
	p := openPool(t, d, Options{})
	a, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Free(b))
	require.Positive(t, p.vmm.standby)
	before := p.Stats()
	require.ErrorIs(t, p.Free(b), ErrDoubleFree)
	require.ErrorIs(t, p.Free(a), ErrDoubleFree)
	require.Equal(t, before, p.Stats())
	checkStep(t, p, d)
}

func TestALiveBlockKeepsThePoolFromStartingOver(t *testing.T) {
	for _, size := range []uint64{4 * kiB, 8 * miB} { // cached, and the pool's own
		d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
		p := openPool(t, d, Options{})
		keep, err := p.Alloc(size)
		require.NoError(t, err)
		startOverRun(t, p, d)
		require.Zero(t, p.vmm.standby)
		require.NoError(t, p.Free(keep))
		require.Positive(t, p.vmm.standby, "the last free starts over")
		checkStep(t, p, d)
	}
}

func TestTrimReturnsStandbyPages(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
	p := openPool(t, d, Options{})
	startOverRun(t, p, d)
	reserved := p.Stats().Reserved
	require.Positive(t, p.vmm.standby)
	n, err := p.Trim()
	require.NoError(t, err)
	require.Equal(t, reserved, n)
	require.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
	// And the pool still serves.
	ptr, err := p.Alloc(64 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(ptr))
	checkStep(t, p, d)
}
