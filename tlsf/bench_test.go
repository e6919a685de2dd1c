package tlsf

import (
	"math/rand/v2"
	"testing"
)

// BenchmarkAllocFree is one Alloc and one Free of a small block.
func BenchmarkAllocFree(b *testing.B) {
	x, _ := New(Config{})
	_ = x.AddRegion(0, 1*GiB)
	for b.Loop() {
		blk, _ := x.Alloc(4096)
		_, _ = x.Free(blk.Addr)
	}
}

// BenchmarkRandom keeps about 4096 blocks of random sizes (256 B to 4 MiB,
// log-uniform) live and replaces a random one per iteration: one Alloc and
// one Free, with splits and merges.
func BenchmarkRandom(b *testing.B) {
	x, _ := New(Config{})
	_ = x.AddRegion(0, 64*GiB)
	r := rand.New(rand.NewPCG(1, 2))
	size := func() uint64 { return uint64(256) << r.IntN(14) * uint64(1+r.IntN(7)) / 4 }
	live := make([]uint64, 4096)
	for i := range live {
		blk, err := x.Alloc(size())
		if err != nil {
			b.Fatal(err)
		}
		live[i] = blk.Addr
	}
	for b.Loop() {
		i := r.IntN(len(live))
		if _, err := x.Free(live[i]); err != nil {
			b.Fatal(err)
		}
		blk, err := x.Alloc(size())
		if err != nil {
			b.Fatal(err)
		}
		live[i] = blk.Addr
	}
}
