package trace

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"io"
	"math"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// gz returns b gzip-compressed.
func gz(t testing.TB, b []byte) []byte {
	t.Helper()
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	_, err := w.Write(b)
	require.NoError(t, err)
	require.NoError(t, w.Close())
	return buf.Bytes()
}

// gunzip returns b decompressed.
func gunzip(t testing.TB, b []byte) []byte {
	t.Helper()
	r, err := gzip.NewReader(bytes.NewReader(b))
	require.NoError(t, err)
	out, err := io.ReadAll(r)
	require.NoError(t, err)
	return out
}

// embedded returns an embedded data file.
func embedded(t testing.TB, name string) []byte {
	t.Helper()
	b, err := data.ReadFile("data/" + name)
	require.NoError(t, err)
	return b
}

// testdata returns a file of testdata/.
func testdata(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

// parseBytes parses b under name, failing the test on error.
func parseBytes(t testing.TB, name string, b []byte) *Trace {
	t.Helper()
	tr, err := Parse(name, bytes.NewReader(b))
	require.NoError(t, err)
	require.NoError(t, tr.Check())
	return tr
}

// A small pickle encoder (protocol 2) for building snapshots of any shape
// in tests. pdict keeps key order; praw is spliced in as opcodes.
type (
	pdict  [][2]any
	plist  []any
	ptuple []any
	praw   []byte
)

// pkl returns the pickle of v: PROTO 2, v, STOP.
func pkl(v any) []byte {
	return append(pklBody([]byte{0x80, 2}, v), '.')
}

// pklBody appends the opcodes that push v.
func pklBody(b []byte, v any) []byte {
	switch x := v.(type) {
	case nil:
		return append(b, 'N')
	case bool:
		if x {
			return append(b, 0x88)
		}
		return append(b, 0x89)
	case int:
		return pklInt(b, int64(x))
	case int64:
		return pklInt(b, x)
	case uint64:
		if x <= math.MaxInt64 {
			return pklInt(b, int64(x))
		}
		// Nine bytes: the value and a zero sign byte.
		b = append(b, 0x8a, 9)
		b = binary.LittleEndian.AppendUint64(b, x)
		return append(b, 0)
	case float64:
		b = append(b, 'G')
		return binary.BigEndian.AppendUint64(b, math.Float64bits(x))
	case string:
		b = append(b, 'X')
		b = binary.LittleEndian.AppendUint32(b, uint32(len(x)))
		return append(b, x...)
	case pdict:
		b = append(b, '}')
		if len(x) == 0 {
			return b
		}
		b = append(b, '(')
		for _, kv := range x {
			b = pklBody(b, kv[0])
			b = pklBody(b, kv[1])
		}
		return append(b, 'u')
	case plist:
		b = append(b, ']')
		if len(x) == 0 {
			return b
		}
		b = append(b, '(')
		for _, e := range x {
			b = pklBody(b, e)
		}
		return append(b, 'e')
	case ptuple:
		b = append(b, '(')
		for _, e := range x {
			b = pklBody(b, e)
		}
		return append(b, 't')
	case praw:
		return append(b, x...)
	}
	panic("pkl: unsupported type")
}

// pklInt appends BININT1 for a small non-negative v, else LONG1.
func pklInt(b []byte, v int64) []byte {
	if v >= 0 && v < 256 {
		return append(b, 'K', byte(v))
	}
	var le [8]byte
	binary.LittleEndian.PutUint64(le[:], uint64(v))
	n := 8
	for n > 1 && ((le[n-1] == 0 && le[n-2]&0x80 == 0) || (le[n-1] == 0xff && le[n-2]&0x80 != 0)) {
		n--
	}
	b = append(b, 0x8a, byte(n))
	return append(b, le[:n]...)
}

// ev returns a snapshot trace entry.
func ev(action string, addr, size uint64) pdict {
	return pdict{{"action", action}, {"addr", addr}, {"size", size}, {"stream", 0}}
}

// snap returns a snapshot with one device's entries.
func snap(entries ...any) pdict {
	return pdict{{"segments", plist{}}, {"device_traces", plist{plist(entries)}}}
}
