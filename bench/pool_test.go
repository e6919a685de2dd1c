package bench

import (
	"fmt"
	"math/rand/v2"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/pool"
)

func newSimPool(tb testing.TB, o pool.Options) *pool.Pool {
	tb.Helper()
	p, err := pool.New(sim.New(sim.Config{}), o)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = p.Close() })
	return p
}

// BenchmarkPoolReplay replays each shared trace, and those of
// bench/traces (recorded after the policy was tuned), through a pool on
// the simulated H200, for each pooled backend with default options (one
// goroutine: the caches stay off), for VMM with ReleaseFraction 0.03
// ("vmm-rf0.03", the memory-tight policy), for VMM with GoodFit and its
// caches for blocks of 1 MiB and less ("vmm-goodfit-c1m", the default
// before best fit), for VMM with Wilderness ("vmm-wilderness") and for
// VMM with its per-P caches on from the start ("vmm-caches",
// CacheOptions.Eager: what they save a single goroutine, and cost in
// reserved memory). Metrics:
//   - reserved/live: peak reserved over peak live bytes, no cap, cold;
//   - warm-reserved/live: the same over the cold replay, the warm-up and
//     the warm ones after it on the timed pool: the figure the peers
//     report (their loops replay 10 times), and tlsf-stress replay's. A VMM pool whose
//     every block is freed between replays starts over (Pool.startOver),
//     so its warm replays place blocks as the cold one did and the two
//     figures agree; before it did, a warm replay started on one free
//     block as large as the first replay's peak (lstm 1.032 cold, 1.062
//     warm on the simulated H200);
//   - mincap/live: the smallest MaxBytes under which the replay has no
//     failed allocation (bisection to 2 MiB), over peak live;
//   - ns/traceop and min-ns/traceop: the median and the minimum over the
//     iterations of the wall time per trace operation of one replay on the
//     same pool after a first replay and untimed ones until the process
//     spent 1 s in such replays (replay.WarmUpTime, as tlsf-stress does;
//     the blocks a replay leaves live are freed between replays,
//     untimed); the simulated driver time is not slept. Compare with BenchmarkReplay's tlsf-harness variant;
//   - calls/traceop: driver calls per operation, warm.
func BenchmarkPoolReplay(b *testing.B) {
	for _, tr := range poolTraces(b) {
		name := tr.Name
		ct := replay.Compile(tr)
		for _, cfg := range []struct {
			name string
			opts pool.Options
		}{
			{"vmm", pool.Options{Backend: pool.BackendVMM}},
			{"vmm-rf0.03", pool.Options{Backend: pool.BackendVMM, ReleaseFraction: 0.03}},
			{"vmm-goodfit-c1m", pool.Options{Backend: pool.BackendVMM, GoodFit: true, Cache: pool.CacheOptions{Eager: true}}},
			{"vmm-wilderness", pool.Options{Backend: pool.BackendVMM, Wilderness: true}},
			{"vmm-caches", pool.Options{Backend: pool.BackendVMM, Cache: pool.CacheOptions{Eager: true}}},
			{"chunks", pool.Options{Backend: pool.BackendChunks}},
		} {
			b.Run(name+"/"+cfg.name, func(b *testing.B) {
				run := func(cap uint64) (pool.Stats, replay.Result) {
					o := cfg.opts
					o.MaxBytes = cap
					p := newSimPool(b, o)
					res, err := ct.Run(&replay.Pool{P: p})
					if err != nil {
						b.Fatal(err)
					}
					st := p.Stats()
					_ = p.Close()
					return st, res
				}
				st, res := run(0)
				live := float64(res.PeakLive)
				minCap, _, err := replay.MinCap(res.PeakLive, st.ReservedPeak, 2<<20, func(c uint64) (bool, error) {
					_, r := run(c)
					return r.Failed == 0, nil
				})
				if err != nil {
					b.Fatal(err)
				}

				p := newSimPool(b, cfg.opts)
				a := &replay.Pool{P: p}
				replayOnce(b, ct, a) // cold
				warmUp(b, ct, a)
				before := p.Stats().DeviceCalls
				runs := replayLoop(b, ct, a)
				after := p.Stats().DeviceCalls
				reportRuns(b, runs)
				b.ReportMetric(float64(p.Stats().ReservedPeak)/live, "warm-reserved/live")
				b.ReportMetric(float64(after.Total()-before.Total())/float64(b.N)/float64(len(tr.Ops)), "calls/traceop")
				b.ReportMetric(float64(st.ReservedPeak)/live, "reserved/live")
				b.ReportMetric(float64(minCap)/live, "mincap/live")
			})
		}
	}
}

// poolTraces returns the embedded traces, then those of bench/traces.
func poolTraces(tb testing.TB) []*trace.Trace {
	var out []*trace.Trace
	for _, name := range trace.Names() {
		tr, err := trace.Load(name)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, tr)
	}
	files, _ := filepath.Glob("traces/*.trace.gz") // the pattern is valid
	if len(files) == 0 {
		tb.Fatal("no traces in bench/traces")
	}
	for _, f := range files {
		tr, err := trace.ParseFile(f)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, tr)
	}
	return out
}

// BenchmarkSmallAllocFree is one Alloc and one Free of a 4 KiB block on
// one goroutine: the per-P cache's fast path (cached: on from New)
// against the pool's lock (locked: caches off; auto: the default, which
// one goroutine never engages).
func BenchmarkSmallAllocFree(b *testing.B) {
	for _, mode := range []struct {
		name  string
		cache pool.CacheOptions
	}{{"cached", pool.CacheOptions{Eager: true}}, {"locked", pool.CacheOptions{Disable: true}}, {"auto", pool.CacheOptions{}}} {
		b.Run(mode.name, func(b *testing.B) {
			p := newSimPool(b, pool.Options{Cache: mode.cache})
			for b.Loop() {
				ptr, err := p.Alloc(4096)
				if err != nil {
					b.Fatal(err)
				}
				if err := p.Free(ptr); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkSmallParallel runs 1, 2, 4, 8 and 16 goroutines (GOMAXPROCS
// set to match) each allocating and freeing small blocks of mixed sizes
// (256 B to 64 KiB, 16 live per goroutine), caches on beside caches off.
// Metric: Mops/s, pairs of Alloc and Free per second across goroutines.
//
// Each iteration is 16 pairs, and each goroutine keeps its state (random
// source, live blocks) in a struct padded to its own cache lines: with one
// pair per iteration, the writes of testing.PB's counters and of random
// sources that neighbour each other in memory cost more than the pool.
func BenchmarkSmallParallel(b *testing.B) {
	const pairs = 16
	for _, g := range []int{1, 2, 4, 8, 16} {
		for _, mode := range []struct {
			name string
			off  bool
		}{{"cached", false}, {"locked", true}} {
			b.Run(fmt.Sprintf("goroutines=%d/%s", g, mode.name), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(g))
				p := newSimPool(b, pool.Options{Cache: pool.CacheOptions{Disable: mode.off, Eager: !mode.off}})
				b.SetParallelism(1)
				b.RunParallel(func(pb *testing.PB) {
					w := &worker{}
					w.pcg.Seed(rand.Uint64(), 1)
					r := rand.New(&w.pcg)
					for pb.Next() {
						for range pairs {
							i := r.IntN(len(w.live))
							if w.live[i] != 0 {
								if err := p.Free(w.live[i]); err != nil {
									b.Error(err)
									return
								}
							}
							ptr, err := p.Alloc(uint64(256) << r.IntN(9))
							if err != nil {
								b.Error(err)
								return
							}
							w.live[i] = ptr
						}
					}
					for _, ptr := range w.live {
						if ptr != 0 {
							_ = p.Free(ptr)
						}
					}
				})
				b.ReportMetric(float64(b.N)*pairs/b.Elapsed().Seconds()/1e6, "Mops/s")
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/pairs, "ns/pair")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}

// worker is one goroutine's state in BenchmarkSmallParallel, on cache
// lines of its own.
type worker struct {
	_    [64]byte
	pcg  rand.PCG
	live [16]uintptr
	_    [64]byte
}

// BenchmarkSmallPairsOneHeld runs GOMAXPROCS goroutines (2 and 4), each
// allocating and freeing one 4 KiB block at a time, while one more 4 KiB
// block stays live and the pool's last large block was freed: the pool
// would start over (Pool.startOver) when the held block is freed, and the
// other Ps' frees, each of which empties its cache's table of live
// blocks, must not each take the pool's lock to find out that it cannot
// yet. Compare with the held=false variant (no large block freed).
func BenchmarkSmallPairsOneHeld(b *testing.B) {
	for _, g := range []int{2, 4} {
		for _, held := range []bool{false, true} {
			b.Run(fmt.Sprintf("goroutines=%d/held=%v", g, held), func(b *testing.B) {
				defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(g))
				p := newSimPool(b, pool.Options{Backend: pool.BackendVMM})
				if held {
					small, err := p.Alloc(4096)
					if err != nil {
						b.Fatal(err)
					}
					defer func() { _ = p.Free(small) }()
					large, err := p.Alloc(64 << 20)
					if err != nil {
						b.Fatal(err)
					}
					if err := p.Free(large); err != nil {
						b.Fatal(err)
					}
				}
				b.SetParallelism(1)
				b.RunParallel(func(pb *testing.PB) {
					for pb.Next() {
						ptr, err := p.Alloc(4096)
						if err != nil {
							b.Error(err)
							return
						}
						if err := p.Free(ptr); err != nil {
							b.Error(err)
							return
						}
					}
				})
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N), "ns/pair")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
