package pool

import (
	"math"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// contend makes n calls of op each find the pool's lock held (the test
// holds it until the call is waiting for it), one at a time.
func contend(t *testing.T, p *Pool, n int, op func() error) {
	t.Helper()
	contendWith(t, n, op, p.mu.Lock, p.mu.Unlock)
}

// contendWith is contend with the lock taken and given back by lock and
// unlock.
func contendWith(t *testing.T, n int, op func() error, lock, unlock func()) {
	t.Helper()
	waiting := make(chan struct{})
	testHookContended = func() { waiting <- struct{}{} }
	defer func() { testHookContended = nil }()
	for range n {
		lock()
		done := make(chan error, 1)
		go func() { done <- op() }()
		<-waiting
		unlock()
		require.NoError(t, <-done)
	}
}

// Stats, Check, Size, Trim, Snapshot, ResetPeaks and the scavenger hold
// the lock aside: an allocation or free waiting for them is not
// goroutines contending for memory.
func TestWaitingForWorkAsideEngagesNothing(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{})
	contendWith(t, 4*contentionEngage, func() error {
		ptr, err := p.Alloc(64 * kiB) // never from a cache: always the lock
		if err != nil {
			return err
		}
		return p.Free(ptr)
	}, p.lockAside, p.unlockAside)
	require.False(t, p.Stats().CachesOn)
	checkStep(t, p, d)
}

func TestCachesEngageWhenTheLockIsContended(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be})

			// One goroutine: the caches stay off, and its small blocks
			// come from the index, at best fit's 256-byte rounding.
			var early []uintptr
			for range 64 {
				ptr, err := p.Alloc(1000)
				require.NoError(t, err)
				early = append(early, ptr)
			}
			require.NoError(t, p.Free(early[0]))
			s := p.Stats()
			require.False(t, s.CachesOn)
			require.Zero(t, s.Cached)
			require.Equal(t, uint64(63*1024), s.Allocated)
			checkStep(t, p, d)

			// Contended acquisitions short of contentionEngage, on both
			// paths, spread over more than contentionWindow operations:
			// still off.
			small := func() error {
				ptr, err := p.Alloc(1000)
				if err != nil {
					return err
				}
				return p.Free(ptr)
			}
			contend(t, p, contentionEngage-1, small)
			for range contentionWindow / 2 {
				require.NoError(t, small())
			}
			contend(t, p, contentionEngage-1, small)
			require.False(t, p.Stats().CachesOn)

			// contentionEngage within the window: on, for good.
			engaged := 0
			testHookEngaged = func() { engaged++ }
			defer func() { testHookEngaged = nil }()
			contend(t, p, 1, small)
			require.Equal(t, 1, engaged)
			require.True(t, p.Stats().CachesOn)
			checkStep(t, p, d)

			// A small request now comes from a cache (a refill of 64 KiB
			// of its class), and the blocks allocated before free through
			// the lock as they came.
			ptr, err := p.Alloc(1000)
			require.NoError(t, err)
			s = p.Stats()
			require.Positive(t, s.Cached)
			for _, q := range early[1:] {
				require.NoError(t, p.Free(q))
			}
			require.NoError(t, p.Free(ptr))
			s = p.Stats()
			require.Zero(t, s.Allocated)
			require.Zero(t, s.Allocations)
			checkStep(t, p, d)
			// Requests the caches do not serve still take the lock;
			// contention there engages nothing again.
			contend(t, p, contentionEngage, func() error {
				ptr, err := p.Alloc(64 * kiB)
				if err != nil {
					return err
				}
				return p.Free(ptr)
			})
			require.Equal(t, 1, engaged, "engaged once")
		})
	}
}

func TestCachesStayOffWithEitherKindOfDisable(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Cache: CacheOptions{Disable: true}})
	contend(t, p, 2*contentionEngage, func() error {
		ptr, err := p.Alloc(1000)
		if err != nil {
			return err
		}
		return p.FreeSizedOn(ptr, 1000, 0)
	})
	require.False(t, p.Stats().CachesOn)

	// Best fit with caches for blocks up to 1 MiB: its size classes are
	// coarser than best fit's rounding, so the caches are on from New.
	q := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{Cache: CacheOptions{MaxSize: miB}})
	require.True(t, q.Stats().CachesOn)
	// So with the largest MaxSize, which rounded up to 256 bytes wrapped
	// to 0 and left them off.
	m := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{Cache: CacheOptions{MaxSize: math.MaxUint64}})
	require.True(t, m.Stats().CachesOn)
	// Good fit rounds every block to its class: auto as the default.
	g := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{GoodFit: true})
	require.False(t, g.Stats().CachesOn)
	e := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{Cache: CacheOptions{Eager: true}})
	require.True(t, e.Stats().CachesOn)
}

// Goroutines sharing a pool in the default mode, whether or not they
// contend enough to engage the caches (on one CPU they may not): every
// block comes back, and the pool's books balance.
func TestCachesEngagingUnderLoadLoseNothing(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be})
			var wg sync.WaitGroup
			for g := range 4 {
				wg.Go(func() {
					var held []uintptr
					for i := range 3000 {
						n := uint64(256 + (i*7+g*13)%4096)
						if i%5 == 0 {
							n = 64 * kiB
						}
						ptr, err := p.Alloc(n)
						if err != nil {
							t.Error(err)
							return
						}
						held = append(held, ptr)
						if len(held) > 8 {
							if err := p.FreeSizedOn(held[0], 0, 0); err != nil {
								t.Error(err)
								return
							}
							held = held[1:]
						}
					}
					for _, ptr := range held {
						if err := p.Free(ptr); err != nil {
							t.Error(err)
						}
					}
				})
			}
			wg.Wait()
			s := p.Stats()
			require.Zero(t, s.Allocated)
			require.Zero(t, s.Allocations)
			checkStep(t, p, d)
		})
	}
}
