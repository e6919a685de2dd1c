package pool

import (
	"testing"
	"time"

	"github.com/gpumem/tlsf/device/sim"
)

// BenchmarkNewcomerWait: on a simulated H200 whose driver calls take
// their modelled time (sim.Config.RealTime, contexts modelled), job A
// (default options but its cap) fills the device to 92% with blocks of
// 1 KiB to 5 GiB, frees them (all, or every other one), and goes idle;
// after pause, job B (default options) asks for frac of the device every
// 5 ms. Reported: ms from B's first request to its first success
// (ms-to-memory), and A's memory returned by the scavenger (GiB-returned).
// One iteration takes pause plus the wait: run with -benchtime 1x.
func BenchmarkNewcomerWait(b *testing.B) {
	for _, c := range []struct {
		name     string
		maxBytes uint64
		pause    time.Duration
		frac     float64
		keepHalf bool
	}{
		{"idle-2s/half", 0, 2 * time.Second, 0.5, false},
		{"idle-0s/half", 0, 0, 0.5, false},
		{"idle-0s/85pct", 0, 0, 0.85, false},
		{"idle-0s/half/capped", 130 * giB, 0, 0.5, false},
		{"idle-2s/40pct/half-live", 0, 2 * time.Second, 0.4, true},
	} {
		b.Run(c.name, func(b *testing.B) {
			var wait, returned float64
			for range b.N {
				w, r := newcomerWait(b, c.maxBytes, c.pause, c.frac, c.keepHalf)
				wait += w
				returned += r
			}
			b.ReportMetric(wait/float64(b.N), "ms-to-memory")
			b.ReportMetric(returned/float64(b.N), "GiB-returned")
			b.ReportMetric(0, "ns/op")
		})
	}
}

func newcomerWait(b *testing.B, maxBytes uint64, pause time.Duration, frac float64, keepHalf bool) (ms, gib float64) {
	sa := sim.New(sim.Config{RealTime: true, ContextBytes: sim.H200ContextBytes})
	a, err := New(sa, Options{MaxBytes: maxBytes})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Close()
	sizes := []uint64{1 << 10, 3 << 10, 40 << 10, 100 << 10, 2<<20 + 5, 17<<20 + 5, 64 << 20, 256 << 20, 700 << 20, giB, 5 * giB}
	var ptrs []uintptr
	for i := 0; ; i++ {
		free, total, err := sa.MemGetInfo()
		if err != nil {
			b.Fatal(err)
		}
		if float64(free) < 0.08*float64(total) {
			break
		}
		ptr, err := a.Alloc(sizes[i%len(sizes)])
		if err != nil {
			break
		}
		ptrs = append(ptrs, ptr)
	}
	for i, ptr := range ptrs {
		if keepHalf && i%2 == 0 {
			continue
		}
		if err := a.Free(ptr); err != nil {
			b.Fatal(err)
		}
	}
	time.Sleep(pause)
	sb := sa.NewProcess()
	p, err := New(sb, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer p.Close()
	_, total, err := sb.MemGetInfo()
	if err != nil {
		b.Fatal(err)
	}
	start := time.Now()
	for time.Since(start) < 30*time.Second {
		if ptr, err := p.Alloc(uint64(frac * float64(total))); err == nil {
			ms = float64(time.Since(start)) / float64(time.Millisecond)
			if err := p.Free(ptr); err != nil {
				b.Fatal(err)
			}
			return ms, float64(a.Stats().ScavengedBytes) / float64(giB)
		}
		time.Sleep(5 * time.Millisecond)
	}
	b.Fatalf("no memory after 30 s")
	return 0, 0
}
