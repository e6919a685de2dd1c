package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"slices"
	"strings"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/spf13/cobra"
	"github.com/vbauerster/mpb/v8"
	"github.com/vbauerster/mpb/v8/decor"
	"golang.org/x/term"
)

// Stream modes, the values of --stream.
const (
	streamDefault      = "default"       // every goroutine on the legacy default stream
	streamPerGoroutine = "per-goroutine" // a non-blocking stream per goroutine
)

// defaultRunOps is the number of operations of a run given neither --ops
// nor --duration.
const defaultRunOps = 100_000

// workloadFlags are the flags run and multi share.
type workloadFlags struct {
	backend     string
	goroutines  int
	ops         int64
	duration    time.Duration
	sizes       string
	minSize     sizeFlag
	maxSize     sizeFlag
	slots       int
	maxLive     capFlag
	verify      string
	stream      string
	seed        uint64
	json        bool
	progressInt time.Duration
}

func (w *workloadFlags) register(cmd *cobra.Command, defaultOps int64) {
	f := cmd.Flags()
	f.StringVar(&w.backend, "backend", backendVMM, "allocator: "+strings.Join(allBackends, ", "))
	f.IntVarP(&w.goroutines, "goroutines", "g", runtime.GOMAXPROCS(0), "goroutines allocating and freeing at once (1 to 4096)")
	f.Int64Var(&w.ops, "ops", defaultOps, "operations (allocs and frees) in all, requests not made for want of --max-live room counted too; 0 with --duration: until the duration is over (with --duration and no --ops, 0)")
	f.DurationVar(&w.duration, "duration", 0, "run for this long (with --ops, whichever ends first)")
	f.StringVar(&w.sizes, "sizes", "log-uniform", "block sizes: log-uniform between --min-size and --max-size, or the size distribution of a trace (embedded name or file)")
	w.minSize, w.maxSize = 256, 64<<20
	f.Var(&w.minSize, "min-size", "smallest log-uniform block size, bytes")
	f.Var(&w.maxSize, "max-size", "largest log-uniform block size, bytes")
	f.IntVar(&w.slots, "slots", 64, "live blocks per goroutine, at most (1 to 1048576; 16777216 over all goroutines)")
	w.maxLive = capFlag{fraction: 0.25}
	f.Var(&w.maxLive, "max-live", "bound on live bytes over all goroutines: bytes, or a fraction of total memory (0: none)")
	f.StringVar(&w.verify, "verify", verifySampled, "read blocks back before freeing them: full, sampled (first, middle and last 4 KiB) or none")
	f.StringVar(&w.stream, "stream", streamDefault, "stream of each goroutine's allocations, fills and frees: default or per-goroutine")
	f.Uint64Var(&w.seed, "seed", 1, "seed of the random choices")
	f.BoolVar(&w.json, "json", false, "print the outcome as one JSON object")
	f.DurationVar(&w.progressInt, "progress-interval", 2*time.Second, "interval of plain progress lines when stderr is not a terminal (0: none)")
}

// validate checks the flags that cannot be checked while parsing. A
// --duration without --ops runs for the duration (--ops 0): before, the
// default --ops ended it first.
// Bounds of the workload's flags: each goroutine holds a table of --slots
// entries (16 bytes each) and a stack, so that the largest workload takes
// about 256 MiB of host memory for its tables rather than failing in the
// Go runtime.
const (
	maxGoroutines = 4096
	maxSlots      = 1 << 20
	maxSlotsInAll = 1 << 24
)

func (w *workloadFlags) validate(cmd *cobra.Command) error {
	if f := cmd.Flags(); f.Changed("duration") && !f.Changed("ops") && w.duration > 0 {
		w.ops = 0
	}
	if !slices.Contains(allBackends, w.backend) {
		return usagef("--backend %q: want one of %s", w.backend, strings.Join(allBackends, ", "))
	}
	w.backend = effectiveBackend(w.backend)
	switch {
	case w.goroutines < 1 || w.goroutines > maxGoroutines:
		return usagef("--goroutines %d: want 1 to %d", w.goroutines, maxGoroutines)
	case w.ops < 0:
		return usagef("--ops %d: want 0 or more", w.ops)
	case w.duration < 0:
		return usagef("--duration %v: want 0 (none) or more", w.duration)
	case w.progressInt < 0:
		return usagef("--progress-interval %v: want 0 (none) or more", w.progressInt)
	case w.ops == 0 && w.duration <= 0:
		return usagef("--ops 0 needs a --duration")
	case w.slots < 1 || w.slots > maxSlots:
		return usagef("--slots %d: want 1 to %d", w.slots, maxSlots)
	case w.slots*w.goroutines > maxSlotsInAll:
		return usagef("--slots %d × --goroutines %d: want at most %d live blocks in all", w.slots, w.goroutines, maxSlotsInAll)
	case w.minSize < 1 || w.maxSize < w.minSize:
		return usagef("--min-size %d, --max-size %d: want 1 ≤ min ≤ max", w.minSize, w.maxSize)
	case !slices.Contains([]string{verifyFull, verifySampled, verifyNone}, w.verify):
		return usagef("--verify %q: want full, sampled or none", w.verify)
	case w.stream != streamDefault && w.stream != streamPerGoroutine:
		return usagef("--stream %q: want default or per-goroutine", w.stream)
	}
	return nil
}

// sizeSource returns the size distribution of --sizes.
func (w *workloadFlags) sizeSource() (func(*rand.Rand) uint64, error) {
	if w.sizes == "log-uniform" {
		return logUniform(uint64(w.minSize), uint64(w.maxSize)), nil
	}
	t, err := loadTrace(w.sizes)
	if err != nil {
		return nil, fmt.Errorf("--sizes: %w", err)
	}
	s, err := trace.NewSizeSampler(t)
	if err != nil {
		return nil, fmt.Errorf("--sizes: %w", err)
	}
	return s.Sample, nil
}

// logUniform draws sizes whose logarithm is uniform in [log lo, log hi]:
// as many blocks of 1-2 KiB as of 1-2 MiB.
func logUniform(lo, hi uint64) func(*rand.Rand) uint64 {
	a, b := math.Log(float64(lo)), math.Log(float64(hi))
	return func(r *rand.Rand) uint64 {
		return min(hi, max(lo, uint64(math.Exp(a+r.Float64()*(b-a)))))
	}
}

// config builds the stress configuration for a device of total bytes.
func (w *workloadFlags) config(total uint64) (stressConfig, error) {
	sizes, err := w.sizeSource()
	if err != nil {
		return stressConfig{}, err
	}
	return stressConfig{
		goroutines: w.goroutines, ops: w.ops, duration: w.duration, sizes: sizes, slots: w.slots,
		maxLive: w.maxLive.resolve(total), verify: w.verify, perStream: w.stream == streamPerGoroutine, seed: w.seed,
	}, nil
}

type runOpts struct {
	workloadFlags
	cap     capFlag
	devices string // --devices: ordinals of a several-GPU run (peer.go)
}

func newRunCmd(g *globalFlags) *cobra.Command {
	o := &runOpts{}
	cmd := &cobra.Command{
		Use:   "run [flags]",
		Short: "Random stress with every block's contents verified on the device",
		Long: `Run a random workload: goroutines allocate blocks, fill each with a 32-bit
pattern of its own on the device (cuMemsetD32Async), and read it back before
freeing it (cuMemcpyDtoH, whole or sampled). Any overlap between live blocks
or corrupted word is reported with its addresses, and the exit status is 1.
On the simulated device, memory contents are simulated too, so verification
is real. Out-of-memory errors are counted, not failures.`,
		Args: wrapArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(cmd); err != nil {
				return err
			}
			if o.devices != "" {
				if cmd.Flags().Changed("stream") {
					// peer.go's goroutines allocate, copy and free on each
					// device's default stream.
					return usagef("--stream: run --devices uses each device's default stream")
				}
				ords, err := parseDevices(o.devices)
				if err != nil {
					return err
				}
				return runPeer(cmd, g, o, ords)
			}
			return runRun(cmd, g, o)
		},
	}
	o.register(cmd, defaultRunOps)
	o.cap.least = minCapBytes
	cmd.Flags().Var(&o.cap, "cap", "cap on the allocator's device memory: bytes (suffixes KiB..TiB; 0: none), or a fraction of total memory such as 0.5")
	cmd.Flags().StringVar(&o.devices, "devices", "", "GPUs to use, e.g. 0,1: a pool on each with peer access for the others; blocks are copied between them (cuMemcpyDtoDAsync) and verified")
	return cmd
}

// runResult is run's outcome: its --json object (schema in doc.go).
type runResult struct {
	Device              string            `json:"device"`
	DeviceKind          string            `json:"device_kind"`
	Backend             string            `json:"backend"`
	Conf                string            `json:"conf,omitempty"`
	Goroutines          int               `json:"goroutines"`
	Stream              string            `json:"stream"`
	Verify              string            `json:"verify"`
	Ops                 int64             `json:"ops"`
	Allocs              int64             `json:"allocs"`
	Frees               int64             `json:"frees"`
	OutOfMemory         int64             `json:"out_of_memory"`
	ElapsedSeconds      float64           `json:"elapsed_s"`
	OpsPerSecond        float64           `json:"ops_per_s"`
	VerifiedBlocks      int64             `json:"verified_blocks"`
	VerifiedBytes       uint64            `json:"verified_bytes"`
	PeakLiveBytes       uint64            `json:"peak_live_bytes"`
	PeakReservedBytes   uint64            `json:"peak_reserved_bytes"`
	CapBytes            uint64            `json:"cap_bytes"`
	DeviceCalls         uint64            `json:"device_calls"`
	DeviceCallsByName   map[string]uint64 `json:"device_calls_by_name"`
	WorkloadDeviceCalls uint64            `json:"workload_device_calls"`
	Pool                *poolSummary      `json:"pool,omitempty"`
	ProblemCount        int64             `json:"problem_count"`
	Problems            []string          `json:"problems"`
	ErrorCount          int64             `json:"error_count"`
	Errors              []string          `json:"errors"`
	// OversizedRequests: requests drawn above a goroutine's share of
	// --max-live, not made (not counted in Ops).
	OversizedRequests int64 `json:"oversized_requests"`
	// Interrupted: SIGINT or SIGTERM ended the run before its --ops or
	// --duration did; the figures are those of what ran.
	Interrupted bool `json:"interrupted,omitempty"`
	OK          bool `json:"ok"`
}

// poolSummary is what a TLSF pool's statistics add to a run's outcome.
type poolSummary struct {
	Grows         uint64  `json:"grows"`
	Releases      uint64  `json:"releases"`
	ReleasedBytes uint64  `json:"released_bytes"`
	Retries       uint64  `json:"retries"`
	OutOfMemory   uint64  `json:"out_of_memory"`
	CachedBytes   uint64  `json:"cached_bytes"`
	CachedBlocks  int64   `json:"cached_blocks"`
	Fragmentation float64 `json:"fragmentation"`
	ReservedBytes uint64  `json:"reserved_bytes"`
	// DeviceCallsByPath: the allocator's driver calls by the part of the
	// pool that made them (pool.Path), each by driver entry point, the
	// non-zero ones.
	DeviceCallsByPath map[string]map[string]uint64 `json:"device_calls_by_path"`
}

func runRun(cmd *cobra.Command, g *globalFlags, o *runOpts) error {
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	ds, err := openDevices(g, true)
	if err != nil {
		return err
	}
	defer ds.close()
	if ds.note != "" {
		fmt.Fprintln(errw, "tlsf-stress:", ds.note)
	}
	dev, release := ds.get()
	defer release()
	total, err := deviceTotal(dev)
	if err != nil {
		return err
	}
	cfg, err := o.config(total)
	if err != nil {
		return err
	}
	capBytes := o.cap.resolve(total)
	a, err := newAllocator(dev, o.backend, allocOptions{base: ds.pool, capBytes: capBytes})
	if err != nil {
		return err
	}
	s := newStress(cmd.Context(), dev, a, cfg)
	stopProgress := showProgress(errw, s, &o.workloadFlags)
	rep := s.run()
	stopProgress()
	res := summarize(ds, dev, a, &o.workloadFlags, rep)
	res.CapBytes = capBytes
	res.Interrupted = cmd.Context().Err() != nil
	if err := a.close(); err != nil {
		res.ErrorCount++
		res.Errors = append(res.Errors, "closing the allocator: "+err.Error())
		res.OK = false
	}
	if o.json {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return err
		}
	} else {
		printRunSummary(out, res)
	}
	if !res.OK {
		return errFailed
	}
	return nil
}

// summarize turns a stress report and the allocator's figures into a
// runResult. The allocator must still be open.
func summarize(ds *devices, dev device.Device, a allocator, w *workloadFlags, rep *stressReport) *runResult {
	problems, errs, opsPerSecond := rep.outcome()
	res := &runResult{
		Conf:   ds.confOf(w.backend),
		Device: dev.Name(), DeviceKind: ds.kind, Backend: w.backend, Goroutines: w.goroutines,
		Stream: w.stream, Verify: w.verify,
		Ops: rep.Ops, Allocs: rep.Allocs, Frees: rep.Frees, OutOfMemory: rep.OOMs,
		ElapsedSeconds: rep.Elapsed.Seconds(), OpsPerSecond: opsPerSecond,
		VerifiedBlocks: rep.VerifiedBlocks, VerifiedBytes: rep.VerifiedBytes,
		PeakLiveBytes: rep.PeakLive, WorkloadDeviceCalls: rep.WorkCalls.Total(),
		ProblemCount: rep.ProblemCount, Problems: problems, ErrorCount: rep.ErrorCount, Errors: errs,
		OversizedRequests: rep.Oversized,
	}
	if peak, err := a.peakReserved(); err == nil {
		res.PeakReservedBytes = peak
	}
	c := a.calls()
	res.DeviceCalls, res.DeviceCallsByName = c.Total(), c.Map()
	if p, ok := a.(poolAlloc); ok {
		st := p.Stats()
		res.Pool = &poolSummary{
			Grows: st.Grows, Releases: st.Releases, ReleasedBytes: st.ReleasedBytes, Retries: st.Retries,
			OutOfMemory: st.OutOfMemory, CachedBytes: st.Cached, CachedBlocks: st.CachedBlocks,
			Fragmentation: st.Fragmentation, ReservedBytes: st.Reserved,
			DeviceCallsByPath: st.DeviceCallsByPath.Map(),
		}
	}
	res.OK = res.ProblemCount == 0 && res.ErrorCount == 0
	return res
}

// interruptedNote is what a report's first line says of a run a signal
// ended early.
func interruptedNote(interrupted bool) string {
	if interrupted {
		return " (interrupted)"
	}
	return ""
}

// outcome returns what run and run --devices report of rep besides its
// counts: its problems and errors, empty rather than nil (--json writes
// arrays), and its operations per second (0 when no time passed).
func (rep *stressReport) outcome() (problems, errs []string, opsPerSecond float64) {
	problems, errs = rep.Problems, rep.Errors
	if problems == nil {
		problems = []string{}
	}
	if errs == nil {
		errs = []string{}
	}
	if rep.Elapsed > 0 {
		opsPerSecond = float64(rep.Ops) / rep.Elapsed.Seconds()
	}
	return problems, errs, opsPerSecond
}

func printRunSummary(w io.Writer, r *runResult) {
	fmt.Fprintf(w, "run%s: %d ops in %.2fs (%.0f ops/s) on %s (%s), backend %s, %d goroutines, %s stream\n",
		interruptedNote(r.Interrupted), r.Ops, r.ElapsedSeconds, r.OpsPerSecond, r.Device, r.DeviceKind, r.Backend, r.Goroutines, r.Stream)
	fmt.Fprintf(w, "  allocs %d, frees %d, out of memory %d\n", r.Allocs, r.Frees, r.OutOfMemory)
	if r.Allocs+r.OutOfMemory+r.Frees > r.Ops {
		fmt.Fprintln(w, "  (allocs + out of memory + frees exceed ops by the blocks live at the end, freed after the last op)")
	}
	if r.OversizedRequests > 0 {
		fmt.Fprintf(w, "  %d requests not made: larger than a goroutine's share of --max-live (counted in --ops, not in ops)\n", r.OversizedRequests)
	}
	fmt.Fprintf(w, "  verified (%s) %d blocks, %s read back\n", r.Verify, r.VerifiedBlocks, gib(r.VerifiedBytes))
	ratio := 0.0
	if r.PeakLiveBytes > 0 {
		ratio = float64(r.PeakReservedBytes) / float64(r.PeakLiveBytes)
	}
	fmt.Fprintf(w, "  peak live %s, peak reserved %s (%.3f× live)", gib(r.PeakLiveBytes), gib(r.PeakReservedBytes), ratio)
	if r.CapBytes > 0 {
		fmt.Fprintf(w, ", cap %s", gib(r.CapBytes))
	}
	fmt.Fprintln(w)
	if p := r.Pool; p != nil {
		fmt.Fprintf(w, "  pool: grows %d, releases %d (%s), OOM retries %d, caches hold %d blocks (%s) at the end, fragmentation %.3f\n",
			p.Grows, p.Releases, gib(p.ReleasedBytes), p.Retries, p.CachedBlocks, gib(p.CachedBytes), p.Fragmentation)
		for _, path := range slices.Sorted(maps.Keys(p.DeviceCallsByPath)) {
			fmt.Fprintf(w, "  pool's device calls on its %s path %s\n", path, formatCalls(p.DeviceCallsByPath[path]))
		}
	}
	fmt.Fprintf(w, "  allocator's device calls %d %s; the workload's (fills, copies, syncs) %d\n", r.DeviceCalls, formatCalls(r.DeviceCallsByName), r.WorkloadDeviceCalls)
	fmt.Fprintf(w, "  problems %d, errors %d\n", r.ProblemCount, r.ErrorCount)
	for _, p := range r.Problems {
		fmt.Fprintln(w, "  PROBLEM:", p)
	}
	for _, e := range r.Errors {
		fmt.Fprintln(w, "  ERROR:", e)
	}
	if r.ProblemCount > int64(len(r.Problems)) {
		fmt.Fprintf(w, "  (%d more problems not shown)\n", r.ProblemCount-int64(len(r.Problems)))
	}
}

// formatCalls formats call counts as "(cuMemAlloc 3, cuMemFree 2)".
func formatCalls(m map[string]uint64) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%s %d", k, m[k]))
	}
	return "(" + strings.Join(parts, ", ") + ")"
}

// isTerminal reports whether w is a terminal (an *os.File that is one).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// showProgress reports a running workload's progress on w: an mpb bar
// where w is a terminal, plain lines every w.progressInt otherwise. It
// returns the function that stops it.
func showProgress(w io.Writer, s interface{ opsDone() int64 }, o *workloadFlags) func() {
	stop := make(chan struct{})
	done := make(chan struct{})
	start := time.Now()
	if isTerminal(w) {
		total := o.ops
		byTime := total == 0
		if byTime {
			total = o.duration.Milliseconds()
		}
		p := mpb.New(mpb.WithOutput(w), mpb.WithRefreshRate(200*time.Millisecond))
		bar := p.AddBar(total,
			mpb.PrependDecorators(decor.Name("run "), decor.Any(func(decor.Statistics) string {
				return fmt.Sprintf("%d ops", s.opsDone())
			})),
			mpb.AppendDecorators(decor.Percentage(), decor.Name(" "), decor.Any(func(decor.Statistics) string {
				el := time.Since(start).Seconds()
				if el <= 0 {
					return ""
				}
				return fmt.Sprintf("%.0f ops/s", float64(s.opsDone())/el)
			})))
		go func() {
			defer close(done)
			t := time.NewTicker(100 * time.Millisecond)
			defer t.Stop()
			for {
				cur := s.opsDone()
				if byTime {
					cur = time.Since(start).Milliseconds()
				}
				bar.SetCurrent(min(cur, total))
				select {
				case <-stop:
					bar.SetCurrent(total)
					p.Wait()
					return
				case <-t.C:
				}
			}
		}()
		return func() { close(stop); <-done }
	}
	if o.progressInt <= 0 {
		return func() {}
	}
	go func() {
		defer close(done)
		t := time.NewTicker(o.progressInt)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-t.C:
				n := s.opsDone()
				line := fmt.Sprintf("run: %d ops", n)
				if o.ops > 0 {
					line += fmt.Sprintf(" (%.0f%%)", 100*float64(n)/float64(o.ops))
				}
				fmt.Fprintf(w, "%s, %.0f ops/s, %.0fs\n", line, float64(n)/time.Since(start).Seconds(), time.Since(start).Seconds())
			}
		}
	}()
	return func() { close(stop); <-done }
}
