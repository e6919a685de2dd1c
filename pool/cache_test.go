package pool

// The per-P caches (cache.go), seen from outside: many goroutines at once
// under the race detector, blocks freed by goroutines other than the one
// that allocated them, cached bytes counted apart, the caches drained on
// the out-of-memory path, Trim and Close; and the same behaviour with the
// caches off.

import (
	"bytes"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// cacheModes: the caches on from New (Eager), off (Disable), and the
// default (auto), which one goroutine never engages: present, not
// serving.
var cacheModes = []cacheMode{{"caches=on", false, false}, {"caches=off", true, false}, {"caches=auto", false, true}}

type cacheMode struct {
	name string
	off  bool
	auto bool
}

// opts is the mode's CacheOptions.
func (cm cacheMode) opts() CacheOptions {
	return CacheOptions{Disable: cm.off, Eager: !cm.off && !cm.auto}
}

// serving reports whether the caches serve requests from New.
func (cm cacheMode) serving() bool { return !cm.off && !cm.auto }

// churnBlock is a block in flight between goroutines, with the word it
// was filled with.
type churnBlock struct {
	ptr uintptr
	n   uint64
	v   uint32
}

func TestManyGoroutinesAllocateAndFreeEachOthersBlocks(t *testing.T) {
	const (
		workers = 8
		rounds  = 1000
	)
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: 4 * giB, Shadow: true})
				d := onSim(sd)
				p := openPool(t, d, Options{Backend: be, Cache: cm.opts()})

				// Each worker hands some of its blocks to the next one,
				// which checks their contents and frees them.
				chans := make([]chan churnBlock, workers)
				for i := range chans {
					chans[i] = make(chan churnBlock, rounds)
				}
				var allocs, frees atomic.Uint64
				var wg sync.WaitGroup
				errs := make(chan error, workers)
				for w := range workers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						errs <- churn(p, sd, w, rounds, chans[w], chans[(w+1)%workers], &allocs, &frees)
					}()
				}
				wg.Wait()
				for range workers {
					require.NoError(t, <-errs)
				}
				// Blocks still in channels: their receivers are done.
				for _, ch := range chans {
					close(ch)
					for b := range ch {
						expectFilled(t, sd, b.ptr, b.n, b.v)
						require.NoError(t, p.Free(b.ptr))
						frees.Add(1)
					}
				}
				checkStep(t, p, d)
				s := p.Stats()
				require.Zero(t, s.Allocated)
				require.Zero(t, s.Allocations)
				require.Zero(t, s.Active)
				require.Equal(t, allocs.Load(), s.Allocs)
				require.Equal(t, frees.Load(), s.Frees)
				require.Equal(t, allocs.Load(), frees.Load())
				if cm.off {
					require.False(t, s.CachesOn)
				}
				if !s.CachesOn { // auto: engaged if the goroutines contended
					require.Zero(t, s.Cached)
				}
				_, err := p.Trim()
				require.NoError(t, err)
				s = p.Stats()
				require.Zero(t, s.Cached)
				require.Zero(t, s.Reserved)
				checkStep(t, p, d)
			})
		}
	}
}

// churn allocates and frees blocks of every size; a quarter of them go to
// the next worker through out, and it frees what arrives through in.
func churn(p *Pool, dev device.Device, w, rounds int, in <-chan churnBlock, out chan<- churnBlock, allocs, frees *atomic.Uint64) error {
	r := rand.New(rand.NewPCG(uint64(w), 42))
	var mine []churnBlock
	// check reads back the first and last KiB of a block (the whole of
	// the shadow test's job; here it catches a block handed out twice).
	check := func(b churnBlock) error {
		n := 4 * wordCount(b.n)
		for _, off := range []uint64{0, n - min(n, kiB)} {
			got := make([]byte, min(n, kiB))
			if err := dev.MemcpyDtoH(got, b.ptr+uintptr(off)); err != nil {
				return err
			}
			if !bytes.Equal(got, wordPattern(uint64(len(got)), b.v)) {
				return fmt.Errorf("block [%#x, +%d) of worker %d clobbered", b.ptr, b.n, b.v>>24)
			}
		}
		return nil
	}
	for i := range rounds {
		// Statistics, Check and Trim run alongside the other workers' calls.
		if i%50 == 0 {
			_ = p.Stats()
		}
		if i%100 == 0 {
			if err := p.Check(); err != nil {
				return fmt.Errorf("Check while others work: %w", err)
			}
		}
		if i%150 == 0 && w == 0 {
			if _, err := p.Trim(); err != nil {
				return err
			}
		}
		var n uint64
		switch k := r.IntN(50); {
		case k < 40:
			n = 1 + r.Uint64N(16*kiB)
		case k < 49:
			n = 1 + r.Uint64N(256*kiB)
		default:
			n = miB + r.Uint64N(2*miB)
		}
		ptr, err := p.Alloc(n)
		if err != nil {
			return err
		}
		allocs.Add(1)
		b := churnBlock{ptr, n, uint32(w)<<24 | uint32(i)}
		if err := dev.MemsetD32(ptr, b.v, wordCount(n)); err != nil {
			return err
		}
		if r.IntN(4) == 0 {
			out <- b
		} else {
			mine = append(mine, b)
		}
		for len(mine) > 8 {
			k := r.IntN(len(mine))
			if err := check(mine[k]); err != nil {
				return err
			}
			if err := p.Free(mine[k].ptr); err != nil {
				return err
			}
			frees.Add(1)
			mine[k] = mine[len(mine)-1]
			mine = mine[:len(mine)-1]
		}
		select {
		case b := <-in:
			if err := check(b); err != nil {
				return err
			}
			if err := p.Free(b.ptr); err != nil {
				return err
			}
			frees.Add(1)
		default:
		}
	}
	for _, b := range mine {
		if err := check(b); err != nil {
			return err
		}
		if err := p.Free(b.ptr); err != nil {
			return err
		}
		frees.Add(1)
	}
	return nil
}

// The test from the caches' issue: with a 64 MiB cap, one goroutine
// allocates 8192 blocks of 4 KiB and frees them all (a 64 KiB block stays
// live); another then requests 48 MiB, which must succeed. The same when
// a third goroutine frees the first one's blocks.
func TestCachesAreDrainedWhenMemoryRunsOut(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			for _, thirdFrees := range []bool{false, true} {
				name := be.String() + "/" + cm.name + map[bool]string{false: "/freed by the allocator", true: "/freed by a third goroutine"}[thirdFrees]
				t.Run(name, func(t *testing.T) {
					sd := sim.New(sim.Config{Capacity: giB})
					d := onSim(sd)
					p := openPool(t, d, Options{Backend: be, MaxBytes: 64 * miB, Cache: cm.opts()})
					// A block of the pool's own stays live, so that it does
					// not start over (which drains the caches too) when the
					// small blocks are all freed.
					keep, err := p.Alloc(64 * kiB)
					require.NoError(t, err)
					blocks := make(chan uintptr, 8192)
					inGoroutine(t, func() error {
						for range 8192 {
							ptr, err := p.Alloc(4 * kiB)
							if err != nil {
								return err
							}
							blocks <- ptr
						}
						close(blocks)
						if thirdFrees {
							return nil
						}
						return freeFromChan(p, blocks)
					})
					if thirdFrees {
						inGoroutine(t, func() error { return freeFromChan(p, blocks) })
					}
					checkStep(t, p, d)
					s := p.Stats()
					require.Equal(t, uint64(64*kiB), s.Allocated)
					if !cm.serving() {
						require.Zero(t, s.Cached)
					} else if !thirdFrees {
						require.Positive(t, s.Cached, "the allocator's frees went to its cache")
					}
					var big uintptr
					inGoroutine(t, func() error {
						var err error
						big, err = p.Alloc(48 * miB)
						return err
					})
					require.LessOrEqual(t, p.Stats().Reserved, 64*miB)
					require.NoError(t, sd.MemsetD32(big, 1, wordCount(48*miB)))
					checkStep(t, p, d)
					require.NoError(t, p.Free(big))
					require.NoError(t, p.Free(keep))
					checkStep(t, p, d)
				})
			}
		}
	}
}

// inGoroutine runs f on a goroutine of its own and waits for it.
func inGoroutine(t *testing.T, f func() error) {
	t.Helper()
	done := make(chan error)
	go func() { done <- f() }()
	require.NoError(t, <-done)
}

func freeFromChan(p *Pool, blocks <-chan uintptr) error {
	for ptr := range blocks {
		if err := p.Free(ptr); err != nil {
			return err
		}
	}
	return nil
}

func TestCachedBytesAreCountedApart(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: giB})
				d := onSim(sd)
				p := openPool(t, d, Options{Backend: be, Cache: cm.opts()})
				var ptrs []uintptr
				for range 100 {
					ptr, err := p.Alloc(4 * kiB)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
				}
				s := p.Stats()
				require.Equal(t, 100*4*kiB, s.Allocated, "blocks the caches handed out are allocated")
				require.Equal(t, int64(100), s.Allocations)
				for _, ptr := range ptrs {
					require.NoError(t, p.Free(ptr))
				}
				checkStep(t, p, d)
				s = p.Stats()
				require.Zero(t, s.Allocated)
				require.Zero(t, s.Allocations)
				require.Zero(t, s.Active, "cached blocks are not active")
				require.Equal(t, uint64(100), s.Frees)
				if !cm.serving() {
					require.Zero(t, s.Cached)
					require.Zero(t, s.CachedBlocks)
				} else {
					require.Positive(t, s.Cached)
					require.Positive(t, s.CachedBlocks)
					require.Zero(t, s.Cached%(4*kiB))
				}
				require.LessOrEqual(t, s.Cached+s.IndexFree, s.Reserved)

				_, err := p.Trim()
				require.NoError(t, err)
				s = p.Stats()
				require.Zero(t, s.Cached, "Trim drains the caches")
				require.Zero(t, s.CachedBlocks)
				require.Zero(t, s.Reserved)
				checkStep(t, p, d)
			})
		}
	}
}

func TestCachesHoldAtMostTheirFractionOfReservedMemory(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			// 256 MiB reserved up front, so that 1/16 of it is well above
			// the least each P may cache.
			p := openPool(t, d, Options{Backend: be, InitialFraction: 0.25, Cache: CacheOptions{Eager: true, MaxFraction: 1.0 / 16}})
			// Live, so that the pool does not start over (and drain the
			// caches) when the small blocks are all freed.
			keep, err := p.Alloc(64 * kiB)
			require.NoError(t, err)
			defer func() { require.NoError(t, p.Free(keep)) }()
			var ptrs []uintptr
			for range 10000 {
				ptr, err := p.Alloc(4 * kiB)
				require.NoError(t, err)
				ptrs = append(ptrs, ptr)
			}
			for _, ptr := range ptrs {
				require.NoError(t, p.Free(ptr))
			}
			s := p.Stats()
			// A refill may add up to 128 KiB to a P's cache at once.
			slack := uint64(runtime.GOMAXPROCS(0)) * 128 * kiB
			require.LessOrEqual(t, s.Cached, s.Reserved/16+slack)
			require.Positive(t, s.Cached)
			checkStep(t, p, d)
		})
	}
}

func TestACachedBlockFreedOnAnotherStreamLeavesItsCache(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			ss := newStreams(t, sd, 1)
			p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Eager: true}})
			x, err := p.Alloc(4 * kiB) // handed out by a cache
			require.NoError(t, err)
			y, err := p.Alloc(4 * kiB)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, ss[0]), "the locked path takes it back from its cache")
			require.ErrorIs(t, p.FreeOn(x, ss[0]), ErrDoubleFree)
			require.ErrorIs(t, p.Free(x), ErrDoubleFree)
			// Inside a freed block: a double free where the block is back
			// in the index, an unknown pointer while it awaits its event.
			require.True(t, errors.Is(p.Free(x+256), ErrDoubleFree) || errors.Is(p.Free(x+256), ErrUnknownPointer))
			require.ErrorIs(t, p.Free(y+256), ErrUnknownPointer, "inside a live block")
			s := p.Stats()
			require.Equal(t, int64(1), s.Allocations)
			require.Equal(t, 4*kiB, s.Allocated)
			checkStep(t, p, d)
			require.NoError(t, p.Free(y))
			require.ErrorIs(t, p.Free(y), ErrDoubleFree, "a block back in its cache")
			checkStep(t, p, d)
		})
	}
}

// Caches are made per P at New; a P added later is served without a cache
// (cache.go's fallbacks), and blocks still move between them correctly.
func TestCachesStayCorrectWhenGOMAXPROCSGrows(t *testing.T) {
	old := runtime.GOMAXPROCS(1)
	defer runtime.GOMAXPROCS(old)
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Eager: true}})
	runtime.GOMAXPROCS(8)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs <- func() error {
				for range 100 {
					var ps []uintptr
					for range 20 {
						x, err := p.Alloc(4 * kiB)
						if err != nil {
							return err
						}
						ps = append(ps, x)
					}
					for _, x := range ps {
						if err := p.Free(x); err != nil {
							return err
						}
					}
				}
				return nil
			}()
		}()
	}
	wg.Wait()
	for range 8 {
		require.NoError(t, <-errs)
	}
	checkStep(t, p, d)
	s := p.Stats()
	require.Zero(t, s.Allocated)
	require.Equal(t, s.Allocs, s.Frees)
	_, err := p.Trim()
	require.NoError(t, err)
	require.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
}

// A Close whose caches cannot hand their blocks back (the driver can
// neither record the frees' events nor synchronize) still closes: the
// blocks go with the heap, and no later call finds memory in a cache.
func TestCloseWithAFailingDrainLeavesNothingCached(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	p, err := New(sd, Options{Cache: CacheOptions{Eager: true}})
	require.NoError(t, err)
	s, err := sd.StreamCreate()
	require.NoError(t, err)
	x, err := p.AllocOn(miB, s) // a second stream: multi-stream mode
	require.NoError(t, err)
	require.NoError(t, p.FreeOn(x, s))
	ptr, err := p.Alloc(4 * kiB) // cached blocks on this P
	require.NoError(t, err)
	require.NoError(t, p.Free(ptr))
	require.NotZero(t, p.Stats().Cached)

	sd.FailRate(device.CallEventRecord, 1, nil)
	sd.FailRate(device.CallStreamSynchronize, 1, nil)
	require.Error(t, p.Close(), "the drain's failures are reported")
	sd.ClearFaults()

	_, err = p.Alloc(4 * kiB)
	require.ErrorIs(t, err, ErrClosed)
	require.ErrorIs(t, p.Free(ptr), ErrClosed)
	require.ErrorIs(t, p.Close(), ErrClosed)
	require.NoError(t, sd.StreamDestroy(s))
}

// A block allocated on one goroutine's P and freed on another's goes to
// the freeing P's cache, which serves it again without the pool's lock.
func TestAFreeOnAnotherPIsAdopted(t *testing.T) {
	// Unsized, and sized with a size above the caches' filter (a wrong
	// hint): the locked path finds each block cached either way.
	frees := map[string]func(p *Pool, ptr uintptr) error{
		"Free":             func(p *Pool, ptr uintptr) error { return p.Free(ptr) },
		"FreeSized(1 MiB)": func(p *Pool, ptr uintptr) error { return p.FreeSizedOn(ptr, 1*miB, 0) },
	}
	for name, free := range frees {
		t.Run(name, func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			p := openPool(t, onSim(sd), Options{Cache: CacheOptions{Eager: true}})
			const n = 64
			ptrs := make(chan uintptr, n)
			go func() {
				for range n {
					ptr, err := p.Alloc(4 * kiB)
					if err != nil {
						t.Error(err)
					}
					ptrs <- ptr
				}
				close(ptrs)
			}()
			for ptr := range ptrs {
				require.NoError(t, free(p, ptr))
			}
			checkStep(t, p, onSim(sd))
			st := p.Stats()
			require.Zero(t, st.Allocations)
			require.Equal(t, uint64(n), st.Frees)
		})
	}
}

// The small-block filter has a bit per 64 KiB of a VMM pool's range: a
// large block that starts on a page holding cached blocks, but outside
// their 64 KiB, is known not to be cached (its free skips the probe of
// the P's table), and the filter of a very large range stays small.
func TestTheSmallBlockFilterIsFinerThanAPage(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	p := openPool(t, onSim(sd), Options{Backend: BackendVMM, GrowFraction: 1e-12, Cache: CacheOptions{Eager: true}})
	c := p.cache
	require.Equal(t, uint(smallGranuleLog2), c.smallShift)
	small, err := p.Alloc(4 * kiB) // a refill: 16 blocks of 4 KiB, 64 KiB
	require.NoError(t, err)
	big, err := p.Alloc(256 * kiB)
	require.NoError(t, err)
	page := p.heap.granularity()
	require.Equal(t, uint64(small)/page, uint64(big)/page, "both on one page")
	require.True(t, c.maybeCached(small))
	require.False(t, c.maybeCached(big), "a block 64 KiB or more above the refill's")
	require.NoError(t, p.Free(big))
	require.NoError(t, p.Free(small))
	checkStep(t, p, onSim(sd))

	// 4 TiB of range: granules of 512 KiB, 2^23 bits.
	q := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{Backend: BackendVMM, VirtualSize: 1 << 42, Cache: CacheOptions{Eager: true}})
	require.Equal(t, uint(19), q.cache.smallShift)
	require.Len(t, q.cache.small, 1<<smallFilterLog2/64)
}
