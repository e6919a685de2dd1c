package pool

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	for _, be := range []Backend{BackendVMM, BackendChunks, BackendPassthrough} {
		for _, cacheOff := range []bool{false, true} {
			sim := device.NewSim(device.SimConfig{Capacity: 1 << 30, Shadow: true})
			p, err := New(sim, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff}})
			require.NoError(t, err)
			var ptrs []uintptr
			for i := 0; i < 200; i++ {
				ptr, err := p.Alloc(uint64(1000 + i*7919))
				require.NoError(t, err)
				ptrs = append(ptrs, ptr)
				require.NoError(t, p.Check(), "%v %d", be, i)
			}
			for i, ptr := range ptrs {
				if i%2 == 0 {
					require.NoError(t, p.Free(ptr))
					require.NoError(t, p.Check())
				}
			}
			require.ErrorIs(t, p.Free(ptrs[0]), ErrDoubleFree)
			for i, ptr := range ptrs {
				if i%2 == 1 {
					require.NoError(t, p.Free(ptr))
					require.NoError(t, p.Check())
				}
			}
			st := p.Stats()
			t.Logf("%v cacheOff=%v: %+v", be, cacheOff, st)
			n, err := p.Trim()
			require.NoError(t, err)
			t.Logf("trimmed %d; reserved %d; sim mapped %d", n, p.Stats().Reserved, sim.Mapped())
			require.NoError(t, p.Check())
			require.NoError(t, p.Close())
			require.Zero(t, sim.Mapped())
			require.Empty(t, sim.Violations())
		}
	}
}
