package bench

import (
	"testing"

	"github.com/gpumem/tlsf/pool"
)

// BenchmarkSmallAllocFreeHistory is BenchmarkSmallAllocFree/cached with
// the allocation history off, on (pool.Options.History), and on with the
// call stack of each allocation (HistoryStacks): the cost of recording.
func BenchmarkSmallAllocFreeHistory(b *testing.B) {
	for _, mode := range []struct {
		name string
		o    pool.Options
	}{
		{"off", pool.Options{}},
		{"history", pool.Options{History: 1 << 16}},
		{"history+stacks", pool.Options{History: 1 << 16, HistoryStacks: true}},
	} {
		b.Run(mode.name, func(b *testing.B) {
			p := newSimPool(b, mode.o)
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
