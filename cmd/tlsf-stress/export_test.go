package main

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/internal/trace"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkOpsMatch reads an op list and asserts that it is t, op for op:
// each allocation has its op's size, takes an empty slot and keeps one
// dense stream index per trace stream (0 for stream 0); each free empties
// the slot of its op's block; the header's counts are right, and SLOTS is
// the most blocks live at once.
func checkOpsMatch(t *testing.T, ops []byte, tr *trace.Trace) {
	t.Helper()
	sc := bufio.NewScanner(bytes.NewReader(ops))
	require.True(t, sc.Scan(), "header")
	var n, slots, streams int
	var peak uint64
	_, err := fmt.Sscanf(sc.Text(), opsMagic+" %d %d %d %d", &n, &slots, &streams, &peak)
	require.NoError(t, err, sc.Text())
	assert.Equal(t, len(tr.Ops), n)
	assert.Equal(t, tr.PeakLive(), peak)
	slotID := make([]int64, slots) // slot -> block ID + 1, 0 when empty
	dense := map[uint64]int{0: 0}
	maxLive, live := 0, 0
	for i, op := range tr.Ops {
		require.True(t, sc.Scan(), "record %d missing", i)
		f := strings.Fields(sc.Text())
		if op.Free {
			require.Len(t, f, 2, "record %d: %q", i, sc.Text())
			var s int
			_, err := fmt.Sscanf(sc.Text(), "f %d", &s)
			require.NoError(t, err)
			require.Less(t, s, slots)
			require.Equal(t, int64(op.ID)+1, slotID[s], "record %d frees the slot of block %d", i, op.ID)
			slotID[s] = 0
			live--
			continue
		}
		require.Len(t, f, 4, "record %d: %q", i, sc.Text())
		var s, st int
		var size uint64
		_, err := fmt.Sscanf(sc.Text(), "a %d %d %d", &s, &size, &st)
		require.NoError(t, err)
		require.Less(t, s, slots)
		require.Zero(t, slotID[s], "record %d allocates into a full slot", i)
		slotID[s] = int64(op.ID) + 1
		assert.Equal(t, op.Size, size, "record %d", i)
		want, ok := dense[op.Stream]
		if !ok {
			want = len(dense)
			dense[op.Stream] = want
		}
		assert.Equal(t, want, st, "record %d: stream %d", i, op.Stream)
		live++
		maxLive = max(maxLive, live)
	}
	assert.False(t, sc.Scan(), "records after the last op: %q", sc.Text())
	assert.Equal(t, maxLive, slots, "SLOTS is the most blocks live at once")
	assert.Equal(t, len(dense), streams)
}

func TestExportWritesEveryEmbeddedTraceAsDenseOps(t *testing.T) {
	dir := t.TempDir()
	out, errs, status := cli(t, "export", "--out", dir)
	require.Equal(t, exitOK, status, errs)
	lines := jsonLines(t, out)
	require.Len(t, lines, len(trace.Names()))
	for i, name := range trace.Names() {
		tr, err := trace.Load(name)
		require.NoError(t, err)
		m := lines[i]
		assert.Equal(t, name, m["trace"])
		assert.Equal(t, filepath.Join(dir, name+".ops"), m["file"])
		assert.Equal(t, fmt.Sprint(len(tr.Ops)), fmt.Sprint(m["ops"]))
		assert.Equal(t, fmt.Sprint(tr.Allocs()), fmt.Sprint(m["allocs"]))
		assert.Equal(t, fmt.Sprint(tr.PeakLive()), fmt.Sprint(m["peak_live_bytes"]))
		b, err := os.ReadFile(filepath.Join(dir, name+".ops"))
		require.NoError(t, err)
		checkOpsMatch(t, b, tr)
	}
}

func TestExportReusesSlotsAndNumbersStreams(t *testing.T) {
	tr := &trace.Trace{Name: "x", Ops: []trace.Op{
		{ID: 7, Size: 100, Stream: 5},
		{ID: 8, Size: 200},
		{Free: true, ID: 7, Size: 100, Stream: 5},
		{ID: 9, Size: 300, Stream: 9},
		{ID: 10, Size: 400, Stream: 5},
		{Free: true, ID: 8, Size: 200},
	}}
	require.NoError(t, tr.Check())
	var b bytes.Buffer
	r, err := writeOps(&b, tr)
	require.NoError(t, err)
	assert.Equal(t, opsMagic+" 6 3 3 900\na 0 100 1\na 1 200 0\nf 0\na 0 300 2\na 2 400 1\nf 1\n", b.String())
	assert.Equal(t, 3, r.Slots)
	assert.Equal(t, 3, r.Streams)
	checkOpsMatch(t, b.Bytes(), tr)
}

func TestExportAcceptsEveryFormat(t *testing.T) {
	for _, file := range []string{
		"../../internal/trace/testdata/small.snapshot.pickle",
		"../../internal/trace/testdata/rmm_small.csv",
		"../../internal/trace/data/tdnn.snapshot.pickle.gz",
	} {
		t.Run(filepath.Base(file), func(t *testing.T) {
			dir := t.TempDir()
			out, errs, status := cli(t, "export", "-o", dir, file)
			require.Equal(t, exitOK, status, errs)
			require.Len(t, jsonLines(t, out), 1)
			tr, err := trace.ParseFile(file)
			require.NoError(t, err)
			b, err := os.ReadFile(filepath.Join(dir, tr.Name+".ops"))
			require.NoError(t, err)
			checkOpsMatch(t, b, tr)
		})
	}
}

// export --text writes any trace in the text format, gzipped, with the
// comments asked for: a PyTorch snapshot becomes a trace that parses back
// to the same ops (how bench/traces was made).
func TestExportTextWritesTheTextFormat(t *testing.T) {
	dir := t.TempDir()
	snap := "../../internal/trace/data/tdnn.snapshot.pickle.gz"
	out, errs, status := cli(t, "export", "--text", "--comment", "workload=tdnn steps=30", "--comment", "second", "-o", dir, snap, "lstm")
	require.Equal(t, exitOK, status, errs)
	lines := jsonLines(t, out)
	require.Len(t, lines, 2)
	for i, want := range []string{snap, "lstm"} {
		src, err := loadTrace(want)
		require.NoError(t, err)
		file := filepath.Join(dir, src.Name+".trace.gz")
		assert.Equal(t, file, lines[i]["file"])
		got, err := trace.ParseFile(file)
		require.NoError(t, err)
		assert.Equal(t, src.Ops, got.Ops)
		assert.Equal(t, []string{"workload=tdnn steps=30", "second"}, got.Comments)
		assert.Equal(t, "text", got.Format.String())
	}
	_, errs, status = cli(t, "export", "--comment", "x", "-o", dir, "lstm")
	assert.Equal(t, exitUsage, status)
	assert.Contains(t, errs, "--text")

	// Without --comment the trace's own comments stay; a file read is
	// never written over.
	own := filepath.Join(dir, "lstm.trace.gz")
	again := t.TempDir()
	_, errs, status = cli(t, "export", "--text", "-o", again, own)
	require.Equal(t, exitOK, status, errs)
	got, err := trace.ParseFile(filepath.Join(again, "lstm.trace.gz"))
	require.NoError(t, err)
	assert.Equal(t, []string{"workload=tdnn steps=30", "second"}, got.Comments)
	before, err := os.ReadFile(own)
	require.NoError(t, err)
	_, errs, status = cli(t, "export", "--text", "-o", dir, own)
	assert.Equal(t, exitUsage, status)
	assert.Contains(t, errs, "over the trace it reads")
	after, err := os.ReadFile(own)
	require.NoError(t, err)
	assert.Equal(t, before, after)
}

func TestExportRefusesBadInput(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.trace")
	require.NoError(t, os.WriteFile(bad, []byte("a 1 100 0\nf 2\n"), 0o644))
	_, errs, status := cli(t, "export", "-o", dir, bad)
	assert.Equal(t, exitFailed, status)
	assert.Contains(t, errs, "bad.trace:2")
	assert.NoFileExists(t, filepath.Join(dir, "bad.ops"))

	_, errs, status = cli(t, "export", "-o", dir, "lstm", "../../internal/trace/data/lstm.snapshot.pickle.gz")
	assert.Equal(t, exitUsage, status)
	assert.Contains(t, errs, "lstm.ops")

	_, errs, status = cli(t, "export", "-o", dir, "no-such-trace")
	assert.Equal(t, exitFailed, status)
	assert.Contains(t, errs, "no-such-trace")
}

func TestReplayWarmRunsReportsMedianAndMin(t *testing.T) {
	out, errs, status := cli(t, "replay", "--device", "sim", "--json", "--warm-runs", "4", "--backend", "tlsf-vmm", "lstm")
	require.Equal(t, exitOK, status, errs)
	lines := jsonLines(t, out)
	require.Len(t, lines, 1)
	checkSchema(t, lines[0], replaySchema, replayOptional)
	r := decodeReplay(t, out)[0]
	assert.Equal(t, 4, r.WarmRuns)
	assert.Positive(t, r.MinNsPerOp)
	assert.LessOrEqual(t, r.MinNsPerOp, r.NsPerOp, "the minimum is at most the median")
	assert.Zero(t, r.WarmFailedAllocs)

	_, _, status = cli(t, "replay", "--device", "sim", "--warm-runs", "0", "lstm")
	assert.Equal(t, exitUsage, status)
}

// A write that fails leaves no half-written file behind, and the error
// names the file and wraps the cause.
func TestExportRemovesAFileItFailedToWrite(t *testing.T) {
	file := filepath.Join(t.TempDir(), "x.ops")
	cause := fmt.Errorf("disk full")
	err := writeFile(file, func(w io.Writer) error {
		_, _ = io.WriteString(w, "partial")
		return cause
	})
	require.ErrorIs(t, err, cause)
	assert.Contains(t, err.Error(), file)
	_, statErr := os.Stat(file)
	assert.True(t, os.IsNotExist(statErr), "the file is removed: %v", statErr)
	require.NoError(t, writeFile(file, func(w io.Writer) error {
		_, err := io.WriteString(w, "whole")
		return err
	}))
	got, err := os.ReadFile(file)
	require.NoError(t, err)
	assert.Equal(t, "whole", string(got))
}
