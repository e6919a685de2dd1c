package bench

import (
	"fmt"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/pool"
)

// BenchmarkDeclaredShareMinCap finds, for each trace, the smallest cap
// under which it replays with no failed allocation when the cap is given
// as MaxFraction of a simulated GPU 2.2 times the trace's peak live bytes
// (a fraction near 0.45, which declares the device shared: the pool maps
// handles of a 2048th of its cap, pool/pool.go's declaredShareFraction),
// beside the same cap given as MaxBytes on the same GPU (one-page
// handles). scale=5 multiplies every request by five, as a job filling
// half an H200 would ask (handles then five times larger too). Metrics,
// in basis points (the smallest cap over peak live, less 1, times
// 10,000: 46 is 1.0046, a precision the default three-digit output of
// ratios would lose): mincap-bp with MaxBytes, mincap-fraction-bp with
// MaxFraction (bisection to 2 MiB). One iteration is the whole search;
// run with -benchtime 1x.
func BenchmarkDeclaredShareMinCap(b *testing.B) {
	for _, scale := range []uint64{1, 5} {
		for _, tr := range poolTraces(b) {
			if scale > 1 {
				c := *tr
				c.Ops = append(c.Ops[:0:0], tr.Ops...)
				for i := range c.Ops {
					c.Ops[i].Size *= scale
				}
				tr = &c
			}
			ct := replay.Compile(tr)
			live := tr.PeakLive()
			total := live * 22 / 10
			b.Run(fmt.Sprintf("scale=%d/%s", scale, tr.Name), func(b *testing.B) {
				minCap := func(asFraction bool) uint64 {
					c, _, err := replay.MinCap(live, total*9/10, 2<<20, func(c uint64) (bool, error) {
						o := pool.Options{Backend: pool.BackendVMM}
						if asFraction {
							o.MaxFraction = float64(c) / float64(total)
						} else {
							o.MaxBytes = c
						}
						p, err := pool.New(sim.New(sim.Config{Capacity: total}), o)
						if err != nil {
							return false, err
						}
						defer p.Close()
						r, err := ct.Run(&replay.Pool{P: p})
						return err == nil && r.Failed == 0, err
					})
					if err != nil {
						b.Fatal(err)
					}
					return c
				}
				var bytesCap, fracCap uint64
				for b.Loop() {
					bytesCap, fracCap = minCap(false), minCap(true)
				}
				bp := func(c uint64) float64 { return (float64(c)/float64(live) - 1) * 1e4 }
				b.ReportMetric(bp(bytesCap), "mincap-bp")
				b.ReportMetric(bp(fracCap), "mincap-fraction-bp")
				b.ReportMetric(0, "ns/op")
			})
		}
	}
}
