package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"encoding/xml"
	"errors"
	"fmt"
	"image/png"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMain lets the test binary stand in for the command when multi
// re-executes itself (os.Executable is the test binary then).
func TestMain(m *testing.M) {
	if len(os.Args) > 1 && os.Args[1] == multiChildCmd {
		os.Exit(executeSignals(os.Args[1:]))
	}
	os.Exit(m.Run())
}

// cli runs the command in-process and returns its output and status.
func cli(t *testing.T, args ...string) (stdout, stderr string, status int) {
	t.Helper()
	var o, e bytes.Buffer
	status = execute(args, &o, &e)
	return o.String(), e.String(), status
}

// jsonLines decodes one JSON object per line, keeping numbers as
// json.Number so that integer fields can be told from float ones.
func jsonLines(t *testing.T, s string) []map[string]any {
	t.Helper()
	var out []map[string]any
	sc := bufio.NewScanner(strings.NewReader(s))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		d := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		d.UseNumber()
		var m map[string]any
		require.NoError(t, d.Decode(&m), "line %q", sc.Text())
		out = append(out, m)
	}
	return out
}

func TestUsageErrorsExit2(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"unknown subcommand", []string{"frobnicate"}, "unknown command"},
		{"unknown flag", []string{"replay", "--no-such-flag"}, "unknown flag"},
		{"bad device", []string{"--device", "tpu"}, "--device"},
		{"bad backend", []string{"replay", "--device", "sim", "--backend", "tlsf-vmm,jemalloc", "lstm"}, "jemalloc"},
		{"repeated backend", []string{"replay", "--device", "sim", "--backend", "async,async", "lstm"}, "twice"},
		{"cap not a number", []string{"replay", "--device", "sim", "--cap", "lots", "lstm"}, "byte count"},
		{"cap fraction above 1", []string{"replay", "--device", "sim", "--cap", "1.5", "lstm"}, "(0, 1]"},
		{"cap fraction without its point", []string{"replay", "--device", "sim", "--cap", "1", "lstm"}, "decimal point (1.0"},
		{"run cap fraction without its point", []string{"run", "--device", "sim", "--cap", "1"}, "decimal point (1.0"},
		{"plot extension", []string{"replay", "--device", "sim", "--plot", "out.pdf", "lstm"}, ".svg or .png"},
		{"run takes no arguments", []string{"run", "--device", "sim", "extra"}, "unknown command"},
		{"run bad verify", []string{"run", "--device", "sim", "--verify", "some"}, "--verify"},
		{"run bad stream", []string{"run", "--device", "sim", "--stream", "many"}, "--stream"},
		{"run ops 0 without duration", []string{"run", "--device", "sim", "--ops", "0"}, "--duration"},
		{"run goroutines 0", []string{"run", "--device", "sim", "-g", "0"}, "--goroutines"},
		{"run slots huge", []string{"run", "--device", "sim", "--slots", "2000000000"}, "--slots"},
		{"run slots times goroutines", []string{"run", "--device", "sim", "--slots", "1000000", "-g", "100"}, "in all"},
		{"run goroutines huge", []string{"run", "--device", "sim", "-g", "100000"}, "--goroutines"},
		{"multi slots huge", []string{"multi", "--device", "sim", "--slots", "2000000000"}, "--slots"},
		{"run min above max", []string{"run", "--device", "sim", "--min-size", "1MiB", "--max-size", "1KiB"}, "--min-size"},
		{"run ops not a number", []string{"run", "--device", "sim", "--ops", "many"}, "invalid argument"},
		{"multi procs 0", []string{"multi", "--device", "sim", "--procs", "0"}, "--procs"},
		{"sim capacity on the GPU", []string{"run", "--device", "cuda", "--sim-capacity", "4GiB"}, "not with --device cuda"},
		{"sim real time on the GPU", []string{"replay", "--device", "cuda", "--sim-real-time", "lstm"}, "not with --device cuda"},
		{"multi procs beyond the contexts", []string{"multi", "--device", "sim", "--procs", "1000"}, "CUDA contexts"},
		{"replay warm-runs 0", []string{"replay", "--device", "sim", "--warm-runs", "0", "lstm"}, "--warm-runs"},
		{"replay warm-runs huge", []string{"replay", "--device", "sim", "--warm-runs", "1000000", "lstm"}, "--warm-runs"},
		{"multi async", []string{"multi", "--device", "sim", "--backend", "async"}, "fraction policy"},
		{"multi fraction", []string{"multi", "--device", "sim", "--fraction", "2"}, "--fraction"},
		{"multi oversubscribe huge", []string{"multi", "--device", "sim", "--oversubscribe", "1e300"}, "--oversubscribe"},
		{"run negative duration", []string{"run", "--device", "sim", "--duration", "-1s"}, "--duration"},
		{"run negative progress interval", []string{"run", "--device", "sim", "--progress-interval", "-1s"}, "--progress-interval"},
		{"min-cap with cap", []string{"replay", "--device", "sim", "--min-cap", "--cap", "4GiB", "lstm"}, "--min-cap"},
		{"plot and snapshot to one file", []string{"replay", "--device", "sim", "--backend", "tlsf-vmm", "--plot", "same.svg", "--snapshot", "same.svg", "lstm"}, "both write"},
		{"multi max-live", []string{"multi", "--device", "sim", "--max-live", "1GiB"}, "--max-live"},
		{"multi min-size", []string{"multi", "--device", "sim", "--min-size", "1MiB"}, "--min-size"},
		{"run devices with stream", []string{"run", "--device", "sim", "--devices", "0,1", "--stream", "per-goroutine"}, "--stream"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, status := cli(t, tc.args...)
			assert.Equal(t, exitUsage, status, "stdout %s\nstderr %s", out, errs)
			assert.Contains(t, errs, tc.want)
			assert.Contains(t, errs, "--help")
		})
	}
}

// What every process of multi would fail on at its start is refused
// before any starts: one error line, no table of failed processes.
func TestMultiRefusesWhatEveryProcessWouldFailOn(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"sizes not a trace", []string{"--sizes", "nosuch"}, "no embedded trace"},
		{"share below a page", []string{"--fraction", "1e-9"}, "allocation granularity"},
		{"a share of the device below a page", []string{"--sim-capacity", "4MiB"}, "allocation granularity"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			out, errs, status := cli(t, append([]string{"multi", "--device", "sim"}, tc.args...)...)
			assert.Equal(t, exitFailed, status, "stdout %s\nstderr %s", out, errs)
			assert.Contains(t, errs, tc.want)
			assert.Empty(t, out, "no process ran")
		})
	}
}

func TestHelpExits0(t *testing.T) {
	for _, args := range [][]string{{"--help"}, {"replay", "--help"}, {"run", "-h"}, {"multi", "--help"}} {
		out, errs, status := cli(t, args...)
		assert.Equal(t, exitOK, status, "%v: %s", args, errs)
		assert.Contains(t, out, "Usage:", "%v", args)
	}
	out, _, _ := cli(t, "--help")
	assert.NotContains(t, out, multiChildCmd, "the child subcommand is hidden")
}

// replaySchema is the --json schema of replay as doc.go documents it:
// field → JSON type ("int" is a number without fraction or exponent).
// Optional fields are those of --min-cap, device_ns_per_op (sim only) and
// first_error.
var replaySchema = map[string]string{
	"trace": "string", "source": "string", "format": "string", "backend": "string", "conf": "string", "skipped_records": "int",
	"device": "string", "device_kind": "string", "ops": "int",
	"peak_live_bytes": "int", "peak_reserved_bytes": "int", "reserved_over_live": "number",
	"cap_bytes": "int", "min_cap_bytes": "int", "min_cap_over_live": "number", "min_cap_runs": "int",
	"ns_per_op": "number", "min_ns_per_op": "number", "warm_runs": "int", "warm_up_runs": "int", "cold_ns_per_op": "number", "device_ns_per_op": "number", "cold_device_ns_per_op": "number",
	"device_calls": "int", "warm_device_calls": "int", "device_calls_by_name": "object",
	"failed_allocs": "int", "warm_failed_allocs": "int", "first_error": "string",
}

var replayOptional = map[string]bool{
	"min_cap_bytes": true, "min_cap_over_live": true, "min_cap_runs": true,
	"device_ns_per_op": true, "cold_device_ns_per_op": true, "first_error": true, "conf": true,
}

// checkSchema asserts that m has every required field of schema, no field
// outside it, and every field of its type.
func checkSchema(t *testing.T, m map[string]any, schema map[string]string, optional map[string]bool) {
	t.Helper()
	for k, typ := range schema {
		v, ok := m[k]
		if !ok {
			assert.True(t, optional[k], "field %q missing", k)
			continue
		}
		switch typ {
		case "string":
			assert.IsType(t, "", v, k)
		case "object":
			assert.IsType(t, map[string]any{}, v, k)
		case "int", "number":
			n, ok := v.(json.Number)
			if !assert.True(t, ok, "%s: %T is not a number", k, v) {
				continue
			}
			if typ == "int" {
				assert.False(t, strings.ContainsAny(n.String(), ".eE-"), "%s = %s is not a non-negative integer", k, n)
			} else {
				_, err := n.Float64()
				assert.NoError(t, err, k)
			}
		}
	}
	for k := range m {
		_, ok := schema[k]
		assert.True(t, ok, "field %q is not in the documented schema", k)
	}
}

func TestReplayJSONSchema(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--min-cap", "--backend", "tlsf-chunks,async", "lstm")
	require.Equal(t, exitOK, status, errs)
	lines := jsonLines(t, out)
	require.Len(t, lines, 2, "one object per trace and backend")
	for i, m := range lines {
		checkSchema(t, m, replaySchema, replayOptional)
		assert.Equal(t, []string{"tlsf-chunks", "async"}[i], m["backend"])
		assert.Equal(t, "lstm", m["trace"])
		assert.Equal(t, "text", m["format"])
		assert.Equal(t, "sim", m["device_kind"])
		assert.Contains(t, m, "min_cap_bytes")
		assert.Contains(t, m, "min_cap_over_live")
		assert.Contains(t, m, "device_ns_per_op", "sim runs report the modelled driver time")
		r := decodeReplay(t, out)[i]
		assert.GreaterOrEqual(t, *r.MinCapOverLive, 1.0, "no cap below peak live can work")
		assert.Less(t, *r.MinCapOverLive, 1.3)
		assert.LessOrEqual(t, *r.MinCapBytes, r.PeakReservedBytes+minCapStep)
	}

	// Without --min-cap its fields are absent.
	out, errs, status = cli(t, "replay", "--device", "sim", "--json", "--backend", "tlsf-chunks", "lstm")
	require.Equal(t, exitOK, status, errs)
	for _, m := range jsonLines(t, out) {
		checkSchema(t, m, replaySchema, replayOptional)
		assert.NotContains(t, m, "min_cap_bytes")
		assert.NotContains(t, m, "min_cap_over_live")
	}
}

// A snapshot whose recording began mid-run has records the parser skips:
// replay says how many, in the JSON and under the table.
func TestReplayReportsSkippedRecords(t *testing.T) {
	snap := "../../internal/trace/testdata/small.snapshot.pickle"
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--backend", "tlsf-vmm", snap)
	require.Equal(t, exitOK, status, errs)
	assert.Equal(t, 1, decodeReplay(t, out)[0].SkippedRecords)
	out, errs, status = cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm", snap, "lstm")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, out, "small: 1 records of the trace were skipped")
	assert.NotContains(t, out, "lstm: 0 records")
}

// --conf gives every pool backend its options: ReleaseFraction bounds
// reserved memory, and the JSON says which options ran; keys other flags
// own and malformed ones are usage errors.
func TestReplayConfSetsThePoolsOptions(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--backend", "tlsf-vmm", "lstm")
	require.Equal(t, exitOK, status, errs)
	def := decodeReplay(t, out)[0]
	assert.NotContains(t, jsonLines(t, out)[0], "conf")
	out, errs, status = cli(t, "replay", "--device", "sim", "--json", "--conf", " release_fraction:0.02 ", "--backend", "tlsf-vmm,async", "lstm")
	require.Equal(t, exitOK, status, errs)
	rs := decodeReplay(t, out)
	for i, m := range jsonLines(t, out) {
		checkSchema(t, m, replaySchema, replayOptional)
		if rs[i].Backend == backendAsync {
			assert.NotContains(t, m, "conf", "the driver's pool takes no pool options")
		} else {
			assert.Equal(t, "release_fraction:0.02", m["conf"])
		}
		assert.Zero(t, rs[i].FailedAllocs)
	}
	out, errs, status = cli(t, "run", "--device", "sim", "--json", "--ops", "2000", "--conf", "wilderness:true")
	require.Equal(t, exitOK, status, errs)
	assert.Equal(t, "wilderness:true", jsonLines(t, out)[0]["conf"])
	assert.Less(t, rs[0].ReservedOverLive, def.ReservedOverLive, "ReleaseFraction 0.02 recycles memory the default keeps")
	out, errs, status = cli(t, "replay", "--device", "sim", "--conf", "release_fraction:0.02", "--backend", "tlsf-vmm", "lstm")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, out, "Pool backends ran with --conf release_fraction:0.02.")
	assert.Contains(t, out, "verdict lstm: tlsf-vmm (--conf release_fraction:0.02) peak reserved")
	assert.LessOrEqual(t, rs[0].ReservedOverLive, 1.04)

	for _, bad := range []string{"backend:chunks", "passthrough:true", "device:sim", "sim_capacity:1GiB", "max_bytes:1GiB", "max_fraction:0.5", "release_fraction:2", "nokey:1"} {
		_, errs, status := cli(t, "replay", "--device", "sim", "--conf", bad, "lstm")
		assert.Equal(t, exitUsage, status, bad)
		assert.Contains(t, errs, "--conf", bad)
	}
}

// TLSF_PASSTHROUGH=1 makes every pool backend a passthrough one
// (pool.New reads it): results carry the name of what ran, a note says
// why, and no verdict credits a pool backend with passthrough's figures.
func TestPassthroughEnvNamesWhatRuns(t *testing.T) {
	t.Setenv(pool.PassthroughEnv, "1")
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--backend", "tlsf-vmm,async,tlsf-chunks,passthrough", "lstm")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, errs, passthroughNote)
	var got []string
	for _, r := range decodeReplay(t, out) {
		got = append(got, r.Backend)
	}
	assert.Equal(t, []string{backendPassthrough, backendAsync}, got)
	out, errs, status = cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm", "lstm")
	require.Equal(t, exitOK, status, errs)
	assert.NotContains(t, out, "verdict")
	assert.NotContains(t, out, backendVMM)
	out, errs, status = cli(t, "run", "--device", "sim", "--json", "--ops", "500", "--backend", "tlsf-chunks")
	require.Equal(t, exitOK, status, errs)
	assert.Equal(t, backendPassthrough, jsonLines(t, out)[0]["backend"])
	out, errs, status = cli(t, "multi", "--device", "sim", "--json", "--ops", "200")
	require.Equal(t, exitOK, status, errs)
	for _, m := range jsonLines(t, out) {
		assert.Equal(t, backendPassthrough, m["backend"])
	}
	out, errs, status = cli(t, "sanitize", "--device", "sim", "--case", "inside", "--backend", "tlsf-vmm")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, out, "(passthrough)")
	_, errs, status = cli(t, "export", "--out", t.TempDir(), "lstm")
	require.Equal(t, exitOK, status, errs)
	assert.NotContains(t, errs, passthroughNote, "export makes no pool")
}

// A TLSF_PASSTHROUGH value that is neither on nor off fails every
// command that makes pools (exit 1, the value named), before --conf is
// read, and leaves export and help alone.
func TestPassthroughEnvUnknownValue(t *testing.T) {
	t.Setenv(pool.PassthroughEnv, "enabled")
	for _, args := range [][]string{
		{"run", "--device", "sim", "--ops", "100"},
		{"replay", "--device", "sim", "--conf", "release_fraction:0.05", "lstm"},
	} {
		_, errs, status := cli(t, args...)
		assert.Equal(t, exitFailed, status, "%v: %s", args, errs)
		assert.Contains(t, errs, pool.PassthroughEnv+`="enabled"`, args)
		assert.NotContains(t, errs, "--conf", args)
	}
	_, errs, status := cli(t, "--conf", "release_fraction:0.05", "export", "--out", t.TempDir(), "lstm")
	assert.Equal(t, exitOK, status, errs)
	_, errs, status = cli(t, "help")
	assert.Equal(t, exitOK, status, errs)
}

// The driver's pool replays after every other backend, but results keep
// the order of traces, then of --backend.
func TestReplayKeepsTheOrderOfTracesAndBackends(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--backend", "async,tlsf-vmm", "lstm", "tdnn")
	require.Equal(t, exitOK, status, errs)
	var got []string
	for _, r := range decodeReplay(t, out) {
		got = append(got, r.Trace+"/"+r.Backend)
	}
	require.Equal(t, []string{"lstm/async", "lstm/tlsf-vmm", "tdnn/async", "tdnn/tlsf-vmm"}, got)
}

// decodeReplay decodes --json output into results.
func decodeReplay(t *testing.T, out string) []*replayResult {
	t.Helper()
	var rs []*replayResult
	d := json.NewDecoder(strings.NewReader(out))
	for {
		r := &replayResult{}
		err := d.Decode(r)
		if errors.Is(err, io.EOF) {
			return rs
		}
		require.NoError(t, err)
		rs = append(rs, r)
	}
}

// TestReplayEmbeddedTracesSim replays every embedded trace but resnet50
// (which TestDefaultReplaysResnet50 covers) with all four backends.
func TestReplayEmbeddedTracesSim(t *testing.T) {
	for _, name := range trace.Names() {
		if name == defaultTrace {
			continue
		}
		t.Run(name, func(t *testing.T) {
			out, errs, status := cli(t, "replay", "--device", "sim", "--json", name)
			require.Equal(t, exitOK, status, errs)
			rs := decodeReplay(t, out)
			require.Len(t, rs, len(allBackends))
			tr, err := trace.Load(name)
			require.NoError(t, err)
			for i, r := range rs {
				assert.Equal(t, allBackends[i], r.Backend)
				assert.Zero(t, r.FailedAllocs, r.Backend)
				assert.Zero(t, r.WarmFailedAllocs, r.Backend)
				assert.Equal(t, tr.PeakLive(), r.PeakLiveBytes)
				assert.Equal(t, len(tr.Ops), r.Ops, "%s: every op replayed", r.Backend)
				assert.GreaterOrEqual(t, r.ReservedOverLive, 0.99, r.Backend)
				assert.Less(t, r.ReservedOverLive, 2.0, r.Backend)
				assert.Positive(t, r.DeviceCalls, r.Backend)
				assert.Positive(t, r.NsPerOp, r.Backend)
			}
		})
	}
}

// TestDefaultReplaysResnet50: no subcommand replays the embedded resnet50
// trace with every backend and prints the table with the peers' figures.
// Without a subcommand: every embedded trace, every backend, the
// smallest feasible cap, where each figure comes from, and a verdict per
// trace.
func TestDefaultReplaysEveryTraceWithMinCapAndVerdicts(t *testing.T) {
	out, errs, status := cli(t, "--device", "sim")
	require.Equal(t, exitOK, status, errs)
	for _, name := range trace.Names() {
		tr, err := trace.Load(name)
		require.NoError(t, err)
		for _, be := range allBackends {
			// Our rows: measured by this run, with a min cap figure.
			assert.Regexp(t, name+`\s+`+be+`\s+this run \(sim\)\s+`+fmt.Sprint(len(tr.Ops))+`\s+\d+\s+\d+\s+\d+\s+\d+\s+\d+\s+[\d.]+ GiB\s+[\d.]+\s+1\.\d{3}\s`, out)
		}
		assert.Regexp(t, name+`\s+peer torch\s+H200, baseline.json\s`, out)
		assert.Regexp(t, `(?m)^verdict `+name+`: tlsf-(vmm|chunks|vmm-goodfit|vmm-wilderness) min cap 1\.\d{3}× live vs 1\.\d{3}× for the best peer \(\S+, H200, baseline.json\): (lower|higher|equal)$`, out)
	}
	assert.Equal(t, len(trace.Names()), strings.Count(out, "verdict "))
	assert.Contains(t, out, "our ns/op is host time only, not comparable with the peers' GPU")
	assert.Contains(t, out, "Simulated H200")
	assert.Contains(t, out, fmt.Sprintf("timed on it %d times", replay.MinWarmRuns), "the default's warm replays are replay's")
}

// Every line of the table has its columns aligned with the header's,
// after the first trace too.
func TestReplayTableStaysAligned(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "lstm", "tdnn")
	require.Equal(t, exitOK, status, errs)
	var header string
	for _, line := range strings.Split(out, "\n") {
		if strings.Contains(line, "allocator") && strings.Contains(line, "failed") {
			header = line
			continue
		}
		if header == "" || strings.TrimSpace(line) == "" || strings.HasPrefix(line, "verdict") {
			continue
		}
		require.Equal(t, len([]rune(header)), len([]rune(line)), "line %q vs header %q", line, header)
	}
	require.NotEmpty(t, header)
}

func TestReplayMalformedFileNamesFileAndLine(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.trace")
	require.NoError(t, os.WriteFile(bad, []byte("# a trace\na 1 4096 0\nf 2\n"), 0o644))
	out, errs, status := cli(t, "replay", "--device", "sim", bad)
	assert.Equal(t, exitFailed, status, out)
	assert.Contains(t, errs, bad+":3:")

	csv := filepath.Join(dir, "bad.csv")
	require.NoError(t, os.WriteFile(csv, []byte("Thread,Time,Action,Pointer,Size,Stream\n1,2,allocate,0x10,zz,0x0\n"), 0o644))
	_, errs, status = cli(t, "replay", "--device", "sim", csv)
	assert.Equal(t, exitFailed, status)
	assert.Contains(t, errs, csv+":2:")

	_, errs, status = cli(t, "replay", "--device", "sim", filepath.Join(dir, "missing.trace"))
	assert.Equal(t, exitFailed, status)
	assert.Contains(t, errs, "no such file")
}

// TestReplayRefusesATraceGivenTwice: the table and the verdicts key on
// a trace's name and source, so one trace given twice would merge.
func TestReplayRefusesATraceGivenTwice(t *testing.T) {
	_, errs, status := cli(t, "replay", "--device", "sim", "lstm", "lstm")
	assert.Equal(t, exitUsage, status)
	assert.Contains(t, errs, "trace lstm given twice")
}

func TestReplayDetectsFormats(t *testing.T) {
	for _, f := range []struct{ file, format string }{
		{"small.snapshot.pickle", "pytorch-snapshot"},
		{"rmm_small.csv", "rmm-csv"},
		{"small.trace", "text"},
	} {
		out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--backend", "tlsf-vmm",
			filepath.Join("..", "..", "internal", "trace", "testdata", f.file))
		require.Equal(t, exitOK, status, errs)
		rs := decodeReplay(t, out)
		require.Len(t, rs, 1)
		assert.Equal(t, f.format, rs[0].Format, f.file)
		assert.Positive(t, rs[0].Ops, f.file)
	}
}

func TestReplayPlot(t *testing.T) {
	dir := t.TempDir()
	svg := filepath.Join(dir, "lstm.svg")
	_, errs, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm,passthrough", "--plot", svg, "lstm")
	require.Equal(t, exitOK, status, errs)
	b, err := os.ReadFile(svg)
	require.NoError(t, err)
	d := xml.NewDecoder(bytes.NewReader(b))
	root := ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err, "the SVG is well-formed XML")
		if se, ok := tok.(xml.StartElement); ok && root == "" {
			root = se.Name.Local
		}
	}
	assert.Equal(t, "svg", root)
	assert.Contains(t, string(b), "reserved: tlsf-vmm")
	assert.Contains(t, string(b), "reserved: passthrough")

	// PNG, and one file per trace with several traces.
	pngBase := filepath.Join(dir, "all.png")
	_, errs, status = cli(t, "replay", "--device", "sim", "--backend", "tlsf-chunks", "--plot", pngBase, "lstm", "tdnn")
	require.Equal(t, exitOK, status, errs)
	for _, name := range []string{"all-lstm.png", "all-tdnn.png"} {
		f, err := os.Open(filepath.Join(dir, name))
		require.NoError(t, err)
		_, err = png.Decode(f)
		f.Close()
		assert.NoError(t, err, name)
	}
}

func TestReplayCapFailsAllocationsAndIsNotAnError(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--cap", "1GiB", "--backend", "tlsf-vmm,async", "lstm")
	require.Equal(t, exitOK, status, "with a cap, failures are the measurement: %s", errs)
	for _, r := range decodeReplay(t, out) {
		assert.Positive(t, r.FailedAllocs, r.Backend)
		assert.Equal(t, uint64(1<<30), r.CapBytes)
		assert.NotEmpty(t, r.FirstError)
		assert.LessOrEqual(t, r.PeakReservedBytes, uint64(1<<30)+minCapStep, r.Backend)
	}
	// Without a cap, a device too small for the trace is a failure.
	_, _, status = cli(t, "replay", "--device", "sim", "--sim-capacity", "1GiB", "--backend", "tlsf-chunks", "lstm")
	assert.Equal(t, exitFailed, status)
}

// A verdict names no backend whose replays failed allocations (its
// reserved memory is that of a replay cut short); where every one failed,
// it says so. (It named the one that failed, under a cap of 6.5 GiB, as
// lower than the peers.)
func TestAVerdictSkipsBackendsThatFailed(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--warm-runs", "1", "--backend", "tlsf-vmm,tlsf-chunks", "--cap", "6.5GiB", "lstm")
	require.Equal(t, exitOK, status, errs)
	require.Contains(t, out, "lstm tlsf-chunks: ", "chunks fails allocations under this cap")
	assert.Contains(t, out, "verdict lstm: tlsf-vmm peak reserved")
	// The peers' rows stay: the trace is the embedded one, whatever the
	// replay under the cap skipped.
	assert.Contains(t, out, "peer torch+expandable")
	out, errs, status = cli(t, "replay", "--device", "sim", "--warm-runs", "1", "--backend", "tlsf-vmm", "--cap", "2MiB", "lstm")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, out, "verdict lstm: every pool backend failed allocations under the cap of 2097152 bytes")
	assert.NotContains(t, out, "× live")
}

// Peers' figures belong to the embedded trace of their name: a file of
// that name is another trace, replayed and judged on its own.
func TestPeersOnlyForTheEmbeddedTrace(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "lstm.trace")
	require.NoError(t, os.WriteFile(file, []byte("a 0 1000 0\nf 0\n"), 0o644))
	out, errs, status := cli(t, "replay", "--device", "sim", "--warm-runs", "1", "--backend", "tlsf-vmm", file, "lstm")
	require.Equal(t, exitOK, status, errs)
	var verdicts []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "verdict lstm:") {
			verdicts = append(verdicts, line)
		}
	}
	require.Len(t, verdicts, 2, out)
	assert.Contains(t, verdicts[0], "(no peer figure to compare)", "the file")
	assert.Contains(t, verdicts[1], "for the best peer", "the embedded trace")
	assert.Equal(t, 1, strings.Count(out, "peer torch+expandable"), "the peers' rows once, under the embedded trace")
}

// A bare embedded name replays the embedded trace whatever the working
// directory holds; ./NAME reads a file of that name. Before, a file named
// lstm in the directory replaced the embedded trace without a word.
func TestAnEmbeddedNameWinsOverAFileOfThatName(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "lstm"), []byte("a 0 1000 0\nf 0\n"), 0o644))
	t.Chdir(dir)
	for _, tc := range []struct {
		arg string
		ops float64
	}{{"lstm", 3278}, {"./lstm", 2}} {
		out, errs, status := cli(t, "replay", "--device", "sim", "--warm-runs", "1", "--backend", "tlsf-vmm", "--json", tc.arg)
		require.Equal(t, exitOK, status, errs)
		rows := jsonLines(t, out)
		require.Len(t, rows, 1, out)
		ops, err := rows[0]["ops"].(json.Number).Float64()
		require.NoError(t, err)
		assert.Equal(t, tc.ops, ops, tc.arg)
	}
}

// The driver's pool maps whole 2 MiB pages: a cap below one would fail
// every request, so it is refused, as pool.New refuses such a MaxBytes.
func TestAsyncRefusesACapBelowAPage(t *testing.T) {
	out, errs, status := cli(t, "run", "--device", "sim", "--backend", "async", "--cap", "1MiB", "--ops", "10")
	assert.Equal(t, exitFailed, status, "stdout %s\nstderr %s", out, errs)
	assert.Contains(t, errs, "allocation granularity")
}

// A trace with no operations (comments only) is refused: its figures
// would be 0/0.
func TestReplayRefusesAnEmptyTrace(t *testing.T) {
	file := filepath.Join(t.TempDir(), "empty.trace")
	require.NoError(t, os.WriteFile(file, []byte("# nothing\n"), 0o644))
	_, errs, status := cli(t, "replay", "--device", "sim", file)
	assert.NotEqual(t, exitOK, status)
	assert.Contains(t, errs, "no operations")
}

// A run whose every request is larger than a goroutine's share of
// --max-live made no allocation: it fails, and counts no operation.
func TestRunWithNoRequestThatFitsFails(t *testing.T) {
	out, _, status := cli(t, "run", "--device", "sim", "--max-live", "1", "--ops", "100")
	assert.Equal(t, exitFailed, status, out)
	assert.Contains(t, out, "run: 0 ops")
	assert.Contains(t, out, "no allocation made")
}

func TestParseBytesAndCaps(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want uint64
		ok   bool
	}{
		{"4096", 4096, true}, {"2KiB", 2048, true}, {"3 MiB", 3 << 20, true}, {"1g", 1 << 30, true},
		{"2TiB", 2 << 40, true}, {"7b", 7, true}, {"", 0, false}, {"-1", 0, false}, {"1.5GiB", 3 << 29, true},
		{"0.5 k", 512, true}, {"1.5", 0, false}, {"1.5b", 1, true}, {"-1.5GiB", 0, false}, {"1.5.1GiB", 0, false},
		{"99999999999TiB", 0, false}, {"99999999999.5TiB", 0, false}, {"8GB", 8e9, true}, {"8 kb", 8000, true},
	} {
		got, err := parseBytes(tc.in)
		if tc.ok {
			assert.NoError(t, err, tc.in)
			assert.Equal(t, tc.want, got, tc.in)
		} else {
			assert.Error(t, err, tc.in)
		}
	}
	var c capFlag
	require.NoError(t, c.Set("0.25"))
	assert.Equal(t, uint64(250), c.resolve(1000))
	require.NoError(t, c.Set("1GiB"))
	assert.Equal(t, uint64(1<<30), c.resolve(1000))
	require.NoError(t, c.Set(" 0.5 "))
	assert.Equal(t, uint64(500), c.resolve(1000))
	require.NoError(t, c.Set("1.5GiB"), "a decimal with a suffix is bytes, not a fraction")
	assert.Equal(t, uint64(3<<29), c.resolve(1000))
	assert.Error(t, c.Set("0.0"))
	assert.Error(t, c.Set("1.01"))
}

// A verdict's comparison is in bytes where the peer's peak reserved bytes
// are known, and at baseline.json's four decimals otherwise: a tie is
// equal, not lower (before, the exact ratio was compared with the rounded
// one).
func TestAVerdictTieIsEqual(t *testing.T) {
	bl := map[string]trace.Baseline{"t": {Ops: 10, PeakLiveBytes: 1_000_000, Peers: map[string]trace.Peer{
		"p": {PeakReservedBytes: 1_020_254, PeakReservedOverLive: 1.0203, MinCapOverLive: 1.0123},
	}}}
	ds := &devices{kind: deviceSim}
	for _, tc := range []struct {
		reserved uint64
		minCap   float64
		want     string
	}{
		{1_020_254, 0, "equal"}, {1_020_253, 0, "lower"}, {1_020_255, 0, "higher"},
		{1_020_254, 1.01232, "equal"}, {1_020_254, 1.0122, "lower"}, {1_020_254, 1.0124, "higher"},
	} {
		r := &replayResult{Trace: "t", Backend: backendVMM, PeakLiveBytes: 1_000_000, PeakReservedBytes: tc.reserved,
			ReservedOverLive: float64(tc.reserved) / 1_000_000, traceOps: 10}
		if tc.minCap > 0 {
			r.MinCapOverLive = &tc.minCap
		}
		v := verdicts(ds, []*replayResult{r}, bl)
		require.Len(t, v, 1)
		assert.True(t, strings.HasSuffix(v[0], ": "+tc.want), "%+v: %s", tc, v[0])
		// The figures shown agree with the comparison: alike when equal,
		// apart when not.
		m := regexp.MustCompile(`([\d.]+)× live vs ([\d.]+)×`).FindStringSubmatch(v[0])
		require.Len(t, m, 3, v[0])
		assert.Equal(t, tc.want == "equal", m[1] == m[2], "%+v: %s", tc, v[0])
	}
}

// The figures a verdict shows agree with its comparison at baseline.json's
// precision too: 1.00146 against 1.0015 is equal, shown 1.0015 both
// (before, 1.001 against 1.002: equal).
func TestAVerdictShowsItsComparison(t *testing.T) {
	for _, tc := range []struct {
		ours, peer float64
		equal      bool
		want       [2]string
	}{
		{1.00146, 1.0015, true, [2]string{"1.0015", "1.0015"}},
		{1.0203, 1.0203, true, [2]string{"1.020", "1.020"}},
		{1.02031, 1.0204, false, [2]string{"1.0203", "1.0204"}},
		{1.0200001, 1.0200002, false, [2]string{"1.020000", "1.020000"}},
		{1.032, 1.120, false, [2]string{"1.032", "1.120"}},
	} {
		o, q := verdictFigures(tc.ours, tc.peer, tc.equal)
		assert.Equal(t, tc.want, [2]string{o, q}, "%+v", tc)
	}
}

// Guard mode needs a simulated device that keeps memory contents: replay
// gives it one with --conf guard:N, as run and multi do always (before,
// the pool refused it, naming a sim.Config field no flag sets).
func TestReplayWithGuardOnTheSimulatedDevice(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm", "--conf", "guard:64", "--warm-runs", "1", "lstm")
	require.Equal(t, exitOK, status, "%s\n%s", out, errs)
	assert.Contains(t, out, "verdict lstm: tlsf-vmm (--conf guard:64)")
}

// A trace with more streams than a replay makes device streams for is
// refused before any device is opened (the simulated device's cost grows
// with the square of the streams: 40,000 ran out of memory).
func TestReplayRefusesTooManyStreams(t *testing.T) {
	var b strings.Builder
	for i := 1; i <= maxReplayStreams+1; i++ {
		fmt.Fprintf(&b, "a %d 512 %d\n", i, i)
	}
	file := filepath.Join(t.TempDir(), "streams.trace")
	require.NoError(t, os.WriteFile(file, []byte(b.String()), 0o644))
	_, errs, status := cli(t, "replay", "--device", "sim", file)
	assert.NotEqual(t, exitOK, status)
	assert.Contains(t, errs, "the trace uses 1025 streams, more than the 1024")
}

// --min-cap on a trace that fails without a cap shows the failure and its
// error, not a bisection's "fails even under a cap of N bytes".
func TestMinCapOfATraceThatFailsWithoutACap(t *testing.T) {
	file := filepath.Join(t.TempDir(), "huge.trace")
	require.NoError(t, os.WriteFile(file, []byte("a 1 18446744073709551615 0\n"), 0o644))
	out, errs, status := cli(t, "replay", "--device", "sim", "--backend", "tlsf-vmm", "--warm-runs", "1", "--min-cap", file)
	assert.Equal(t, exitFailed, status, "stdout %s\nstderr %s", out, errs)
	assert.Contains(t, out, "size too large")
	assert.NotContains(t, errs, "fails even under a cap")
}
