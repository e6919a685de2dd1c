package trace

import (
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Sampled sizes follow the trace's size frequencies. The seed is fixed, so
// the test is deterministic; the tolerance is about 5 standard deviations
// of a frequency estimated from 200,000 draws.
func TestSizeSamplerFollowsFrequencies(t *testing.T) {
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			tr, err := Load(name)
			require.NoError(t, err)
			want := map[uint64]float64{}
			sizes := tr.Sizes()
			for _, s := range sizes {
				want[s] += 1 / float64(len(sizes))
			}
			s, err := NewSizeSampler(tr)
			require.NoError(t, err)
			assert.Equal(t, len(want), s.Distinct())

			const n = 200_000
			r := rand.New(rand.NewPCG(1, 2))
			got := map[uint64]float64{}
			for range n {
				v := s.Sample(r)
				_, ok := want[v]
				require.True(t, ok, "sampled size %d is not in the trace", v)
				got[v] += 1.0 / n
			}
			for size, p := range want {
				assert.InDelta(t, p, got[size], 0.006, "size %d", size)
			}
		})
	}
}

func TestSizeSamplerSingleSize(t *testing.T) {
	s, err := NewSizeSampler(&Trace{Ops: []Op{{ID: 1, Size: 4096}, {Free: true, ID: 1, Size: 4096}}})
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		assert.Equal(t, uint64(4096), s.Sample(r))
	}
}

func TestSizeSamplerNeedsAllocations(t *testing.T) {
	_, err := NewSizeSampler(&Trace{Name: "none"})
	assert.ErrorIs(t, err, ErrEmpty)
}
