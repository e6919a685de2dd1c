package bench

import (
	"fmt"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/pool"
)

func TestPoolMemory(t *testing.T) {
	for _, name := range trace.Names() {
		tr, err := trace.Load(name)
		if err != nil {
			t.Fatal(err)
		}
		for _, be := range []pool.Backend{pool.BackendVMM} {
			for _, sl := range []uint{6} {
				for _, rf := range []float64{0.0005, 0.002, 0.005} {
					cacheOff := false
					opts := pool.Options{Backend: be, SLLog2: sl, Cache: pool.CacheOptions{Disable: cacheOff}, ReleaseFraction: rf}
					run := func(cap uint64) (pool.Stats, replay.Result) {
						o := opts
						o.MaxBytes = cap
						sim := device.NewSim(device.SimConfig{})
						p, err := pool.New(sim, o)
						if err != nil {
							t.Fatal(err)
						}
						defer p.Close()
						res, err := replay.Run(tr, replay.Pool{P: p})
						if err != nil {
							t.Fatal(err)
						}
						return p.Stats(), res
					}
					st, res := run(0)
					live := float64(res.PeakLive)
					minCap, runs, err := replay.MinCap(res.PeakLive, st.ReservedPeak, 2<<20, func(c uint64) (bool, error) {
						_, r := run(c)
						return r.Failed == 0, nil
					})
					if err != nil {
						t.Fatal(err)
					}
					fmt.Printf("rf=%.3f %-9s %-7v sl=%d cacheOff=%-5v reserved/live %.4f  mincap/live %.4f (%d runs) grows %d calls %d ns/op %.0f\n", rf,
						name, be, sl, cacheOff, float64(st.ReservedPeak)/live, float64(minCap)/live, runs, st.Grows, st.DeviceCalls.Total(), res.NsPerOp())
				}
			}
		}
	}
}
