package trace

import (
	"bytes"
	"math"
	"math/big"
	"os/exec"
	"strings"
	"testing"

	"github.com/nlpodyssey/gopickle/types"
	"github.com/stretchr/testify/require"
)

func TestWritePickleRoundTripsThroughTheReader(t *testing.T) {
	ints := []int64{0, 1, 255, 256, 65535, 65536, math.MaxInt32, math.MaxInt32 + 1, math.MaxInt64, -1, -128, -129, math.MinInt32, math.MinInt32 - 1, math.MinInt64}
	var list []any
	for _, v := range ints {
		list = append(list, v)
	}
	long := strings.Repeat("x", 3000)
	items := make([]any, 2500) // more than one APPENDS batch
	for i := range items {
		items[i] = i
	}
	v := Dict{
		{Key: "ints", Value: list},
		{Key: "big", Value: uint64(math.MaxUint64)},
		{Key: "top", Value: uint64(1 << 63)},
		{Key: "s", Value: "héllo"},
		{Key: "long", Value: long},
		{Key: "none", Value: nil},
		{Key: "t", Value: true},
		{Key: "f", Value: false},
		{Key: "pi", Value: 3.25},
		{Key: "items", Value: items},
		{Key: "nested", Value: []Dict{{{Key: "a", Value: []string{"x", "y"}}}}},
	}
	var buf bytes.Buffer
	require.NoError(t, WritePickle(&buf, v))
	b := buf.Bytes()
	require.NoError(t, scanPickle("w", b), "the writer stays in the subset the reader accepts")
	got, err := unpickle("w", b)
	require.NoError(t, err)
	d := got.(*types.Dict)
	get := func(k string) any { x, ok := d.Get(k); require.True(t, ok, k); return x }

	gotInts := get("ints").(*types.List)
	require.Equal(t, len(ints), gotInts.Len())
	for i, want := range ints {
		n, ok := toInt64(gotInts.Get(i))
		require.True(t, ok, "ints[%d] = %#v", i, gotInts.Get(i))
		require.Equal(t, want, n, "ints[%d]", i)
	}
	require.Equal(t, 0, get("big").(*big.Int).Cmp(new(big.Int).SetUint64(math.MaxUint64)))
	u, ok := toUint64(get("top"))
	require.True(t, ok)
	require.Equal(t, uint64(1<<63), u)
	require.Equal(t, "héllo", get("s"))
	require.Equal(t, long, get("long"))
	require.Nil(t, get("none"))
	require.Equal(t, true, get("t"))
	require.Equal(t, false, get("f"))
	require.Equal(t, 3.25, get("pi"))
	require.Equal(t, 2500, get("items").(*types.List).Len())
	nested := get("nested").(*types.List).Get(0).(*types.Dict)
	a, _ := nested.Get("a")
	require.Equal(t, "y", a.(*types.List).Get(1))
}

func TestWritePickleRefusesOtherTypes(t *testing.T) {
	err := WritePickle(&bytes.Buffer{}, Dict{{Key: "x", Value: []Dict{{{Key: "y", Value: struct{}{}}}}}})
	require.ErrorContains(t, err, `cannot pickle struct {} at ".x[0].y"`)
}

// A snapshot written here parses to the trace it records.
func TestWrittenSnapshotParses(t *testing.T) {
	entry := func(action string, addr, size uint64, us int) Dict {
		return Dict{{Key: "action", Value: action}, {Key: "addr", Value: addr}, {Key: "size", Value: size},
			{Key: "stream", Value: 0}, {Key: "time_us", Value: us}, {Key: "frames", Value: []Dict{}}}
	}
	var buf bytes.Buffer
	require.NoError(t, WritePickle(&buf, Dict{
		{Key: "segments", Value: []Dict{}},
		{Key: "device_traces", Value: []any{[]Dict{
			entry("segment_alloc", 0x7f0000000000, 2<<20, 1),
			entry("alloc", 0x7f0000000000, 1000, 2),
			entry("alloc", 0x7f0000000400, 512, 3),
			entry("free_requested", 0x7f0000000000, 1000, 4),
			entry("free_completed", 0x7f0000000000, 1000, 4),
		}}},
	}))
	tr, err := Parse("s.pickle", &buf)
	require.NoError(t, err)
	require.Equal(t, []Op{{ID: 1, Size: 1000}, {ID: 2, Size: 512}, {Free: true, ID: 1, Size: 1000}}, tr.Ops)
}

// Python's own unpickler agrees (skipped without python3).
func TestWritePickleLoadsInPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	var buf bytes.Buffer
	require.NoError(t, WritePickle(&buf, []any{int64(-1), int64(-129), int64(math.MinInt64), int64(math.MaxInt32 + 1),
		uint64(math.MaxUint64), uint64(1 << 63), "é", nil, true, 2.5, Dict{{Key: "k", Value: []string{}}}}))
	cmd := exec.Command(py, "-c", "import pickle,sys; print(repr(pickle.load(sys.stdin.buffer)))")
	cmd.Stdin = &buf
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	require.Equal(t, "[-1, -129, -9223372036854775808, 2147483648, 18446744073709551615, 9223372036854775808, 'é', None, True, 2.5, {'k': []}]", strings.TrimSpace(string(out)))
}
