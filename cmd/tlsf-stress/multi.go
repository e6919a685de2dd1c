package main

// multi: K processes on one GPU, each with a pool capped by a fraction
// policy (pool.Options.MaxFraction), each running the stress workload with
// a live-byte target above its share, so that together they oversubscribe
// the device. What must hold: every process ends with clean
// out-of-memory errors (counted), no corruption, no lost blocks, no
// crash.
//
// On a GPU the K processes are real: the command re-executes itself
// (os.Executable) K times with the hidden subcommand multi-child, and
// reads one JSON line from each child's standard output. A simulated GPU
// cannot be shared between processes, so on the simulated device the K
// "processes" are goroutines, each on its own sim.Device process handle
// (Sim.NewProcess) of one simulated GPU: separate address spaces and
// handles, one shared capacity, which is what the fraction policy reacts
// to. --exec forces real child processes on the simulated device too;
// each child then has a simulated GPU of its own, so nothing is shared and
// only the plumbing is tested.

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/spf13/cobra"
)

// multiChildCmd is the hidden subcommand a multi child runs.
const multiChildCmd = "multi-child"

// defaultMultiOps is each child's number of operations by default.
const defaultMultiOps = 20_000

type multiOpts struct {
	workloadFlags
	procs         int
	fraction      float64
	oversubscribe float64
	exec          bool
}

func newMultiCmd(g *globalFlags) *cobra.Command {
	o := &multiOpts{}
	cmd := &cobra.Command{
		Use:   "multi [--procs K] [flags]",
		Short: "K processes share one GPU, each pool capped by a fraction; oversubscribed, they must fail cleanly",
		Long: `Run K processes on one GPU, each with a pool whose reserved memory is capped at
--fraction (default 1/K) of the device's total memory (pool.Options.MaxFraction,
less what that share leaves for the process's CUDA context), each running the
stress workload of 'run' with a live-byte target of --oversubscribe times its
share of the device (block sizes log-uniform between 1/4096 and 1/16 of that
target unless --sizes names a trace). Together they ask for more memory than
there is: out-of-memory errors are expected and counted; corruption, lost
blocks, other errors or a crashed process are failures (exit status 1).

On a GPU the processes are real child processes. On the simulated device they
are goroutines, each a separate simulated process (sim.Device.NewProcess) on
one simulated GPU whose capacity they share; --exec runs real child processes
there too, each with its own simulated GPU.`,
		Args: wrapArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(cmd); err != nil {
				return err
			}
			for _, name := range []string{"max-live", "min-size", "max-size"} {
				if cmd.Flags().Changed(name) {
					return usagef("--%s: multi sizes each process's workload from --oversubscribe (and --sizes)", name)
				}
			}
			if o.procs < 1 {
				return usagef("--procs %d: want at least 1", o.procs)
			}
			if o.fraction == 0 {
				o.fraction = 1 / float64(o.procs)
			}
			if !(o.fraction > 0 && o.fraction <= 1) {
				return usagef("--fraction %v: want a fraction in (0, 1]", o.fraction)
			}
			if !(o.oversubscribe > 0 && o.oversubscribe <= maxOversubscribe) {
				return usagef("--oversubscribe %v: want a positive factor, at most %d", o.oversubscribe, maxOversubscribe)
			}
			if o.backend == backendAsync {
				return usagef("--backend async: the driver's pool has no fraction policy; multi takes tlsf-vmm, tlsf-chunks or passthrough")
			}
			return runMulti(cmd, g, o)
		},
	}
	o.register(cmd, defaultMultiOps)
	f := cmd.Flags()
	f.Lookup("ops").Usage = "operations of each process (allocations, failed ones too, and frees); 0 with --duration: until the duration is over (with --duration and no --ops, 0)"
	f.Lookup("json").Usage = "print the outcome as one JSON object per line, one per process"
	f.Lookup("sizes").Usage = "block sizes: log-uniform between 1/4096 and 1/16 of the live target, or the size distribution of a trace (embedded name or file)"
	f.IntVar(&o.procs, "procs", 2, "number of processes")
	f.Float64Var(&o.fraction, "fraction", 0, "each pool's MaxFraction (default, and 0: 1/procs)")
	f.Float64Var(&o.oversubscribe, "oversubscribe", 1.5, "each process's live-byte target, in multiples of its share (total memory / procs)")
	f.BoolVar(&o.exec, "exec", false, "on the simulated device, run real child processes (each with its own simulated GPU)")
	for _, name := range []string{"max-live", "min-size", "max-size"} {
		_ = f.MarkHidden(name) // multi derives them from --oversubscribe, and refuses them
	}
	return cmd
}

// childResult is the JSON line a multi child reports: its index, process
// ID and fraction, then run's outcome (runResult, inlined).
type childResult struct {
	Proc        int     `json:"proc"`
	PID         int     `json:"pid"`
	MaxFraction float64 `json:"max_fraction"`
	ExitStatus  int     `json:"exit_status"`
	// TotalBytes is the device's total memory; Share is peak reserved
	// over it; CallsPerOp is the pool's driver calls per operation.
	TotalBytes uint64  `json:"total_bytes"`
	Share      float64 `json:"share"`
	CallsPerOp float64 `json:"device_calls_per_op"`
	// Fairness is the largest Share over the smallest of all processes,
	// filled in by the parent (0 in a child's own line).
	Fairness float64 `json:"fairness"`
	// OOMWithinShare counts the out-of-memory errors of requests that
	// would have left the live bytes within 90% of the pool's share, its
	// cap (pool.Pool.Cap: MaxFraction × total, less what the cap leaves
	// for the process's CUDA context): a pool should serve those.
	OOMWithinShare int64 `json:"out_of_memory_within_90pct_of_share"`
	// OOMStillWithin counts those of them whose live bytes were still
	// within 90% of the share, the request included, when it returned
	// (live bytes count other goroutines' requests in flight too): the
	// others may have been above it when the pool decided, another
	// goroutine's request, begun meanwhile, having come first.
	OOMStillWithin int64 `json:"out_of_memory_still_within_90pct_of_share"`
	*runResult
}

// childOpts are what the parent tells a child.
type childOpts struct {
	workloadFlags
	index    int
	fraction float64
}

// args are the command line of a child process.
func (o *childOpts) args(g *globalFlags, kind string) []string {
	a := []string{multiChildCmd,
		"--index", strconv.Itoa(o.index), "--fraction", strconv.FormatFloat(o.fraction, 'g', -1, 64),
		"--device", kind, "--backend", o.backend, "--goroutines", strconv.Itoa(o.goroutines),
		"--ops", strconv.FormatInt(o.ops, 10), "--duration", o.duration.String(), "--sizes", o.sizes,
		"--min-size", o.minSize.String(), "--max-size", o.maxSize.String(), "--slots", strconv.Itoa(o.slots),
		"--max-live", o.maxLive.String(), "--verify", o.verify, "--stream", o.stream,
		"--seed", strconv.FormatUint(o.seed, 10), "--progress-interval", o.progressInt.String(),
	}
	if g.simCapacity > 0 {
		a = append(a, "--sim-capacity", g.simCapacity.String())
	}
	if g.simRealTime {
		a = append(a, "--sim-real-time")
	}
	if g.conf != "" {
		a = append(a, "--conf", g.conf)
	}
	return a
}

func newMultiChildCmd(g *globalFlags) *cobra.Command {
	o := &childOpts{}
	cmd := &cobra.Command{
		Use:    multiChildCmd,
		Short:  "one process of multi (internal)",
		Hidden: true,
		Args:   wrapArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := o.validate(cmd); err != nil {
				return err
			}
			ds, err := openDevices(g, true)
			if err != nil {
				return err
			}
			defer ds.close()
			dev, release := ds.get()
			defer release()
			res := runChild(cmd.Context(), ds, dev, o, cmd.ErrOrStderr())
			if err := json.NewEncoder(cmd.OutOrStdout()).Encode(res); err != nil {
				return err
			}
			if !res.OK {
				return errFailed
			}
			return nil
		},
	}
	o.register(cmd, defaultMultiOps)
	f := cmd.Flags()
	f.IntVar(&o.index, "index", 0, "this child's index")
	f.Float64Var(&o.fraction, "fraction", 1, "the pool's MaxFraction")
	return cmd
}

// maxOversubscribe bounds --oversubscribe: a live target of a thousand
// shares is far past any useful oversubscription, and stays a byte count.
const maxOversubscribe = 1000

// preflight checks on dev, before multi starts its processes, what each
// would fail on at its start: the size distribution (--sizes) and a pool
// of the process's share (made and closed again).
func (o *childOpts) preflight(dev device.Device, ds *devices, total uint64) error {
	if _, err := o.config(total); err != nil {
		return err
	}
	a, err := newAllocator(dev, o.backend, allocOptions{base: ds.pool, maxFraction: o.fraction})
	if err != nil {
		return fmt.Errorf("a pool of --fraction %v: %w", o.fraction, err)
	}
	return a.close()
}

// runChild runs one process's share of multi on dev and returns its
// outcome; a panic becomes a reported error, not a crash of the parent.
// Progress lines go to progress every --progress-interval.
func runChild(ctx context.Context, ds *devices, dev device.Device, o *childOpts, progress io.Writer) (res *childResult) {
	res = &childResult{Proc: o.index, PID: os.Getpid(), MaxFraction: o.fraction}
	fail := func(format string, args ...any) {
		if res.runResult == nil {
			res.runResult = &runResult{Device: dev.Name(), DeviceKind: ds.kind, Backend: o.backend, Problems: []string{}, Errors: []string{}}
		}
		res.ErrorCount++
		res.Errors = append(res.Errors, fmt.Sprintf(format, args...))
		res.OK = false
	}
	defer func() {
		if p := recover(); p != nil {
			fail("panic: %v", p)
		}
	}()
	total, err := deviceTotal(dev)
	if err != nil {
		fail("%v", err)
		return res
	}
	cfg, err := o.config(total)
	if err != nil {
		fail("%v", err)
		return res
	}
	cfg.share = uint64(o.fraction * float64(total))
	a, err := newAllocator(dev, o.backend, allocOptions{base: ds.pool, maxFraction: o.fraction})
	if err != nil {
		fail("%v", err)
		return res
	}
	if pa, ok := a.(poolAlloc); ok {
		// The pool's own cap: MaxFraction × total less what it leaves for
		// the process's context (pool.Pool.Cap).
		if c, err := pa.Cap(); err == nil && c > 0 {
			cfg.share = c
		}
	}
	s := newStress(ctx, dev, a, cfg)
	stop := showProgress(progress, s, &o.workloadFlags)
	rep := s.run()
	stop()
	res.runResult = summarize(ds, dev, a, &o.workloadFlags, rep)
	res.Interrupted = ctx.Err() != nil
	res.TotalBytes, res.OOMWithinShare, res.OOMStillWithin = total, rep.OOMsWithin, rep.OOMsStill
	res.CapBytes = cfg.share // the pool's cap, or MaxFraction × total
	if total > 0 {
		res.Share = float64(res.PeakReservedBytes) / float64(total)
	}
	if res.Ops > 0 {
		res.CallsPerOp = float64(res.DeviceCalls) / float64(res.Ops)
	}
	if err := a.close(); err != nil {
		fail("closing the pool: %v", err)
	}
	if sd, ok := dev.(*sim.Device); ok {
		if used := sd.Used(); used != 0 {
			res.ProblemCount++
			res.Problems = append(res.Problems, fmt.Sprintf("lost memory: the process holds %d bytes of the simulated GPU after closing its pool", used))
			res.OK = false
		}
	}
	return res
}

// contextsFit refuses --procs K where K CUDA contexts would hold more
// than half the device's total bytes, leaving each process's pool less
// than its context: every process would then fail nearly every request.
// A context's bytes are the parent's own, total − free of dev when multi
// starts (a simulated process's sim.Device.ContextBytes), at most
// total/256 as the pool bounds them (pool.Options.MaxFraction), and at
// least 1 MiB or total/256, whichever is less (a simulated device may
// model no context); on an H200 the bound is about 130 processes.
func contextsFit(dev device.Device, total uint64, procs int) error {
	free, _, err := dev.MemGetInfo()
	if err != nil {
		return err
	}
	ctx := uint64(0)
	if free < total {
		ctx = total - free
	}
	ctx = min(max(ctx, 1<<20), total/256)
	if most := total / 2 / max(ctx, 1); uint64(procs) > most {
		return usagef("--procs %d: %d CUDA contexts of about %s would hold more than half of the device's %s; want at most %d", procs, procs, capacityName(ctx), gib(total), most)
	}
	return nil
}

func runMulti(cmd *cobra.Command, g *globalFlags, o *multiOpts) error {
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	ds, err := openDevices(g, true)
	if err != nil {
		return err
	}
	if ds.note != "" {
		fmt.Fprintln(errw, "tlsf-stress:", ds.note)
	}
	// Each simulated process's context holds device memory, as a CUDA
	// context does (which a MaxFraction cap leaves room for, as on a real
	// GPU): an H200's, in proportion to the simulated capacity.
	ds.sd.ContextBytes = sim.H200ContextBytes
	if c := ds.sd.Capacity; c > 0 {
		ds.sd.ContextBytes = uint64(float64(sim.H200ContextBytes) * float64(c) / float64(sim.H200Capacity))
	}
	// The children's workload: a live-byte target above the share.
	base, release := ds.get()
	total, err := deviceTotal(base)
	if err != nil {
		release()
		ds.close()
		return err
	}
	if err := contextsFit(base, total, o.procs); err != nil {
		release()
		ds.close()
		return err
	}
	target := uint64(o.oversubscribe * float64(total) / float64(o.procs))
	co := childOpts{workloadFlags: o.workloadFlags, fraction: o.fraction}
	co.maxLive = capFlag{bytes: target}
	if o.sizes == "log-uniform" {
		co.minSize, co.maxSize = sizeFlag(max(256, target/4096)), sizeFlag(max(256, target/16))
	}
	// What every process would fail on, refused before any starts: a
	// --sizes trace that does not load, a share the pool refuses.
	if err := co.preflight(base, ds, total); err != nil {
		release()
		ds.close()
		return err
	}

	results := make([]*childResult, o.procs)
	if ds.kind == deviceSim && !o.exec {
		sd := base.(*sim.Device)
		var wg sync.WaitGroup
		for i := range o.procs {
			c := co
			c.index, c.seed = i, o.seed+uint64(i)
			dev := sd
			if i > 0 {
				dev = sd.NewProcess()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = runChild(cmd.Context(), ds, dev, &c, &prefixWriter{w: errw, prefix: fmt.Sprintf("[proc %d] ", i)})
			}()
		}
		wg.Wait()
		release()
		ds.close()
	} else {
		// Real processes: the parent lets go of the GPU first.
		release()
		ds.close()
		exe, err := os.Executable()
		if err != nil {
			return fmt.Errorf("finding this program to re-execute: %w", err)
		}
		var wg sync.WaitGroup
		for i := range o.procs {
			c := co
			c.index, c.seed = i, o.seed+uint64(i)
			wg.Add(1)
			go func() {
				defer wg.Done()
				results[i] = execChild(cmd.Context(), exe, c.args(g, ds.kind), i, errw)
			}()
		}
		wg.Wait()
	}

	fair := fairness(results)
	ok := true
	for _, r := range results {
		r.Fairness = fair
		ok = ok && r.OK
		if o.json {
			if err := json.NewEncoder(out).Encode(r); err != nil {
				return err
			}
		}
	}
	if !o.json {
		printMulti(out, ds, o, target, results)
	}
	if !ok {
		return errFailed
	}
	return nil
}

// execChild runs one child process and returns the outcome it reported;
// a child that crashed or reported nothing gets an outcome saying so.
func execChild(ctx context.Context, exe string, args []string, index int, errw io.Writer) *childResult {
	cmd := exec.CommandContext(ctx, exe, args...)
	// When ctx ends (SIGINT or SIGTERM to this process), the child is
	// interrupted as the terminal would, so that it stops and reports;
	// one that has not exited childWaitDelay later is killed.
	cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) }
	cmd.WaitDelay = childWaitDelay
	var stdout bytes.Buffer
	cmd.Stdout = &stdout
	cmd.Stderr = &prefixWriter{w: errw, prefix: fmt.Sprintf("[proc %d] ", index)}
	err := cmd.Run()
	status := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		status = ee.ExitCode()
	case err != nil && cmd.ProcessState != nil:
		// Interrupted (ctx ended), the child exited with status 0: Run
		// reports ctx's error.
		status = cmd.ProcessState.ExitCode()
	case err != nil:
		return failedChild(index, -1, fmt.Sprintf("starting the child: %v", err))
	}
	var res *childResult
	sc := bufio.NewScanner(&stdout)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) > 0 && line[0] == '{' {
			// runResult is unexported, so json cannot allocate it.
			r := &childResult{runResult: &runResult{}}
			if json.Unmarshal(line, r) == nil && r.Device != "" {
				res = r
			}
		}
	}
	if res == nil {
		return failedChild(index, status, fmt.Sprintf("the child exited with status %d without reporting an outcome (crashed?)", status))
	}
	res.ExitStatus = status
	if status != exitOK && status != exitFailed {
		res.OK = false
		res.ErrorCount++
		res.Errors = append(res.Errors, fmt.Sprintf("the child exited with status %d", status))
	}
	return res
}

// childWaitDelay is how long an interrupted child has to stop and report
// before it is killed: a goroutine's operation in progress ends within
// it, unless the device hangs.
const childWaitDelay = 30 * time.Second

func failedChild(index, status int, msg string) *childResult {
	return &childResult{Proc: index, ExitStatus: status, runResult: &runResult{
		ErrorCount: 1, Errors: []string{msg}, Problems: []string{},
	}}
}

// prefixWriter writes each line with a prefix; safe for concurrent use by
// the children sharing one writer.
type prefixWriter struct {
	w      io.Writer
	prefix string
	buf    []byte
}

var prefixMu sync.Mutex

func (p *prefixWriter) Write(b []byte) (int, error) {
	prefixMu.Lock()
	defer prefixMu.Unlock()
	p.buf = append(p.buf, b...)
	for {
		i := bytes.IndexByte(p.buf, '\n')
		if i < 0 {
			break
		}
		if _, err := fmt.Fprintf(p.w, "%s%s\n", p.prefix, p.buf[:i]); err != nil {
			return 0, err
		}
		p.buf = p.buf[i+1:]
	}
	return len(b), nil
}

func printMulti(w io.Writer, ds *devices, o *multiOpts, target uint64, results []*childResult) {
	simulated := ds.kind == deviceSim && !o.exec
	how := "child processes"
	switch {
	case simulated && o.procs == 1:
		how = "simulated process"
	case simulated:
		how = "simulated processes sharing one simulated GPU"
	case o.procs == 1:
		how = "child process"
	}
	fmt.Fprintf(w, "multi: %d %s on %s (%s), backend %s, MaxFraction %.3f each, live target %s each (%.2f× a share)\n",
		o.procs, how, ds.name(), ds.kind, o.backend, o.fraction, gib(target), o.oversubscribe)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "proc\tpid\tops\tallocs\tfrees\tout of memory\twithin 90%\tpeak live\tpeak reserved\tshare\tcalls/op\tproblems\terrors\tstatus\t")
	var ooms, within, still int64
	for _, r := range results {
		status := "ok"
		switch {
		case !r.OK:
			status = "FAILED"
		case r.Interrupted:
			status = "interrupted"
		}
		ooms += r.OutOfMemory
		within += r.OOMWithinShare
		still += r.OOMStillWithin
		fmt.Fprintf(tw, "%d\t%d\t%d\t%d\t%d\t%d\t%d\t%s\t%s\t%.3f\t%.2f\t%d\t%d\t%s\t\n", r.Proc, r.PID, r.Ops, r.Allocs, r.Frees, r.OutOfMemory, r.OOMWithinShare,
			gib(r.PeakLiveBytes), gib(r.PeakReservedBytes), r.Share, r.CallsPerOp, r.ProblemCount, r.ErrorCount, status)
	}
	tw.Flush()
	fmt.Fprintln(w, "ops: workload operations (an allocation tried, or a free); allocs + out of memory + frees exceed it by the")
	fmt.Fprintln(w, "blocks still live at the end, freed after the last. calls/op: the pool's driver calls per op. problems:")
	fmt.Fprintln(w, "verification failures (corrupted or lost blocks, misuse a simulated device saw); errors: calls that failed")
	fmt.Fprintln(w, "other than out of memory. Runs with one --seed differ: the goroutines' interleaving is not fixed.")
	for _, r := range results {
		for _, p := range r.Problems {
			fmt.Fprintf(w, "  proc %d PROBLEM: %s\n", r.Proc, p)
		}
		for _, e := range r.Errors {
			fmt.Fprintf(w, "  proc %d ERROR: %s\n", r.Proc, e)
		}
	}
	fmt.Fprintf(w, "out-of-memory errors: %d in all (expected when oversubscribed; each one a clean ErrOutOfMemory), %d of them from requests within 90%% of the share, %d still within it when they returned (target 0; in the others another goroutine's request, begun meanwhile, took the live bytes above it)\n", ooms, within, still)
	if len(results) > 0 {
		fmt.Fprintf(w, "fairness: max share / min share = %.3f (shares of peak reserved over total memory)\n", results[0].Fairness)
	}
}

// fairness is the largest share of the device over the smallest among the
// processes that reported one (0 if none did, +Inf if one held nothing).
func fairness(results []*childResult) float64 {
	lo, hi := math.Inf(1), 0.0
	for _, r := range results {
		if r.runResult == nil || r.TotalBytes == 0 {
			continue
		}
		lo, hi = min(lo, r.Share), max(hi, r.Share)
	}
	if hi == 0 {
		return 0
	}
	return hi / lo
}
