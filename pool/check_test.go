package pool

import (
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/tlsf"
	"github.com/stretchr/testify/require"
)

// A broken invariant of the pool's own bookkeeping is reported by Check as
// tlsf.ErrCorrupt, the sentinel of a broken invariant, with a message
// naming it; a closed pool's Check is ErrClosed.
func TestCheckReportsABrokenInvariantAsErrCorrupt(t *testing.T) {
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			p := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{Backend: be, Cache: CacheOptions{Disable: true}})
			ptr, err := p.Alloc(4096)
			require.NoError(t, err)
			require.NoError(t, p.Check())
			p.mu.Lock()
			p.c.allocated++ // a counter that no longer matches the blocks
			p.mu.Unlock()
			err = p.Check()
			require.ErrorIs(t, err, tlsf.ErrCorrupt)
			require.NotErrorIs(t, err, ErrCorrupted, "ErrCorrupted is for red zones")
			require.Contains(t, err.Error(), "allocated")
			p.mu.Lock()
			p.c.allocated--
			p.mu.Unlock()
			require.NoError(t, p.Check())
			require.NoError(t, p.Free(ptr))
			require.NoError(t, p.Close())
			require.ErrorIs(t, p.Check(), ErrClosed)
		})
	}
}
