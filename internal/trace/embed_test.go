package trace

import (
	"fmt"
	"io/fs"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestNames(t *testing.T) {
	assert.Equal(t, []string{"lstm", "resnet50", "tdnn"}, Names())
}

func TestLoadUnknownName(t *testing.T) {
	_, err := Load("gpt5")
	assert.ErrorIs(t, err, fs.ErrNotExist)
	_, err = Load("../data/baseline.json")
	assert.ErrorIs(t, err, fs.ErrNotExist)
}

// The embedded traces have the op counts and peak live bytes that the
// traces' README states (in GiB, to two places) and that baseline.json
// states exactly. The two sources agree.
func TestEmbeddedTracesMatchPublishedFigures(t *testing.T) {
	readme := map[string]struct {
		ops     int
		peakGiB string
	}{
		"tdnn":     {7349, "7.95"},
		"resnet50": {42915, "10.60"},
		"lstm":     {3278, "6.20"},
	}
	baselines, err := Baselines()
	require.NoError(t, err)
	require.Len(t, baselines, len(readme))
	for _, name := range Names() {
		t.Run(name, func(t *testing.T) {
			tr, err := Load(name)
			require.NoError(t, err)
			require.NoError(t, tr.Check())
			assert.Equal(t, name, tr.Name)
			assert.Equal(t, "data/"+name+".trace.gz", tr.Source)
			peak := tr.PeakLive()

			want := readme[name]
			assert.Equal(t, want.ops, len(tr.Ops))
			assert.Equal(t, want.peakGiB, fmt.Sprintf("%.2f", float64(peak)/(1<<30)))

			b := baselines[name]
			assert.Equal(t, b.Ops, len(tr.Ops))
			assert.Equal(t, b.PeakLiveBytes, peak)
		})
	}
}

// Sizes are the requested sizes, not PyTorch's 512-byte-rounded blocks:
// the traces' README says otherwise, so this pins what the data holds.
func TestSizesAreRequestedNotRounded(t *testing.T) {
	for name, want := range map[string]struct{ unaligned, allocs int }{
		"lstm":     {362, 1657},
		"tdnn":     {750, 3730},
		"resnet50": {5140, 21780},
	} {
		tr, err := Load(name)
		require.NoError(t, err)
		n := 0
		for _, s := range tr.Sizes() {
			if s%512 != 0 {
				n++
			}
		}
		assert.Equal(t, want.unaligned, n, name)
		assert.Equal(t, want.allocs, tr.Allocs(), name)
	}
}

func TestBaselines(t *testing.T) {
	all, err := Baselines()
	require.NoError(t, err)
	peers := []string{PeerTorch, PeerTorchExpandable, PeerAsync, PeerCUBDefault, PeerCUBPow2, PeerCUDA}
	for name, b := range all {
		assert.Len(t, b.Peers, len(peers), name)
		for _, p := range peers {
			f, ok := b.Peers[p]
			if assert.True(t, ok, "%s has %s", name, p) {
				assert.Positive(t, f.WarmNsPerOp, "%s %s", name, p)
				assert.Positive(t, f.ColdNsPerOp, "%s %s", name, p)
			}
		}
		// Memory figures exist only where the README's table gives them.
		assert.Positive(t, b.Peers[PeerTorch].MinCapOverLive)
		assert.Positive(t, b.Peers[PeerAsync].MinCapOverLive)
		assert.Positive(t, b.Peers[PeerTorch].PeakReservedOverLive)
		assert.Positive(t, b.Peers[PeerTorchExpandable].PeakReservedOverLive)
		assert.Zero(t, b.Peers[PeerCUDA].MinCapOverLive)
		// peak_reserved_over_live is peak_reserved_bytes / peak_live_bytes.
		for _, p := range []string{PeerTorch, PeerTorchExpandable} {
			f := b.Peers[p]
			assert.InDelta(t, f.PeakReservedOverLive, float64(f.PeakReservedBytes)/float64(b.PeakLiveBytes), 1e-4, "%s %s", name, p)
		}
	}
	// Spot checks against the README's table (which rounds to whole ns).
	assert.Equal(t, 612.8, all["tdnn"].Peers[PeerTorch].WarmNsPerOp)
	assert.Equal(t, 1.4253, all["tdnn"].Peers[PeerTorch].MinCapOverLive)
	assert.Equal(t, 506.6, all["resnet50"].Peers[PeerCUBPow2].WarmNsPerOp)
	assert.Equal(t, 1.0444, all["lstm"].Peers[PeerAsync].MinCapOverLive)
	assert.Equal(t, uint64(7453278208), all["lstm"].Peers[PeerTorchExpandable].PeakReservedBytes)

	// Each call returns maps of its own.
	all["lstm"].Peers[PeerTorch] = Peer{}
	again, err := Baselines()
	require.NoError(t, err)
	assert.Equal(t, 342.7, again["lstm"].Peers[PeerTorch].WarmNsPerOp)
}
