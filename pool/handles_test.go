package pool

// Physical memory in large handles (vmm.go): one handle per growth,
// one-page handles where memory must move, release of whole handles only.

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

func creates(p *Pool) uint64 { return p.Stats().DeviceCalls[device.CallMemCreate] }

func TestAGrowthMapsOneHandle(t *testing.T) {
	d := onSim(sim.New(sim.Config{})) // an H200's memory: growths of about 35 MiB
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	a, err := p.Alloc(30 * miB)
	require.NoError(t, err)
	s := p.Stats()
	require.Equal(t, uint64(1), creates(p), "one handle for the growth")
	require.Greater(t, s.Reserved, 30*miB)
	require.Equal(t, uint64(1), s.DeviceCalls[device.CallMemSetAccess])
	checkStep(t, p, d)

	// A growth above maxHandlePages pages takes several handles.
	b, err := p.Alloc(300 * miB)
	require.NoError(t, err)
	require.Equal(t, uint64(1+3), creates(p), "300 MiB as handles of at most 128 MiB")
	checkStep(t, p, d)

	// A handle partly in use stays; whole free handles go.
	require.NoError(t, p.Free(b))
	_, err = p.Trim()
	require.NoError(t, err)
	s = p.Stats()
	require.Equal(t, s.Reserved%(2*miB), uint64(0))
	require.GreaterOrEqual(t, s.Reserved, 30*miB, "the handle under a stays mapped")
	require.Less(t, s.Reserved, 300*miB)
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	_, err = p.Trim()
	require.NoError(t, err)
	require.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
}

func TestCappedAndRecyclingPoolsMapOnePageHandles(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"MaxBytes", Options{MaxBytes: 8 * giB}},
		{"MaxFraction", Options{MaxFraction: 0.5}},
		{"ReleaseFraction", Options{ReleaseFraction: 0.03}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{}))
			o := c.opts
			o.Backend = BackendVMM
			p := openPool(t, d, o)
			a, err := p.Alloc(30 * miB)
			require.NoError(t, err)
			s := p.Stats()
			require.Equal(t, s.Reserved/(2*miB), creates(p), "a handle per page")
			checkStep(t, p, d)
			require.NoError(t, p.Free(a))
		})
	}
}
