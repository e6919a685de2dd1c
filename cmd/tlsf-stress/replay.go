package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/spf13/cobra"
)

// defaultTrace is the embedded trace the command replays without a
// subcommand: the largest of the three, with the most varied sizes.
const defaultTrace = "resnet50"

// minCapStep is the resolution of --min-cap in bytes: 2 MiB, the VMM
// granularity, below which a pool's reserved memory cannot move.
const minCapStep = 2 << 20

// plotPoints is about how many samples of reserved memory a plotted replay
// takes: enough for a smooth line, few enough (one Stats call each) not
// to slow the replay.
const plotPoints = 2000

type replayOpts struct {
	backends []string
	cap      capFlag
	minCap   bool
	json     bool
	plot     string
	warmRuns int    // timed warm replays (--warm-runs)
	snapshot string // --snapshot FILE (snapshot.go)
}

func newReplayCmd(g *globalFlags) *cobra.Command {
	o := &replayOpts{}
	var backends []string
	cmd := &cobra.Command{
		Use:   "replay [flags] [TRACE...]",
		Short: "Replay allocation traces through the pool and its peers",
		Long: `Replay allocation traces through each backend on one allocator: the first
replay warms it (its cost is cold ns/op), more run untimed until the process
has spent 1 s in such replays (the first CPU second of a process runs up to
1.7x slower), then --warm-runs more are timed, and ns/op is their median: the
warm replay cost per alloc or free, as the peers' figures are. Trace IDs are compiled to dense slots before anything is timed.

A TRACE is a file (this project's text format, a PyTorch memory snapshot
pickle, or an RMM logging_resource_adaptor CSV log, plain or gzip, told apart
by content) or the name of an embedded trace: ` + strings.Join(trace.Names(), ", ") + `
(the embedded trace wins over a file of that name, which ./NAME reads).
Without TRACE, every embedded trace is replayed. The text format, one record a
line:

  # a comment
  a ID SIZE STREAM   allocate SIZE bytes on STREAM (0: the default stream)
  f ID               free the block allocated as ID

A cap (--cap) is bytes with an optional suffix (KiB, MiB, GiB, TiB or K, M,
G, T, binary; KB, MB, GB, TB, decimal; 1.5GiB with a suffix), or, written
with a decimal point and no suffix, a fraction of the device's memory:
--cap 0.5 is half of it, --cap 1 is one byte, --cap 0 is no cap.

The table's "measured" column says where each row comes from: this run, or
the peers' figures recorded on an H200 (baseline.json). A failed replay's
first error is printed under the table, and each trace replayed with a pool
backend (tlsf-vmm, tlsf-chunks and their variants) ends with a verdict line:
our best pool backend whose replays failed no allocation against the best
peer, by min cap over peak live with --min-cap, else by peak reserved over
peak live. Peers are compared only for an embedded trace (a file of that
name with other operations gets none). --min-cap finds the cap itself: it
does not go with --cap.

Exit status: 0 when every replay ran; 1 when an allocation failed in a
replay without a cap (a pool that cannot serve a trace on a device this
large: the table's failed column, failed_allocs with --json), or on any
other error; 2 for a bad command line; 130 when interrupted (SIGINT or
SIGTERM), after reporting what ran. Failures under --cap are expected
and counted, not errors.

--snapshot FILE writes, per trace, a PyTorch memory snapshot of one more
replay with the first pool backend (the pickle of torch.cuda.memory._snapshot(),
history included): open it at pytorch.org/memory_viz, or run
python3 -m torch.cuda._memory_viz trace_plot FILE -o FILE.html.`,
		Args: wrapArgs(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			var err error
			if o.backends, err = parseBackends(backends); err != nil {
				return err
			}
			if o.warmRuns < 1 || o.warmRuns > maxWarmRuns {
				return usagef("--warm-runs %d: want 1 to %d", o.warmRuns, maxWarmRuns)
			}
			if o.plot != "" {
				if ext := strings.ToLower(filepath.Ext(o.plot)); ext != ".svg" && ext != ".png" {
					return usagef("--plot %q: the file name must end in .svg or .png", o.plot)
				}
			}
			if o.minCap && cmd.Flags().Changed("cap") {
				// --min-cap finds the cap itself: under another one, its
				// figures and the verdict would speak of different caps.
				return usagef("--min-cap finds the smallest cap itself: give it without --cap")
			}
			if o.snapshot != "" {
				if _, ok := snapshotBackend(o.backends); !ok {
					return usagef("--snapshot needs a pool backend (%s) in --backend", strings.Join(poolBackends, ", "))
				}
			}
			if len(args) == 0 {
				args = trace.Names()
			}
			return runReplay(cmd, g, o, args)
		},
	}
	f := cmd.Flags()
	f.StringSliceVar(&backends, "backend", allBackends, "backends to compare, comma-separated: "+strings.Join(allBackends, ", "))
	o.cap.least = minCapBytes
	f.Var(&o.cap, "cap", "cap on device memory: bytes (suffixes KiB..TiB; 0: none), or a fraction of total memory such as 0.5")
	f.BoolVar(&o.minCap, "min-cap", false, "find by bisection the smallest cap under which the trace replays with no failed allocation")
	f.BoolVar(&o.json, "json", false, "print one JSON object per trace and backend (schema in the package doc) instead of a table")
	f.IntVar(&o.warmRuns, "warm-runs", replay.MinWarmRuns, "warm replays timed per trace and backend (1 to 1000); ns/op is their median")
	f.StringVar(&o.plot, "plot", "", "write live and reserved bytes over the first replay to `FILE` (.svg or .png; with several traces, FILE-TRACE.ext)")
	f.StringVar(&o.snapshot, "snapshot", "", "replay each trace once more with the first pool backend, recording its history, and write a PyTorch memory snapshot (the pickle of torch.cuda.memory._snapshot(), for pytorch.org/memory_viz) to `FILE` (with several traces, FILE-TRACE.ext)")
	return cmd
}

// replayResult is one trace replayed with one backend: a JSON object of
// --json output. doc.go documents the schema; TestReplayJSONSchema checks
// it.
type replayResult struct {
	Trace             string            `json:"trace"`
	Source            string            `json:"source"`
	Format            string            `json:"format"`
	Backend           string            `json:"backend"`
	Conf              string            `json:"conf,omitempty"`
	Device            string            `json:"device"`
	DeviceKind        string            `json:"device_kind"`
	Ops               int               `json:"ops"`
	PeakLiveBytes     uint64            `json:"peak_live_bytes"`
	PeakReservedBytes uint64            `json:"peak_reserved_bytes"`
	ReservedOverLive  float64           `json:"reserved_over_live"`
	CapBytes          uint64            `json:"cap_bytes"`
	MinCapBytes       *uint64           `json:"min_cap_bytes,omitempty"`
	MinCapOverLive    *float64          `json:"min_cap_over_live,omitempty"`
	MinCapRuns        int               `json:"min_cap_runs,omitempty"`
	NsPerOp           float64           `json:"ns_per_op"`
	MinNsPerOp        float64           `json:"min_ns_per_op"`
	WarmRuns          int               `json:"warm_runs"`
	WarmUpRuns        int               `json:"warm_up_runs"`
	ColdNsPerOp       float64           `json:"cold_ns_per_op"`
	DeviceNsPerOp     *float64          `json:"device_ns_per_op,omitempty"`
	ColdDeviceNsPerOp *float64          `json:"cold_device_ns_per_op,omitempty"`
	DeviceCalls       uint64            `json:"device_calls"`
	WarmDeviceCalls   uint64            `json:"warm_device_calls"`
	DeviceCallsByName map[string]uint64 `json:"device_calls_by_name"`
	FailedAllocs      int               `json:"failed_allocs"`
	WarmFailedAllocs  int               `json:"warm_failed_allocs"`
	FirstError        string            `json:"first_error,omitempty"`
	// SkippedRecords counts the trace's records the parser ignored
	// (trace.Trace.Skipped: frees of no live block, zero-byte
	// allocations in a snapshot or CSV whose recording began mid-run).
	SkippedRecords int `json:"skipped_records"`
	// traceOps is the trace's own operations (Ops counts those replayed:
	// a failed allocation and its free are not), for baselineOf.
	traceOps int

	series []sample // live and reserved bytes over the first replay, with --plot
}

// sample is the state after op Op of a replay.
type sample struct {
	Op             int
	Live, Reserved uint64
}

// loadTrace reads a trace argument: an embedded trace's name, else a
// file. An embedded name wins over a file of that name in the working
// directory, which ./NAME reads: which trace a bare name replays does not
// depend on the directory it is typed in.
func loadTrace(arg string) (*trace.Trace, error) {
	if slices.Contains(trace.Names(), arg) {
		return trace.Load(arg)
	}
	if _, err := os.Stat(arg); err == nil {
		t, err := trace.ParseFile(arg)
		if err == nil && len(t.Ops) == 0 {
			// Nothing to replay: its figures would be 0/0 and its warm-up
			// a second of empty replays.
			return nil, fmt.Errorf("%s: the trace has no operations", arg)
		}
		return t, err
	}
	_, err := os.Stat(arg)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("%s: no such file, and no embedded trace of that name (embedded: %s)", arg, strings.Join(trace.Names(), ", "))
	}
	return nil, err
}

func runReplay(cmd *cobra.Command, g *globalFlags, o *replayOpts, args []string) error {
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	o.backends = effectiveBackends(o.backends)
	traces := make([]*trace.Trace, 0, len(args))
	given := map[[2]string]bool{} // trace name and source
	for _, a := range args {
		t, err := loadTrace(a)
		if err != nil {
			return err
		}
		// The table and the verdicts key results on the name and the
		// source: one trace given twice would merge into one verdict.
		k := [2]string{t.Name, t.Source}
		if given[k] {
			return usagef("trace %s given twice: --warm-runs repeats its timed replays", a)
		}
		given[k] = true
		if n := traceStreams(t); n > maxReplayStreams {
			return fmt.Errorf("%s: the trace uses %d streams, more than the %d a replay creates device streams for", a, n, maxReplayStreams)
		}
		traces = append(traces, t)
	}
	written := map[string]string{} // file → the flag writing it
	for _, out := range []struct{ flag, file string }{{"--plot", o.plot}, {"--snapshot", o.snapshot}} {
		if out.file == "" {
			continue
		}
		if err := checkOutputs(out.flag, out.file, traces, args, written); err != nil {
			return err
		}
	}
	ds, err := openDevices(g, false)
	if err != nil {
		return err
	}
	defer ds.close()
	if ds.note != "" {
		fmt.Fprintln(errw, "tlsf-stress:", ds.note)
	}
	// The driver's pool (async) replays after every other backend: on the
	// H200 the first replay of the backend after it, in the same process,
	// took about 360 ms more although its close trims and synchronizes.
	// Results keep the order of traces, then of --backend.
	grid := make([][]*replayResult, len(traces))
	for ti := range grid {
		grid[ti] = make([]*replayResult, len(o.backends))
	}
	// emit prints the results gathered, in order: all of them, or those
	// before an error.
	emit := func() ([]*replayResult, error) {
		var results []*replayResult
		for _, row := range grid {
			for _, r := range row {
				if r != nil {
					results = append(results, r)
				}
			}
		}
		if !o.json {
			printReplayTable(out, ds, results)
			return results, nil
		}
		for _, r := range results {
			if err := json.NewEncoder(out).Encode(r); err != nil {
				return nil, err
			}
		}
		return results, nil
	}
	failed := false
	for _, asyncPass := range []bool{false, true} {
		for ti, t := range traces {
			for bi, be := range o.backends {
				if (be == backendAsync) != asyncPass {
					continue
				}
				if cmd.Context().Err() != nil {
					// Interrupted: the rows replayed so far, then exit
					// status 130 (no plot or snapshot).
					if _, err := emit(); err != nil {
						return err
					}
					return errInterrupted
				}
				r, err := replayTraceBackend(ds, t, be, o)
				if err != nil {
					_, _ = emit()
					return fmt.Errorf("replaying %s with %s: %w", t.Name, be, err)
				}
				grid[ti][bi] = r
				if r.FailedAllocs > 0 && !o.cap.set() {
					failed = true
				}
			}
		}
	}
	results, err := emit()
	if err != nil {
		return err
	}
	if o.plot != "" {
		if err := plotReplays(o.plot, traces, results, func(s string) { fmt.Fprintln(errw, "tlsf-stress:", s) }); err != nil {
			return err
		}
	}
	if o.snapshot != "" {
		if err := writeSnapshots(ds, traces, o, func(s string) { fmt.Fprintln(errw, "tlsf-stress:", s) }); err != nil {
			return err
		}
	}
	if failed {
		where := "the table's failed column"
		if o.json {
			where = "failed_allocs"
		}
		fmt.Fprintf(errw, "tlsf-stress: allocations failed without a cap (see %s)\n", where)
		return errFailed
	}
	return nil
}

// maxWarmRuns bounds --warm-runs: an interrupt stops replay between
// traces, not within a trace's warm replays, and 1,000 replays of the
// longest embedded trace take minutes, not days.
const maxWarmRuns = 1000

// replayTraceBackend replays t with backend be: once cold (sampled for
// --plot), untimed until the process is warm (replay.WarmUp), then
// --warm-runs times, timed, then the --min-cap bisection.
func replayTraceBackend(ds *devices, t *trace.Trace, be string, o *replayOpts) (*replayResult, error) {
	dev, release := ds.get()
	defer release()
	total, err := deviceTotal(dev)
	if err != nil {
		return nil, err
	}
	capBytes := o.cap.resolve(total)
	r := &replayResult{
		Trace: t.Name, Source: t.Source, Format: t.Format.String(), Backend: be,
		Device: dev.Name(), DeviceKind: ds.kind, PeakLiveBytes: t.PeakLive(), CapBytes: capBytes,
		SkippedRecords: t.Skipped, Conf: ds.confOf(be), traceOps: len(t.Ops),
	}
	sd, _ := dev.(*sim.Device)
	ct := replay.Compile(t)
	var simT0, simT1 time.Duration
	err = withAllocator(dev, t, be, allocOptions{base: ds.pool, capBytes: capBytes}, func(a *replayAllocator) error {
		every := 0
		if o.plot != "" {
			every = max(1, len(t.Ops)/plotPoints)
		}
		var cold0 time.Duration
		if sd != nil {
			cold0 = sd.SimTime()
		}
		ra := a.replayer()
		cold, series, err := replayTrace(ct, ra, a, every)
		if err != nil {
			return err
		}
		if sd != nil && cold.Ops > 0 {
			v := float64(sd.SimTime()-cold0) / float64(cold.Ops)
			r.ColdDeviceNsPerOp = &v
		}
		if err := cold.FreeLeft(ra); err != nil {
			return err
		}
		r.series = series
		// Untimed, before the warm replays' figures and driver calls.
		if r.WarmUpRuns, err = ct.WarmUp(ra, replay.WarmUpTime); err != nil {
			return err
		}
		c0 := a.calls()
		if sd != nil {
			simT0 = sd.SimTime()
		}
		w, err := ct.Warm(ra, max(o.warmRuns, 1))
		if err != nil {
			return err
		}
		warm := w.Last
		warm.Failed = w.Failed
		if sd != nil {
			simT1 = sd.SimTime()
		}
		c1 := a.calls()
		peak, err := a.peakReserved()
		if err != nil {
			return err
		}
		r.Ops, r.NsPerOp, r.ColdNsPerOp = warm.Ops, w.MedianNsPerOp, cold.NsPerOp()
		r.MinNsPerOp, r.WarmRuns = w.MinNsPerOp, len(w.Runs)
		r.FailedAllocs, r.WarmFailedAllocs = cold.Failed, warm.Failed
		if cold.FirstErr != nil {
			r.FirstError = cold.FirstErr.Error()
		} else if warm.FirstErr != nil {
			r.FirstError = warm.FirstErr.Error()
		}
		r.PeakReservedBytes = peak
		r.DeviceCalls, r.WarmDeviceCalls = c1.Total(), c1.Total()-c0.Total()
		r.DeviceCallsByName = c1.Map()
		if sd != nil && warm.Ops > 0 {
			v := float64(simT1-simT0) / float64(warm.Ops) / float64(len(w.Runs))
			r.DeviceNsPerOp = &v
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	if r.PeakLiveBytes > 0 {
		r.ReservedOverLive = float64(r.PeakReservedBytes) / float64(r.PeakLiveBytes)
	}
	if o.minCap {
		if err := findMinCap(ds, t, be, r); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// findMinCap bisects the cap between peak live and peak reserved bytes
// (raised if need be), a fresh allocator on a fresh device per probe.
// A replay that fails allocations without a cap fails under any cap: the
// search is skipped, and the table shows the failure and its first error.
func findMinCap(ds *devices, t *trace.Trace, be string, r *replayResult) error {
	if r.FailedAllocs > 0 {
		return nil
	}
	ct := replay.Compile(t)
	hi := max(r.PeakReservedBytes, r.PeakLiveBytes) + minCapStep
	c, runs, err := replay.MinCap(r.PeakLiveBytes, hi, minCapStep, func(capBytes uint64) (bool, error) {
		dev, release := ds.get()
		defer release()
		ok := false
		err := withAllocator(dev, t, be, allocOptions{base: ds.pool, capBytes: capBytes}, func(a *replayAllocator) error {
			res, _, err := replayTrace(ct, a, a, 0)
			if err != nil {
				return err
			}
			ok = res.Failed == 0
			return res.FreeLeft(a)
		})
		return ok, err
	})
	if err != nil {
		return err
	}
	r.MinCapBytes, r.MinCapRuns = &c, runs
	if r.PeakLiveBytes > 0 {
		v := float64(c) / float64(r.PeakLiveBytes)
		r.MinCapOverLive = &v
	}
	return nil
}

// replayAllocator adapts an allocator to replay.Allocator, mapping the
// trace's streams to device streams (trace stream 0 is the default
// stream). Pointer receivers, as replay.Pool's: no compiler-made
// wrapper copies it on each call through replay.Allocator.
type replayAllocator struct {
	allocator
	streams map[uint64]device.Stream
}

func (a *replayAllocator) Alloc(size, stream uint64) (uintptr, error) {
	if stream == 0 {
		return a.AllocOn(size, 0)
	}
	return a.AllocOn(size, a.streams[stream])
}

func (a *replayAllocator) Free(ptr uintptr, size, stream uint64) error {
	if stream == 0 {
		return a.FreeSizedOn(ptr, size, 0)
	}
	return a.FreeSizedOn(ptr, size, a.streams[stream])
}

// replayer returns what the timed replays drive: for a pool backend the
// harness's own adapter (replay.Pool, which bench's BenchmarkPoolReplay
// drives: one interface call per operation), else a. Through a, a pool's
// operation took two interface calls and the wrapper the compiler makes
// for poolAlloc's promoted methods.
func (a *replayAllocator) replayer() replay.Allocator {
	if pa, ok := a.allocator.(poolAlloc); ok {
		return &replay.Pool{P: pa.Pool, Streams: a.streams}
	}
	return a
}

// maxReplayStreams bounds the distinct non-default streams of a replayed
// trace: withAllocator creates a device stream for each, and the
// simulated device's cost grows with their square (20,000 streams took
// 7.5 GB and 50 s, 40,000 ran out of memory). PyTorch traces use a few.
const maxReplayStreams = 1024

// traceStreams returns the number of distinct non-zero streams of t.
func traceStreams(t *trace.Trace) int {
	seen := map[uint64]bool{}
	for _, op := range t.Ops {
		if op.Stream != 0 {
			seen[op.Stream] = true
		}
	}
	return len(seen)
}

// withAllocator makes backend be on dev with a device stream for each
// non-zero stream of t, runs f, and closes the allocator and the streams.
func withAllocator(dev device.Device, t *trace.Trace, be string, o allocOptions, f func(*replayAllocator) error) error {
	streams := map[uint64]device.Stream{}
	defer func() {
		for _, s := range streams {
			_ = dev.StreamDestroy(s)
		}
	}()
	for _, op := range t.Ops {
		if _, ok := streams[op.Stream]; !ok && op.Stream != 0 {
			s, err := dev.StreamCreate()
			if err != nil {
				return err
			}
			streams[op.Stream] = s
		}
	}
	a, err := newAllocator(dev, be, o)
	if err != nil {
		return err
	}
	err = f(&replayAllocator{a, streams})
	return errors.Join(err, a.close())
}

// replayTrace replays compiled trace t through ra (a.replayer(), or a;
// RunSampled) and returns the result, whose Left a warm replay on the
// same allocator must free first, and, every every ops (0: never), a
// sample of live and reserved bytes (a's).
func replayTrace(t *replay.Compiled, ra replay.Allocator, a *replayAllocator, every int) (replay.Result, []sample, error) {
	if every == 0 {
		res, err := t.Run(ra)
		return res, nil, err
	}
	var series []sample
	res, err := t.RunSampled(ra, every, func(op int, live uint64) error {
		rsv, err := a.reserved()
		series = append(series, sample{Op: op, Live: live, Reserved: rsv})
		return err
	})
	return res, series, err
}

func optFloat(v *float64, format string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(format, *v)
}

func zeroDash(v float64, format string) string {
	if v == 0 || math.IsNaN(v) {
		return "-"
	}
	return fmt.Sprintf(format, v)
}
