package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"slices"
	"strings"
	"syscall"

	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/pool"

	"github.com/spf13/cobra"
)

// Exit statuses (see doc.go).
const (
	exitOK     = 0
	exitFailed = 1 // failed replays, corruption, lost blocks, errors
	exitUsage  = 2 // bad flags or arguments
	// exitInterrupted: SIGINT or SIGTERM stopped the run, which reported
	// what ran before it (128 + SIGINT's number, as shells give).
	exitInterrupted = 130
	usageSuffix     = "\nRun 'tlsf-stress --help' for usage."
)

// usageError is a command line the tool cannot run: exit status 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// errFailed reports a run that completed but found failures, already
// described in its output: exit status 1 with no further message.
var errFailed = errors.New("failures found")

// errInterrupted reports a run that SIGINT or SIGTERM stopped early (the
// context of execute ended) after it reported what ran: exit status 130.
var errInterrupted = errors.New("interrupted")

func main() {
	os.Exit(executeSignals(os.Args[1:]))
}

// interruptible names the subcommands a SIGINT or SIGTERM stops early,
// which then report what ran (executeContext): they watch their context,
// as the command alone does (replay --min-cap). The others (export,
// sanitize, help) end at once, as by default.
var interruptible = []string{"run", "multi", multiChildCmd, "replay"}

// takesSignals reports whether the command line args runs the command
// alone or an interruptible subcommand.
func takesSignals(args []string) bool {
	root := newRootCmd(io.Discard, io.Discard)
	root.InitDefaultHelpCmd() // as Execute does: "help" is a subcommand
	sub, _, err := root.Find(args)
	return err == nil && (sub == root || slices.Contains(interruptible, sub.Name()))
}

// executeSignals is execute stopped early by SIGINT or SIGTERM where the
// subcommand is interruptible (see executeContext). The first interrupt
// stops the run, a second ends the program. A multi child stops at the
// first and ends at the third: its parent interrupts it as the terminal
// may have done too.
func executeSignals(args []string) int {
	if !takesSignals(args) {
		return execute(args, os.Stdout, os.Stderr)
	}
	child := len(args) > 0 && args[0] == multiChildCmd
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	defer signal.Stop(sigs)
	done := make(chan struct{})
	defer close(done)
	caught := 1
	if child {
		caught = 2
	}
	go func() {
		for i := range caught {
			select {
			case <-done:
				return
			case <-sigs:
			}
			cancel()
			if i == 0 && !child {
				fmt.Fprintln(os.Stderr, "tlsf-stress: interrupted: stopping and reporting what ran (interrupt again to quit at once)")
			}
		}
		signal.Stop(sigs) // the next interrupt ends the program
	}()
	return executeContext(ctx, args, os.Stdout, os.Stderr)
}

// execute runs the command line args (without the program name), writing
// results to stdout and diagnostics to stderr, and returns the exit
// status. Tests call it in-process.
func execute(args []string, stdout, stderr io.Writer) int {
	return executeContext(context.Background(), args, stdout, stderr)
}

// executeContext is execute stopped early when ctx ends: run, multi and
// replay then report what ran before it and exit with status 130.
func executeContext(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	err := root.ExecuteContext(ctx)
	if ctx.Err() != nil && err == nil && (len(args) == 0 || args[0] != multiChildCmd) {
		// The run stopped as ctx ended, and reported, finding no failure
		// (one that did exits 1); a child's parent judges its report.
		err = errInterrupted
	}
	switch {
	case err == nil:
		return exitOK
	case errors.Is(err, errInterrupted):
		fmt.Fprintln(stderr, "tlsf-stress: interrupted: the report covers what ran before it")
		return exitInterrupted
	case errors.Is(err, errFailed):
		return exitFailed
	case errors.As(err, new(usageError)):
		fmt.Fprintf(stderr, "tlsf-stress: %v%s\n", err, usageSuffix)
		return exitUsage
	}
	fmt.Fprintf(stderr, "tlsf-stress: %v\n", err)
	return exitFailed
}

// globalFlags are the flags every subcommand takes.
type globalFlags struct {
	device      string   // "", "cuda" or "sim"
	simCapacity sizeFlag // bytes of a simulated GPU; 0: an H200's
	simRealTime bool     // the simulated GPU's calls take their modelled time (sim.Config.RealTime)
	conf        string   // --conf: pool options, TLSF_ALLOC_CONF syntax
	pool        pool.Options
}

// parseConf parses --conf: pool.ParseConf's keys except those that other
// flags set or that change what a backend is (backend, passthrough:
// --backend; device, sim_capacity: --device, --sim-capacity; max_bytes,
// max_fraction: --cap, and multi's --fraction).
func parseConf(s string) (pool.Options, error) {
	for _, kv := range strings.Split(s, ",") {
		switch k, _, _ := strings.Cut(kv, ":"); strings.TrimSpace(k) {
		case "backend", "passthrough":
			return pool.Options{}, usagef("--conf %q: the backend is --backend's", s)
		case "device", "sim_capacity":
			return pool.Options{}, usagef("--conf %q: the device is --device's and --sim-capacity's", s)
		case "max_bytes", "max_fraction":
			return pool.Options{}, usagef("--conf %q: the cap is --cap's (multi: --fraction's)", s)
		}
	}
	c, err := pool.ParseConf(s)
	if err != nil {
		return pool.Options{}, usagef("--conf: %v", err)
	}
	return c.Options, nil
}

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	g := &globalFlags{}
	ro := &replayOpts{warmRuns: replay.MinWarmRuns} // as replay's --warm-runs default
	root := &cobra.Command{
		Use:   "tlsf-stress",
		Short: "Replay allocation traces through the TLSF GPU memory pool, and stress it",
		Long: `tlsf-stress replays allocation traces through the TLSF device-memory pool and
its peers (cuMemAlloc, cuMemAllocAsync, and the figures of PyTorch's caching allocator
and CUB recorded on an H200), and stress-tests the
pool with verified random workloads, on a CUDA GPU or on the simulated H200.

Without a subcommand it replays every embedded trace (` + strings.Join(trace.Names(), ", ") + `) with every
backend, on the GPU when a CUDA driver is found and on the simulated device
otherwise, finds each backend's smallest feasible cap (replay --min-cap), and
prints the table, where each row says where its figures were measured (this
run, or the peers' H200 figures in baseline.json), and one verdict line per
trace: our best pool backend against the best peer. It is 'replay --min-cap'.`,
		Args:          wrapArgs(cobra.NoArgs),
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, args []string) error {
			ro.backends, ro.minCap = allBackends, true
			return runReplay(cmd, g, ro, trace.Names())
		},
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	pf := root.PersistentFlags()
	pf.StringVar(&g.device, "device", "", "cuda or sim (default: cuda where a CUDA driver and GPU are found, else sim)")
	pf.Var(&g.simCapacity, "sim-capacity", "memory of the simulated GPU in bytes (suffixes KiB, MiB, GiB, TiB or K, M, G, T; KB, MB, GB, TB decimal) (default: an H200's 143771 MiB); chooses --device sim")
	pf.StringVar(&g.conf, "conf", "", "options of every pool backend, as TLSF_ALLOC_CONF gives them to the C ABI (e.g. release_fraction:0.05,wilderness:true; the keys capi/tlsf.h lists but backend, passthrough, device, sim_capacity, max_bytes and max_fraction, which other flags set)")
	pf.BoolVar(&g.simRealTime, "sim-real-time", false, "the simulated GPU's driver calls take their modelled H200 durations in real time, so that processes sharing it interleave as on a GPU; chooses --device sim")
	root.PersistentPreRunE = func(cmd *cobra.Command, args []string) error {
		makesPools := cmd.Name() != "export" && cmd.Name() != "help"
		if _, err := pool.PassthroughFromEnv(); err != nil && makesPools {
			return err // every pool.New would fail with it
		}
		var err error
		g.conf = strings.TrimSpace(g.conf)
		if g.pool, err = parseConf(g.conf); err != nil {
			return err
		}
		if passthroughForced() && cmd.Name() != multiChildCmd && makesPools {
			fmt.Fprintln(cmd.ErrOrStderr(), "tlsf-stress:", passthroughNote)
		}
		if g.simCapacity > 0 && g.simCapacity < pool.MinSimCapacity {
			return usagef("--sim-capacity %d: below the simulated GPU's allocation granularity of %d bytes (2 MiB), no pool could map a page", uint64(g.simCapacity), pool.MinSimCapacity)
		}
		if g.simCapacity > pool.MaxSimCapacity {
			return usagef("--sim-capacity %d: above %d bytes (1 TiB): a VMM pool reserves twice the device's memory of address space, of the 4 TiB a simulated process has", uint64(g.simCapacity), uint64(pool.MaxSimCapacity))
		}
		switch g.device {
		case "", deviceCUDA, deviceSim:
		default:
			return usagef("--device %q: want cuda or sim", g.device)
		}
		// The simulated GPU's flags choose it: on a machine with a GPU,
		// --device left out would otherwise measure the GPU and drop them.
		if f := cmd.Flags(); f.Changed("sim-capacity") || f.Changed("sim-real-time") {
			if g.device == deviceCUDA {
				return usagef("--sim-capacity and --sim-real-time describe the simulated GPU: not with --device cuda")
			}
			g.device = deviceSim
		}
		return nil
	}
	root.AddCommand(newReplayCmd(g), newRunCmd(g), newMultiCmd(g), newMultiChildCmd(g), newExportCmd(), newSanitizeCmd(g))
	root.CompletionOptions.DisableDefaultCmd = true
	return root
}

// wrapArgs makes an argument validator's errors usage errors.
func wrapArgs(f cobra.PositionalArgs) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if err := f(cmd, args); err != nil {
			return usageError{err}
		}
		return nil
	}
}
