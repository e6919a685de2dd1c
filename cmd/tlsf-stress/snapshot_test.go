package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/internal/trace"
	"github.com/stretchr/testify/require"
)

func TestReplaySnapshotWritesATraceThatReadsBack(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "snap.pickle")
	_, stderr, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm", "--snapshot", file, "lstm")
	require.Equal(t, 0, status, stderr)
	require.Contains(t, stderr, "snapshot of lstm with tlsf-vmm (PyTorch memory snapshot pickle): "+file)

	back, err := trace.ParseFile(file)
	require.NoError(t, err)
	orig, err := trace.Load("lstm")
	require.NoError(t, err)
	require.Equal(t, len(orig.Ops), len(back.Ops))
	for i := range orig.Ops {
		require.Equal(t, orig.Ops[i].Free, back.Ops[i].Free, "op %d", i)
		require.Equal(t, orig.Ops[i].Size, back.Ops[i].Size, "op %d", i)
	}
	require.Equal(t, orig.PeakLive(), back.PeakLive())
}

func TestReplaySnapshotWithSeveralTracesNamesEachFile(t *testing.T) {
	dir := t.TempDir()
	_, stderr, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-chunks", "--snapshot", filepath.Join(dir, "s.pickle"), "lstm", "tdnn")
	require.Equal(t, 0, status, stderr)
	for _, name := range []string{"s-lstm.pickle", "s-tdnn.pickle"} {
		require.Contains(t, stderr, filepath.Join(dir, name))
		_, err := trace.ParseFile(filepath.Join(dir, name))
		require.NoError(t, err)
	}
}

func TestReplaySnapshotRefusesABadPathAtOnce(t *testing.T) {
	_, stderr, status := cli(t, "replay", "--device", "sim", "--snapshot", "/no/such/dir/s.pickle", "lstm")
	require.Equal(t, exitUsage, status)
	require.Contains(t, stderr, `no directory "/no/such/dir"`)
	_, stderr, status = cli(t, "replay", "--device", "sim", "--backend", "async", "--snapshot", filepath.Join(t.TempDir(), "s.pickle"), "lstm")
	require.Equal(t, exitUsage, status)
	require.Contains(t, stderr, "--snapshot needs a pool backend")
	_, stderr, status = cli(t, "replay", "--device", "sim", "--plot", "/no/such/dir/p.svg", "lstm")
	require.Equal(t, exitUsage, status)
	require.Contains(t, stderr, `--plot "/no/such/dir/p.svg": no directory`)
}

// --snapshot and --plot never write over a trace they read, nor write two
// traces of one name to one file, and a bad per-trace name is found
// before the replays.
func TestReplayOutputsAreCheckedPerTraceAtOnce(t *testing.T) {
	dir := t.TempDir()
	in := filepath.Join(dir, "in.pickle")
	_, stderr, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-chunks", "--snapshot", in, "lstm")
	require.Equal(t, exitOK, status, stderr)
	before, err := os.ReadFile(in)
	require.NoError(t, err)
	for _, flag := range []string{"--snapshot", "--plot"} {
		out := in
		if flag == "--plot" {
			out = filepath.Join(dir, "in.svg")
			require.NoError(t, os.WriteFile(out, before, 0o644)) // a trace that happens to end in .svg
		}
		_, stderr, status = cli(t, "replay", "--device", "sim", "--backend", "tlsf-chunks", flag, out, out)
		require.Equal(t, exitUsage, status, stderr)
		require.Contains(t, stderr, "over the trace it reads")
	}
	after, err := os.ReadFile(in)
	require.NoError(t, err)
	require.Equal(t, before, after, "the trace read is unchanged")

	_, stderr, status = cli(t, "replay", "--device", "sim", "--snapshot", filepath.Join(dir, "s.pickle"), "lstm", "lstm")
	require.Equal(t, exitUsage, status)
	require.Contains(t, stderr, "trace lstm given twice")

	// With several traces the files are FILE-TRACE.ext: one that is a
	// directory is refused before any replay, while FILE may be one.
	require.NoError(t, os.Mkdir(filepath.Join(dir, "s-tdnn.pickle"), 0o755))
	_, stderr, status = cli(t, "replay", "--device", "sim", "--snapshot", filepath.Join(dir, "s.pickle"), "lstm", "tdnn")
	require.Equal(t, exitUsage, status)
	require.Contains(t, stderr, "s-tdnn.pickle\" is a directory")
	_, err = os.Stat(filepath.Join(dir, "s-lstm.pickle"))
	require.True(t, os.IsNotExist(err), "the check leaves no file behind")
	require.NoError(t, os.Mkdir(filepath.Join(dir, "d"), 0o755))
	_, stderr, status = cli(t, "replay", "--device", "sim", "--backend", "tlsf-chunks", "--warm-runs", "1", "--snapshot", filepath.Join(dir, "d"), "lstm", "tdnn")
	require.Equal(t, exitOK, status, stderr)
}

func TestReplayShowsWhyAllocationsFailedWithoutJSON(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm", "--cap", "1GiB", "lstm")
	require.Equal(t, exitOK, status, errs) // with --cap, failures are the measurement
	require.Regexp(t, `lstm tlsf-vmm: \d+ allocations failed in the first replay, \d+ in the 10 timed warm replays; first error: pool: out of memory: request of`, out)
	require.Contains(t, out, "(see below)")
}

func TestSimCapacityBelowTheGranularityIsRefused(t *testing.T) {
	_, errs, status := cli(t, "replay", "--device", "sim", "--sim-capacity", "1MiB", "lstm")
	require.Equal(t, exitUsage, status)
	require.Contains(t, errs, "--sim-capacity 1048576: below the simulated GPU's allocation granularity")
	_, errs, status = cli(t, "run", "--device", "sim", "--sim-capacity", "2MiB", "--ops", "10", "--max-size", "4096")
	require.Equal(t, exitOK, status, errs)
}

func TestSimCapacityAboveItsAddressSpaceIsRefused(t *testing.T) {
	for _, c := range []string{"1099511627777", "9223372036854775808", "16EiB"} {
		out, errs, status := cli(t, "replay", "--device", "sim", "--sim-capacity", c, "lstm")
		require.Equal(t, exitUsage, status, "%s: %s", c, errs)
		require.Empty(t, out, c)
		if c != "16EiB" {
			require.Contains(t, errs, "above 1099511627776 bytes (1 TiB)")
		}
	}
	_, errs, status := cli(t, "run", "--device", "sim", "--sim-capacity", "1TiB", "--ops", "10", "--max-size", "4096")
	require.Equal(t, exitOK, status, errs)
}

func TestMultiPrintsProgressAndTheNoGPUNoteOnce(t *testing.T) {
	out, errs, status := cli(t, "multi", "--sim-capacity", "256MiB", "--procs", "2", "--ops", "200000", "--progress-interval", "1ms")
	require.Equal(t, exitOK, status, errs)
	all := out + errs
	if strings.Contains(all, "using the simulated H200") { // no GPU here
		require.Equal(t, 1, strings.Count(all, "using the simulated H200"), all)
	}
	require.Regexp(t, `\[proc [01]\] run: \d+ ops \(\d+%\)`, errs)
}
