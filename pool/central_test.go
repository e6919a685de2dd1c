package pool

// No stranded blocks (cache.go): blocks a P stops using go to the central
// lists, which any P's refill reads before the index, and back to the
// index before the heap grows.

import (
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// cachedSmall allocates and frees n blocks of size bytes, so that they
// end up on the current P's cache, and returns the stats after.
func cachedSmall(t *testing.T, p *Pool, d testDevice, n int, size uint64) Stats {
	t.Helper()
	var ptrs []uintptr
	for range n {
		ptr, err := p.Alloc(size)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
	return p.Stats()
}

func TestIdleCachesDrainToTheCentralListsAndRefillOthers(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be})
			before := cachedSmall(t, p, d, 64, 4*kiB)
			require.Positive(t, before.Cached)

			// Two scans with no cached call between them: every cache is
			// idle (none is the scanner's own: self −1).
			p.mu.Lock()
			p.cache.drainIdle(-1)
			p.cache.drainIdle(-1)
			central := p.cache.centralBytes
			stacks := uint64(0)
			for i := range p.cache.ps {
				stacks += p.cache.ps[i].stackBytes
			}
			p.mu.Unlock()
			require.Zero(t, stacks, "idle caches are drained")
			require.Equal(t, before.Cached, central, "onto the central lists, within the cache budget")
			checkStep(t, p, d)
			s := p.Stats()
			require.Equal(t, before.Cached, s.Cached, "central lists count as cached")

			// A refill on this P takes them back: no new index space.
			ptr, err := p.Alloc(4 * kiB)
			require.NoError(t, err)
			s = p.Stats()
			require.Equal(t, before.IndexFree, s.IndexFree, "served from the central list")
			require.Equal(t, before.Grows, s.Grows)
			require.NoError(t, p.Free(ptr))
			checkStep(t, p, d)
		})
	}
}

func TestCentralBlocksGoBackBeforeTheHeapGrows(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	// 4 MiB up front; 2 MiB of small blocks end up cached, then on the
	// central lists; a 3 MiB request fits only if they come back.
	p := openPool(t, d, Options{Backend: BackendVMM, InitialFraction: 4.0 / 1024, Cache: CacheOptions{MaxSize: miB}})
	require.Equal(t, 4*miB, p.Stats().Reserved)
	before := cachedSmall(t, p, d, 32, 64*kiB)
	require.Positive(t, before.Cached)
	p.mu.Lock()
	p.cache.drainIdle(-1)
	p.cache.drainIdle(-1)
	p.mu.Unlock()
	big, err := p.Alloc(3 * miB)
	require.NoError(t, err)
	s := p.Stats()
	require.Equal(t, before.Grows, s.Grows, "no growth while cached blocks could serve")
	require.Equal(t, 4*miB, s.Reserved)
	require.Zero(t, s.Cached)
	require.NoError(t, p.Free(big))
	checkStep(t, p, d)
}

func TestFreeingABlockOnACentralListIsADoubleFree(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Backend: BackendVMM})
	ptr, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	require.NoError(t, p.Free(ptr))
	p.mu.Lock()
	p.cache.drainIdle(-1)
	p.cache.drainIdle(-1)
	p.mu.Unlock()
	before := p.Stats()
	require.ErrorIs(t, p.Free(ptr), ErrDoubleFree)
	require.Equal(t, withoutCounters(before), withoutCounters(p.Stats()))
	checkStep(t, p, d)
}
