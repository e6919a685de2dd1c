package trace

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
)

// SizeSampler draws allocation sizes with the frequencies of a trace: a
// size that makes up 3% of the trace's allocations is drawn with
// probability 0.03. It holds one entry per distinct size.
//
// A SizeSampler is immutable: many goroutines may call Sample at once, each
// with its own *rand.Rand (a rand.Rand is not safe for concurrent use).
type SizeSampler struct {
	sizes []uint64 // distinct sizes, ascending
	cum   []uint64 // cum[i]: allocations of sizes[0..i]
}

// NewSizeSampler builds a sampler of t's allocation sizes. It returns an
// error wrapping ErrEmpty if t has no allocation.
func NewSizeSampler(t *Trace) (*SizeSampler, error) {
	sizes := t.Sizes()
	if len(sizes) == 0 {
		return nil, fmt.Errorf("trace: %s: %w", t.Name, ErrEmpty)
	}
	slices.Sort(sizes)
	s := &SizeSampler{}
	for i, v := range sizes {
		if i == 0 || v != sizes[i-1] {
			s.sizes = append(s.sizes, v)
			s.cum = append(s.cum, 0)
		}
		s.cum[len(s.cum)-1] = uint64(i + 1)
	}
	return s, nil
}

// Sample returns a size in bytes drawn with the trace's frequencies, using
// one r.Uint64N call; O(log distinct sizes).
func (s *SizeSampler) Sample(r *rand.Rand) uint64 {
	x := r.Uint64N(s.cum[len(s.cum)-1])
	i := sort.Search(len(s.cum), func(i int) bool { return s.cum[i] > x })
	return s.sizes[i]
}

// Distinct returns the number of distinct sizes the sampler draws from.
func (s *SizeSampler) Distinct() int { return len(s.sizes) }
