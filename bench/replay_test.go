package bench

import (
	"testing"

	"github.com/gpumem/tlsf/internal/bestfit"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/tlsf"
)

// compiled is a trace with block IDs turned into dense slots, so that the
// replay loop measures the allocator, not a map from IDs to addresses.
type compiled struct {
	name     string
	ops      []cop
	slots    int
	peakLive uint64
}

type cop struct {
	free bool
	slot int32
	size uint64
}

func compile(tb testing.TB, name string) compiled {
	tb.Helper()
	t, err := trace.Load(name)
	if err != nil {
		tb.Fatal(err)
	}
	c := compiled{name: name, peakLive: t.PeakLive()}
	slot := map[uint64]int32{}
	var spare []int32
	for _, op := range t.Ops {
		if !op.Free {
			var s int32
			if k := len(spare); k > 0 {
				s, spare = spare[k-1], spare[:k-1]
			} else {
				s = int32(c.slots)
				c.slots++
			}
			slot[op.ID] = s
			c.ops = append(c.ops, cop{slot: s, size: op.Size})
			continue
		}
		s := slot[op.ID]
		delete(slot, op.ID)
		spare = append(spare, s)
		c.ops = append(c.ops, cop{free: true, slot: s})
	}
	return c
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
// over peak live bytes.
func BenchmarkReplay(b *testing.B) {
	for _, c := range allTraces(b) {
		b.Run(c.name+"/tlsf", func(b *testing.B) {
			addrs := make([]uint64, c.slots)
			live := make([]bool, c.slots)
			var top uint64
			x, _ := tlsf.New(tlsf.Config{SLLog2: 6})
			if err := x.AddRegion(0, heapSize); err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				for _, op := range c.ops {
					if op.free {
						if _, err := x.Free(addrs[op.slot]); err != nil {
							b.Fatal(err)
						}
						live[op.slot] = false
						continue
					}
					blk, err := x.Alloc(op.size)
					if err != nil {
						b.Fatal(err)
					}
					addrs[op.slot] = blk.Addr
					live[op.slot] = true
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
		b.Run(c.name+"/bestfit", func(b *testing.B) {
			addrs := make([]uint64, c.slots)
			var top uint64
			for b.Loop() {
				a := bestfit.New(256)
				a.AddRegion(0, heapSize)
				for _, op := range c.ops {
					if op.free {
						a.Free(addrs[op.slot])
						continue
					}
					addr, ok := a.Alloc(op.size)
					if !ok {
						b.Fatal("best fit: no space")
					}
					addrs[op.slot] = addr
				}
				top = a.Top()
			}
			report(b, c, top)
		})
	}
}

func report(b *testing.B, c compiled, top uint64) {
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/float64(len(c.ops)), "ns/traceop")
	b.ReportMetric(float64(top)/float64(c.peakLive), "top/live")
	b.ReportMetric(0, "ns/op")
}
