package trace

import (
	"bytes"
	"embed"
	"encoding/json"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strings"
)

// data holds the recorded traces (*.trace.gz, text), the PyTorch snapshots
// two of them were derived from (*.snapshot.pickle.gz) and the peers'
// figures on them (baseline.json); doc.go describes them.
//
//go:embed data/*.gz data/baseline.json
var data embed.FS

// Names returns the names of the embedded text traces, sorted: "lstm",
// "resnet50", "tdnn".
func Names() []string {
	files, _ := fs.Glob(data, "data/*.trace.gz") // the pattern is valid
	names := make([]string, 0, len(files))
	for _, f := range files {
		names = append(names, strings.TrimSuffix(path.Base(f), ".trace.gz"))
	}
	slices.Sort(names)
	return names
}

// Load parses the embedded text trace called name (one of Names) and
// returns a new Trace, which the caller owns. Its Source is
// "data/NAME.trace.gz".
//
// Errors: one matching fs.ErrNotExist for a name not in Names; errors of
// Parse are not expected (tests parse every embedded trace). Load is safe
// to call from many goroutines at once.
func Load(name string) (*Trace, error) {
	file := "data/" + name + ".trace.gz"
	if !slices.Contains(Names(), name) {
		return nil, fmt.Errorf("trace: no embedded trace %q: %w", name, fs.ErrNotExist)
	}
	b, err := data.ReadFile(file)
	if err != nil {
		return nil, err
	}
	return Parse(file, bytes.NewReader(b))
}

// The allocators measured in baseline.json, keys of Baseline.Peers.
const (
	PeerTorch           = "torch"            // PyTorch's native caching allocator
	PeerTorchExpandable = "torch+expandable" // the same with expandable_segments:True
	PeerAsync           = "async"            // cudaMallocAsync (stream-ordered pool)
	PeerCUBDefault      = "cub_default"      // CUB CachingDeviceAllocator, default bins (growth 8, none above 2 MiB)
	PeerCUBPow2         = "cub_pow2"         // CUB CachingDeviceAllocator, bin growth 2
	PeerCUDA            = "cuda"             // plain cudaMalloc/cudaFree
)

// Peer holds one allocator's figures on one trace (H200, one process).
// A zero field was not measured for that allocator.
type Peer struct {
	// WarmNsPerOp is the replay cost per alloc or free, in ns, once the
	// allocator's caches are warm; ColdNsPerOp the same from a fresh start.
	WarmNsPerOp float64 `json:"warm_ns_per_op"`
	ColdNsPerOp float64 `json:"cold_ns_per_op"`
	// PeakReservedBytes is the most device memory the allocator held, in
	// bytes, with no cap; PeakReservedOverLive divides it by the trace's
	// peak live bytes.
	PeakReservedBytes    uint64  `json:"peak_reserved_bytes"`
	PeakReservedOverLive float64 `json:"peak_reserved_over_live"`
	// MinCapOverLive is the smallest memory cap under which the trace
	// replays with no failed allocation, divided by peak live bytes (the
	// physical limit is 1.0).
	MinCapOverLive float64 `json:"min_cap_over_live"`
}

// Baseline holds the peers' figures for one embedded trace.
type Baseline struct {
	Ops           int             // number of ops in the trace
	PeakLiveBytes uint64          // peak sum of live sizes, in bytes
	Peers         map[string]Peer // by allocator: the Peer* constants
}

// Baselines returns the peers' figures from data/baseline.json, by trace
// name (one of Names). The maps are new on each call; the caller owns
// them.
//
// Errors: a JSON decoding error if the embedded file is corrupt (tests
// decode it, so none is expected). Safe to call from many goroutines.
func Baselines() (map[string]Baseline, error) {
	b, err := data.ReadFile("data/baseline.json")
	if err != nil {
		return nil, err
	}
	var raw map[string]map[string]json.RawMessage
	if err := json.Unmarshal(b, &raw); err != nil {
		return nil, fmt.Errorf("trace: baseline.json: %w", err)
	}
	out := make(map[string]Baseline, len(raw))
	for name, fields := range raw {
		bl := Baseline{Peers: make(map[string]Peer)}
		for k, v := range fields {
			var err error
			switch k {
			case "ops":
				err = json.Unmarshal(v, &bl.Ops)
			case "peak_live_bytes":
				err = json.Unmarshal(v, &bl.PeakLiveBytes)
			default:
				var p Peer
				d := json.NewDecoder(bytes.NewReader(v))
				d.DisallowUnknownFields()
				err = d.Decode(&p)
				bl.Peers[k] = p
			}
			if err != nil {
				return nil, fmt.Errorf("trace: baseline.json: %s.%s: %w", name, k, err)
			}
		}
		out[name] = bl
	}
	return out, nil
}
