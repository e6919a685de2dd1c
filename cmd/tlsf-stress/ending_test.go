package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/cobra"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// cliInterrupted runs the command line as execute does, with its context
// ended after d, as SIGINT ends main's.
func cliInterrupted(t *testing.T, d time.Duration, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var o, e bytes.Buffer
	status = executeContext(ctx, args, &o, &e)
	return o.String(), e.String(), status
}

// An interrupted run stops, reports what it did and exits with 130.
func TestAnInterruptedRunReportsWhatRan(t *testing.T) {
	start := time.Now()
	out, errs, status := cliInterrupted(t, 300*time.Millisecond, "run", "--device", "sim", "--sim-capacity", "1GiB",
		"--ops", "0", "--duration", "1h", "-g", "2", "--json")
	require.Equal(t, exitInterrupted, status, "%s\n%s", out, errs)
	assert.Less(t, time.Since(start), time.Minute)
	assert.Contains(t, errs, "interrupted: the report covers what ran before it")
	lines := jsonLines(t, out)
	require.Len(t, lines, 1)
	m := lines[0]
	assert.Equal(t, true, m["interrupted"], "%v", m)
	assert.Equal(t, true, m["ok"], "%v", m)
	assert.NotEqual(t, "0", fmt.Sprint(m["ops"]))

	out, errs, status = cliInterrupted(t, 300*time.Millisecond, "run", "--device", "sim", "--sim-capacity", "1GiB",
		"--ops", "0", "--duration", "1h")
	require.Equal(t, exitInterrupted, status, "%s\n%s", out, errs)
	assert.Contains(t, out, "run (interrupted): ")
}

// A run that ends by itself does not say it was interrupted.
func TestARunThatEndsByItselfIsNotInterrupted(t *testing.T) {
	out, errs, status := cli(t, "run", "--device", "sim", "--sim-capacity", "1GiB", "--ops", "200", "--json")
	require.Equal(t, exitOK, status, "%s\n%s", out, errs)
	assert.NotContains(t, out, "interrupted")
	assert.NotContains(t, errs, "interrupted")
}

// An interrupted replay prints the rows it replayed (none here: it was
// interrupted before its first) and exits with 130.
func TestAnInterruptedReplayExitsWith130(t *testing.T) {
	out, errs, status := cliInterrupted(t, 0, "replay", "--device", "sim", "--json", "lstm", "resnet50")
	require.Equal(t, exitInterrupted, status, "%s\n%s", out, errs)
	assert.Empty(t, jsonLines(t, out))
	assert.Contains(t, errs, "interrupted")
	// The command alone, replay --min-cap over every trace, too.
	out, errs, status = cliInterrupted(t, 0, "--device", "sim")
	require.Equal(t, exitInterrupted, status, "%s\n%s", out, errs)
	assert.NotContains(t, out, "verdict")
}

// The command alone and the interruptible subcommands take signals
// (executeSignals); export, sanitize and help end at once, as by default.
func TestWhichCommandsTakeSignals(t *testing.T) {
	for args, want := range map[string]bool{
		"": true, "--device sim": true, "run": true, "replay lstm": true, "multi": true, multiChildCmd: true,
		"export lstm": false, "sanitize": false, "help": false,
	} {
		assert.Equal(t, want, takesSignals(strings.Fields(args)), "%q", args)
	}
}

// Interrupted, multi's processes stop and report, in-process and as child
// processes (which the parent interrupts as a terminal would).
func TestAnInterruptedMultiReportsEveryProcess(t *testing.T) {
	for _, exec := range []bool{false, true} {
		t.Run(fmt.Sprintf("exec=%v", exec), func(t *testing.T) {
			if exec && testing.Short() {
				t.Skip("starts child processes")
			}
			args := []string{"multi", "--device", "sim", "--sim-capacity", "1GiB", "--procs", "2",
				"--ops", "0", "--duration", "1h", "-g", "1", "--json"}
			d := 300 * time.Millisecond
			if exec {
				args = append(args, "--exec")
				d = 2 * time.Second // the children's start
			}
			start := time.Now()
			out, errs, status := cliInterrupted(t, d, args...)
			require.Equal(t, exitInterrupted, status, "%s\n%s", out, errs)
			assert.Less(t, time.Since(start), time.Minute)
			lines := jsonLines(t, out)
			require.Len(t, lines, 2, "%s\n%s", out, errs)
			for _, m := range lines {
				assert.Equal(t, true, m["interrupted"], "%v", m)
				assert.Equal(t, true, m["ok"], "%v", m)
				assert.Equal(t, "0", fmt.Sprint(m["exit_status"]))
			}
		})
	}
}

// --duration without --ops runs for the duration: --ops is 0 then, not
// its default, which ended a short run first.
func TestADurationAloneSetsNoOpsBound(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want int64
	}{
		{[]string{"--duration", "1h"}, 0},
		{[]string{"--duration", "1h", "--ops", "7"}, 7},
		{nil, defaultMultiOps},
	} {
		w := &workloadFlags{}
		cmd := &cobra.Command{}
		w.register(cmd, defaultMultiOps)
		require.NoError(t, cmd.ParseFlags(tc.args))
		require.NoError(t, w.validate(cmd))
		assert.Equal(t, tc.want, w.ops, "%v", tc.args)
	}
}

// A run that ends by itself under executeSignals prints no interrupt
// message: before, the watcher woke when the signal context was released
// at the return, and printed one (89 times in 3,000 runs of help).
func TestANormalExitUnderSignalsSaysNothingOfAnInterrupt(t *testing.T) {
	r, w, err := os.Pipe()
	require.NoError(t, err)
	saved, savedOut := os.Stderr, os.Stdout
	os.Stderr, os.Stdout = w, w
	var status int
	for range 20 {
		status = executeSignals([]string{"run", "--device", "sim", "--sim-capacity", "1GiB", "--ops", "20", "--max-size", "4096", "--progress-interval", "0"})
		if status != exitOK {
			break
		}
	}
	time.Sleep(50 * time.Millisecond) // a watcher's late print
	os.Stderr, os.Stdout = saved, savedOut
	require.NoError(t, w.Close())
	got, err := io.ReadAll(r)
	require.NoError(t, err)
	require.Equal(t, exitOK, status, "%s", got)
	assert.NotContains(t, string(got), "interrupted")
}

// --duration 0 is no duration: alone it leaves --ops its default.
func TestADurationOfZeroLeavesTheOpsDefault(t *testing.T) {
	out, errs, status := cli(t, "run", "--device", "sim", "--sim-capacity", "1GiB", "--duration", "0", "--ops", "100", "-g", "1")
	require.Equal(t, exitOK, status, "%s\n%s", out, errs)
	w := &workloadFlags{}
	cmd := &cobra.Command{}
	w.register(cmd, defaultMultiOps)
	require.NoError(t, cmd.ParseFlags([]string{"--duration", "0"}))
	require.NoError(t, w.validate(cmd))
	assert.Equal(t, int64(defaultMultiOps), w.ops)
}
