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
				p := openPool(t, d, Options{Backend: be, Cache: cm.opts()})
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
						if cm.serving() && n <= p.opts.Cache.MaxSize {
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
		// 5 MiB + 1000 twice: the first grows the heap (the slow path),
		// the second is served from the index (AllocOn's fast path).
		for _, size := range []uint64{5*miB + 1000, 5*miB + 1000, 2*miB + 1, 300 << 10, 1000} {
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
// outside the top of its heap, in pieces that would hold the request but
// none of them alone, keeps that top as Options.Wilderness does
// (severeFragmentation) until it starts over
// (TestAStartOverForgetsTheKeptTop), and says so in Stats.TopKept; one whose
// free pieces are a smaller share, or too small together, does not.
// Pages released under the free top (Trim) are not counted twice.
func TestSevereFragmentationKeepsTheTop(t *testing.T) {
	for _, c := range []struct {
		name   string
		pieces int    // free 8 MiB pieces, each between two live 8 MiB blocks
		extra  int    // more live 8 MiB blocks after them
		top    uint64 // a block at the top, freed and trimmed before the pieces are freed
		req    uint64 // more than a piece, or the top, holds
		keeps  bool   // the top kept after the growth
	}{
		{"pieces too small together", 1, 7, 0, 12 * miB, false},
		{"a sixth free", 2, 7, 0, 12 * miB, false},
		{"nearly half free", 8, 0, 0, 12 * miB, true},
		{"nearly half free, the top released", 8, 0, 56 * miB, 60 * miB, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
			p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1e-12, Cache: CacheOptions{Disable: true}, NoScavenger: true})
			live, holes := eightMiBBlocks(t, p, 2*c.pieces+1+c.extra, c.pieces)
			if c.top > 0 {
				top, err := p.Alloc(c.top)
				require.NoError(t, err)
				require.NoError(t, p.Free(top))
				_, err = p.Trim()
				require.NoError(t, err)
			}
			for _, h := range holes {
				require.NoError(t, p.Free(h))
			}
			require.False(t, p.Stats().TopKept)
			big, err := p.Alloc(c.req) // the heap grows
			require.NoError(t, err)
			assert.Equal(t, c.keeps, p.Stats().TopKept)
			checkStep(t, p, d)
			require.NoError(t, p.Free(big))
			for _, ptr := range live {
				require.NoError(t, p.Free(ptr))
			}
			checkStep(t, p, d)
		})
	}
}

// A heap that starts over (every block freed) places as a new pool's
// does, so it forgets that it kept its top: the next run of the same work
// keeps the top from the same growth on as the first run did, its
// growths now served by standby pages (growFromStandby) or by those and
// new ones (growAndSearch), standby pages not counted as the heap's
// memory. With Options.Wilderness the top stays kept.
func TestAStartOverForgetsTheKeptTop(t *testing.T) {
	for _, c := range []struct {
		name  string
		holes int    // of 17 blocks of 8 MiB, the first odd ones freed
		req   uint64 // then allocated: the heap grows, fragmented
		again uint64 // the second run's req (0: req)
		after uint64 // allocated last in the first run: standby pages beyond the growth
		wild  bool
	}{
		{"the same run again", 8, 12 * miB, 0, 0, false},
		{"standby pages beyond the growth", 8, 12 * miB, 0, 200 * miB, false},
		// 40 MiB free outside the top: a quarter of the 136 MiB heap, but
		// not of 168 MiB, the heap with the 32 MiB of standby pages the
		// growth takes back before it maps 8 MiB more.
		{"a growth beyond the standby pages", 5, 32 * miB, 40 * miB, 0, false},
		{"Options.Wilderness", 8, 12 * miB, 0, 0, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
			p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1e-12, Wilderness: c.wild, Cache: CacheOptions{Disable: true}, NoScavenger: true})
			run := func(first bool) []uintptr {
				placed, holes := eightMiBBlocks(t, p, 17, c.holes)
				for _, h := range holes {
					require.NoError(t, p.Free(h))
				}
				require.Equal(t, c.wild, p.Stats().TopKept, "before the growth")
				req := c.req
				if !first && c.again > 0 {
					req = c.again
				}
				big, err := p.Alloc(req)
				require.NoError(t, err)
				require.True(t, p.Stats().TopKept, "after the growth")
				placed = append(placed, big)
				if first && c.after > 0 {
					ptr, err := p.Alloc(c.after)
					require.NoError(t, err)
					placed = append(placed, ptr)
				}
				checkStep(t, p, d)
				for _, ptr := range placed {
					require.NoError(t, p.Free(ptr))
				}
				checkStep(t, p, d)
				require.Equal(t, c.wild, p.Stats().TopKept, "after the start-over")
				return placed
			}
			first := run(true)
			reserved := p.Stats().Reserved
			second := run(false)
			if c.after == 0 && c.again == 0 {
				assert.Equal(t, first, second, "the second run places as the first")
				assert.Equal(t, reserved, p.Stats().Reserved, "no growth beyond the first run's")
			}
		})
	}
}

// A heap that skips its start-over (startOverIsNoOp: no larger than its
// next growth) forgets a kept top as one that starts over does.
func TestASkippedStartOverForgetsTheKeptTop(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 0.25, MaxBytes: 136 * miB, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	all, holes := eightMiBBlocks(t, p, 17, 8)
	for _, h := range holes {
		require.NoError(t, p.Free(h))
	}
	require.NoError(t, p.SetMaxBytes(148*miB))
	big, err := p.Alloc(12 * miB) // the heap grows, fragmented, up to the cap
	require.NoError(t, err)
	require.True(t, p.Stats().TopKept)
	for _, ptr := range append(all, big) {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
	p.mu.Lock()
	skipped := p.vmm.standby == 0 && p.startOverIsNoOp()
	p.mu.Unlock()
	require.True(t, skipped, "the heap stayed as it was")
	assert.False(t, p.Stats().TopKept)
}

// eightMiBBlocks allocates n blocks of 8 MiB from p in turn and returns
// the odd ones among the first 2×holes (to be freed: holes between live
// blocks) apart from the others.
func eightMiBBlocks(t *testing.T, p *Pool, n, holes int) (live, odd []uintptr) {
	t.Helper()
	for i := range n {
		ptr, err := p.Alloc(8 * miB)
		require.NoError(t, err)
		if i%2 == 1 && i < 2*holes {
			odd = append(odd, ptr)
		} else {
			live = append(live, ptr)
		}
	}
	return live, odd
}
