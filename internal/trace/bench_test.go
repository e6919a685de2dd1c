package trace

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

// Parsing speed of the embedded data, in decompressed bytes per second.
func BenchmarkParse(b *testing.B) {
	for _, f := range []string{"resnet50.trace.gz", "tdnn.snapshot.pickle.gz"} {
		raw := gunzip(b, embedded(b, f))
		b.Run(f, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			for b.Loop() {
				tr, err := Parse(f, bytes.NewReader(raw))
				if err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(float64(len(tr.Ops)), "ops/trace")
			}
		})
	}
}

func BenchmarkSizeSamplerSample(b *testing.B) {
	tr, err := Load("resnet50")
	if err != nil {
		b.Fatal(err)
	}
	s, err := NewSizeSampler(tr)
	if err != nil {
		b.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	var sum uint64
	for b.Loop() {
		sum += s.Sample(r)
	}
	_ = sum
}
