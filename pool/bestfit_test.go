package pool

// Best fit, the default: requests rounded to 256 bytes, best fit in the
// own list; the caches keep their size classes. Options.GoodFit: size
// classes.

import (
	"math/rand/v2"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBestFitBlocksAreRoundedTo256Bytes(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cm.off}})
				size := 5*miB + 1000 // a size class would round it to 5 MiB + 64 KiB
				ptr, err := p.Alloc(size)
				require.NoError(t, err)
				require.Equal(t, roundUp(size, 256), p.Stats().Allocated)
				require.NoError(t, p.Free(ptr))

				// Churn of mixed sizes: every invariant holds at each step.
				r := rand.New(rand.NewPCG(1, 2))
				live := map[uintptr]uint64{}
				var want uint64
				for i := range 2000 {
					if len(live) > 0 && r.IntN(2) == 0 {
						want -= freeAny(t, p, live)
					} else {
						n := uint64(r.IntN(8<<20)) + 1
						ptr, err := p.Alloc(n)
						require.NoError(t, err)
						rn := roundUp(n, 256)
						if !cm.off && n <= p.opts.Cache.MaxSize {
							rn = sizeClass(n)
						}
						live[ptr] = rn
						want += rn
					}
					if i%100 == 0 {
						checkStep(t, p, d)
					}
				}
				require.Equal(t, want, p.Stats().Allocated)
				for ptr := range live {
					require.NoError(t, p.Free(ptr))
				}
				checkStep(t, p, d)
			})
		}
	}
}

func TestGoodFitBlocksKeepTheirSizeClass(t *testing.T) {
	for _, be := range pooledBackends {
		d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
		p := openPool(t, d, Options{Backend: be, GoodFit: true})
		require.Equal(t, uint64(1<<20), p.opts.Cache.MaxSize, "good fit's caches serve blocks of 1 MiB and less")
		for _, size := range []uint64{5*miB + 1000, 300 << 10, 1000} {
			before := p.Stats().Allocated
			ptr, err := p.Alloc(size)
			require.NoError(t, err)
			require.Equal(t, sizeClass(size), p.Stats().Allocated-before, "%d bytes", size)
			n, err := p.Size(ptr)
			require.NoError(t, err)
			require.Equal(t, sizeClass(size), n)
			require.NoError(t, p.Free(ptr))
		}
		checkStep(t, p, d)
	}
}

// With Options.Wilderness a VMM pool keeps the free top of its heap for
// requests no other free block holds: a request that fits a hole and the
// top takes the hole, though larger, and the top stays whole for the next
// growth. Without it, best fit takes the tighter top.
func TestWildernessKeepsTheTopOfTheHeap(t *testing.T) {
	for _, wild := range []bool{false, true} {
		d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
		p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1e-12, Wilderness: wild, Cache: CacheOptions{Disable: true}})
		hole, err := p.Alloc(8 * miB)
		require.NoError(t, err)
		_, err = p.Alloc(miB) // a guard between the hole and the top
		require.NoError(t, err)
		top, err := p.Alloc(4 * miB)
		require.NoError(t, err)
		require.NoError(t, p.Free(top))
		require.NoError(t, p.Free(hole))
		grows := p.Stats().Grows

		ptr, err := p.Alloc(3 * miB)
		require.NoError(t, err)
		if wild {
			require.Equal(t, hole, ptr, "the hole: the top is kept")
		} else {
			require.Equal(t, top, ptr, "best fit: the top, the tighter block")
		}
		require.Equal(t, grows, p.Stats().Grows)
		checkStep(t, p, d)
		require.NoError(t, p.Free(ptr))
		checkStep(t, p, d)
	}
}

// A VMM pool that must grow although a quarter of its memory lies free
// outside the top of its heap, in pieces too small for the request, keeps
// that top from then on as Options.Wilderness does (severeFragmentation);
// one whose free pieces are a smaller share does not.
func TestSevereFragmentationKeepsTheTopFromThenOn(t *testing.T) {
	for _, c := range []struct {
		name   string
		pieces int  // free 8 MiB pieces, each between two live 8 MiB blocks
		keeps  bool // the top kept after the growth
	}{
		{"an eighth free", 1, false},
		{"nearly half free", 8, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
			p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1e-12, Cache: CacheOptions{Disable: true}})
			var live, holes []uintptr
			for i := range 2*c.pieces + 1 {
				ptr, err := p.Alloc(8 * miB)
				require.NoError(t, err)
				if i%2 == 1 {
					holes = append(holes, ptr)
				} else {
					live = append(live, ptr)
				}
			}
			for range max(0, 6-c.pieces) { // more live memory: one piece is an eighth
				ptr, err := p.Alloc(8 * miB)
				require.NoError(t, err)
				live = append(live, ptr)
			}
			for _, h := range holes {
				require.NoError(t, p.Free(h))
			}
			require.False(t, p.x.Wilderness())
			big, err := p.Alloc(16 * miB) // fits no piece: the heap grows
			require.NoError(t, err)
			assert.Equal(t, c.keeps, p.x.Wilderness())
			checkStep(t, p, d)
			require.NoError(t, p.Free(big))
			for _, ptr := range live {
				require.NoError(t, p.Free(ptr))
			}
			checkStep(t, p, d)
		})
	}
}
