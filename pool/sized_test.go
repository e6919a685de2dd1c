package pool

// FreeSized and FreeSizedOn: the size is a hint. The right size, no size
// and a wrong size all free the block once, with the same statistics, in
// every backend, caches on and off; a second free of a block is a double
// free whatever the size. (Blocks cached on another P, freed with a wrong
// size: TestAFreeOnAnotherPIsAdopted.)

import (
	"errors"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

func TestASizedFreeTrustsNoSize(t *testing.T) {
	sizes := []uint64{256, 4 * kiB, 64 * kiB, 3 * miB}
	hints := []struct {
		name string
		hint func(size uint64) uint64
	}{
		{"right", func(n uint64) uint64 { return n }},
		{"unknown", func(uint64) uint64 { return 0 }},
		{"too large", func(n uint64) uint64 { return n + 2*miB }},
		{"too small", func(uint64) uint64 { return 1 }},
	}
	for _, be := range allBackends {
		for _, cm := range cacheModes {
			for _, h := range hints {
				t.Run(be.String()+"/"+cm.name+"/"+h.name, func(t *testing.T) {
					sd := sim.New(sim.Config{Capacity: giB})
					d := onSim(sd)
					p := openPool(t, d, Options{Backend: be, Cache: cm.opts()})
					var ptrs []uintptr
					for round := range 3 {
						for _, n := range sizes {
							ptr, err := p.Alloc(n)
							require.NoError(t, err)
							ptrs = append(ptrs, ptr)
						}
						for i, ptr := range ptrs {
							require.NoError(t, p.FreeSized(ptr, h.hint(sizes[i])), "round %d, %d bytes", round, sizes[i])
						}
						ptrs = ptrs[:0]
						checkStep(t, p, d)
					}
					st := p.Stats()
					require.Zero(t, st.Allocations)
					require.Zero(t, st.Allocated)
					require.Equal(t, uint64(3*len(sizes)), st.Frees)

					// A second free is refused whatever its size, and changes
					// nothing.
					ptr, err := p.Alloc(4 * kiB)
					require.NoError(t, err)
					require.NoError(t, p.FreeSized(ptr, 4*kiB))
					before := p.Stats()
					for _, n := range []uint64{4 * kiB, 0, 8 * miB} {
						err := p.FreeSizedOn(ptr, n, 0)
						require.Error(t, err)
						require.True(t, errors.Is(err, ErrDoubleFree) || errors.Is(err, ErrUnknownPointer), "%v", err)
					}
					require.Equal(t, before.Frees, p.Stats().Frees)
					require.Equal(t, before.Allocated, p.Stats().Allocated)
					checkStep(t, p, d)
					require.NoError(t, p.FreeSized(0, 123), "NULL, as FreeOn(0)")
				})
			}
		}
	}
}
