package bench

import (
	"slices"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/internal/bestfit"
	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/tlsf"
)

// compiled is a trace compiled by the replay harness (IDs to dense
// slots), so that the loop measures the allocator, not a map from IDs to
// addresses, with its peak live bytes.
type compiled struct {
	*replay.Compiled
	peakLive uint64
}

func compile(tb testing.TB, name string) compiled {
	tb.Helper()
	t, err := trace.Load(name)
	if err != nil {
		tb.Fatal(err)
	}
	return compiled{replay.Compile(t), t.PeakLive()}
}

func allTraces(tb testing.TB) []compiled {
	var out []compiled
	for _, n := range trace.Names() {
		out = append(out, compile(tb, n))
	}
	return out
}

// heapSize is the one range each replay runs in: far more than any trace
// needs, so the figure of merit is how high in it the allocator reaches.
const heapSize = 1 << 40

// BenchmarkReplay replays each shared trace through one TLSF index over
// one large range and, beside it, through the address-ordered best-fit
// reference. Each iteration replays the whole trace and then frees the
// blocks it leaves live, so the index is warm (its tables grown) after
// the first, as the peers' warm figures are. Metrics: ns per trace
// operation (an alloc or a free) and top/live, the highest address used
// over peak live bytes. The tlsf-harness variant drives the index through
// the replay harness (replay.Compiled.Run, an interface call per
// operation) and reports the median and minimum per replay: the figure
// BenchmarkPoolReplay's ns/traceop compares with (tlsf-harness places by
// good fit, as the pool with GoodFit does; tlsf-fit-harness by AllocFit,
// the pool's default placement; tlsf-fit-locked-harness is AllocFit with
// each call under a sync.Mutex, the floor of any pool whose requests
// take a lock, so that the pool's own cost is its figure less this one).
func BenchmarkReplay(b *testing.B) {
	for _, c := range allTraces(b) {
		b.Run(c.Name+"/tlsf", func(b *testing.B) {
			addrs := make([]uint64, c.Slots)
			live := make([]bool, c.Slots)
			var top uint64
			x, _ := tlsf.New(tlsf.Config{SLLog2: 6})
			if err := x.AddRegion(0, heapSize); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				for _, op := range c.Ops {
					if op.Free {
						if _, err := x.Free(addrs[op.Slot]); err != nil {
							b.Fatal(err)
						}
						live[op.Slot] = false
						continue
					}
					blk, err := x.Alloc(op.Size)
					if err != nil {
						b.Fatal(err)
					}
					addrs[op.Slot] = blk.Addr
					live[op.Slot] = true
					top = max(top, blk.Addr+blk.Size)
				}
				for s, l := range live {
					if l {
						_, _ = x.Free(addrs[s])
						live[s] = false
					}
				}
			}
			report(b, c, top)
		})
		for _, v := range []struct {
			name        string
			fit, locked bool
		}{{"tlsf-harness", false, false}, {"tlsf-fit-harness", true, false}, {"tlsf-fit-locked-harness", true, true}} {
			b.Run(c.Name+"/"+v.name, func(b *testing.B) {
				x, _ := tlsf.New(tlsf.Config{SLLog2: 6})
				if err := x.AddRegion(0, heapSize); err != nil {
					b.Fatal(err)
				}
				a := &indexAllocator{x: x, fit: v.fit, locked: v.locked}
				warmUp(b, c.Compiled, a)
				reportRuns(b, replayLoop(b, c.Compiled, a))
				b.ReportMetric(float64(a.top)/float64(c.peakLive), "top/live")
			})
		}
		b.Run(c.Name+"/bestfit", func(b *testing.B) {
			addrs := make([]uint64, c.Slots)
			var top uint64
			for b.Loop() {
				a := bestfit.New(256)
				a.AddRegion(0, heapSize)
				for _, op := range c.Ops {
					if op.Free {
						a.Free(addrs[op.Slot])
						continue
					}
					addr, ok := a.Alloc(op.Size)
					if !ok {
						b.Fatal("best fit: no space")
					}
					addrs[op.Slot] = addr
				}
				top = a.Top()
			}
			report(b, c, top)
		})
	}
}

func report(b *testing.B, c compiled, top uint64) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(c.Ops)), "ns/traceop")
	b.ReportMetric(float64(top)/float64(c.peakLive), "top/live")
	b.ReportMetric(0, "ns/op")
}

// indexAllocator is the index alone behind the replay harness's
// interface: the reference BenchmarkPoolReplay's ns/traceop compares
// with (the same loop, one interface call per operation).
type indexAllocator struct {
	x      *tlsf.Index
	fit    bool // AllocFit (the pool's default placement), else Alloc (GoodFit's)
	locked bool // each call under mu, as a pool's locked path is
	mu     sync.Mutex
	top    uint64
}

func (a *indexAllocator) Alloc(size, _ uint64) (uintptr, error) {
	if a.locked {
		a.mu.Lock()
		defer a.mu.Unlock()
	}
	var b tlsf.Block
	var err error
	if a.fit {
		b, err = a.x.AllocFit(size)
	} else {
		b, err = a.x.Alloc(size)
	}
	a.top = max(a.top, b.Addr+b.Size)
	return uintptr(b.Addr), err
}

func (a *indexAllocator) Free(ptr uintptr, _, _ uint64) error {
	if a.locked {
		a.mu.Lock()
		defer a.mu.Unlock()
	}
	_, err := a.x.Free(uint64(ptr))
	return err
}

// replayOnce replays c through a and frees the blocks it leaves live.
func replayOnce(b *testing.B, c *replay.Compiled, a replay.Allocator) replay.Result {
	r, err := c.Run(a)
	if err == nil {
		err = r.FreeLeft(a)
	}
	if err != nil {
		b.Fatal(err)
	}
	return r
}

// warmUp replays c through a untimed until the process spent
// replay.WarmUpTime in such replays, as tlsf-stress does before its warm
// replays.
func warmUp(b *testing.B, c *replay.Compiled, a replay.Allocator) {
	if _, err := c.WarmUp(a, replay.WarmUpTime); err != nil {
		b.Fatal(err)
	}
}

// replayLoop replays c through a once per benchmark iteration
// (replayOnce) and returns each replay's ns per operation.
func replayLoop(b *testing.B, c *replay.Compiled, a replay.Allocator) []float64 {
	var runs []float64
	for b.Loop() {
		runs = append(runs, replayOnce(b, c, a).NsPerOp())
	}
	return runs
}

// reportRuns reports the median and the minimum of per-replay ns per
// trace operation (replay.Median): one replay is noise on a shared
// machine.
func reportRuns(b *testing.B, runs []float64) {
	b.ReportMetric(replay.Median(runs), "ns/traceop")
	b.ReportMetric(slices.Min(runs), "min-ns/traceop")
	b.ReportMetric(0, "ns/op")
}
