package trace

import (
	"bytes"
	"math/big"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The test encoder writes what Python's pickle reads; this pins it to the
// snapshot reader's expectations.
func TestPickleEncoderBuildsSnapshots(t *testing.T) {
	in := pkl(snap(
		ev("segment_alloc", 1<<40, 2<<20),
		ev("alloc", 1<<40, 512),
		ev("alloc", 1<<40+512, 1<<33),
		ev("free_completed", 1<<40, 512), // ignored
		ev("free_requested", 1<<40, 512),
		ev("free_requested", 7, 512), // unknown: skipped
		ev("alloc", 1<<41, 0),        // zero size: skipped
		ev("oom", 0, 0),
	))
	tr := parseBytes(t, "s.pickle", in)
	assert.Equal(t, []Op{
		{ID: 1, Size: 512},
		{ID: 2, Size: 1 << 33},
		{Free: true, ID: 1, Size: 512},
	}, tr.Ops)
	assert.Equal(t, 2, tr.Skipped)
}

func TestPickleValueKinds(t *testing.T) {
	// A stream id may be negative (it keeps its bits); an address may need
	// 64 bits (LONG1 of 9 bytes); the last of duplicate keys wins, as in a
	// Python dict; non-string keys are ignored.
	entry := pdict{{"action", "alloc"}, {"addr", uint64(1 << 63)}, {"size", 8}, {"size", 16}, {"stream", -1}, {7, "x"}}
	tr := parseBytes(t, "s.pickle", pkl(snap(entry)))
	assert.Equal(t, []Op{{ID: 1, Size: 16, Stream: 1<<64 - 1}}, tr.Ops)
}

func TestPickleEmptyHistoryIsAnEmptyTrace(t *testing.T) {
	tr := parseBytes(t, "s.pickle", pkl(pdict{{"segments", plist{}}, {"device_traces", plist{}}}))
	assert.Empty(t, tr.Ops)
}

func TestMalformedPickleSyntax(t *testing.T) {
	const f = "s.pickle"
	small := testdata(t, "small.snapshot.pickle")
	deep := append([]byte{0x80, 2}, bytes.Repeat([]byte("("), maxMarkDepth+1)...)
	checkMalformed(t, []malformedCase{
		{"PROTO without argument", f, []byte{0x80}, 0, 0, "wants 1 argument bytes, 0 left"},
		{"protocol 9", f, []byte{0x80, 9, 'N', '.'}, 0, 0, "protocol 9, want at most 5"},
		{"truncated", f, small[:500], 0, -2, "reaches past the end"},
		{"no STOP", f, []byte{0x80, 2, 'K', 1}, 0, 4, "pickle ends without STOP"},
		{"GLOBAL", f, []byte("\x80\x02cos\nsystem\n."), 0, 2, "not allowed in a memory snapshot"},
		{"REDUCE", f, []byte("\x80\x02NNR."), 0, 4, "not allowed"},
		{"opcode 0xff", f, []byte{0x80, 2, 0xff}, 0, 2, "opcode 0xff"},
		{"BINUNICODE past the end", f, []byte{0x80, 2, 'X', 0xff, 0xff, 0xff, 0xff, 'a'}, 0, 2, "length 4294967295 reaches past the end"},
		{"BINBYTES8 of 2^64-1", f, append([]byte{0x80, 4, 0x8e}, bytes.Repeat([]byte{0xff}, 8)...), 0, 2, "exceeds"},
		{"FRAME past the end", f, append([]byte{0x80, 4, 0x95}, bytes.Repeat([]byte{0xff}, 8)...), 0, 2, "frame of"},
		{"LONG1 of zero bytes", f, []byte{0x80, 2, 0x8a, 0, '.'}, 0, 2, "zero-length integer"},
		{"LONG4 too wide", f, append([]byte{0x80, 2, 0x8b, 0, 1, 0, 0}, make([]byte, 256)...), 0, 2, "length 256 exceeds 64"},
		{"INT without newline", f, []byte("\x80\x02I12"), 0, 2, "no terminating newline"},
		{"odd SETITEMS", f, []byte("\x80\x02}(K\x01u."), 0, 6, "odd number of items (1)"},
		{"odd DICT", f, []byte("\x80\x02(K\x01d."), 0, 5, "odd number of items (1)"},
		{"POP_MARK without MARK", f, []byte("\x80\x021"), 0, 2, "no MARK to pop"},
		{"APPEND on an empty stack", f, []byte("\x80\x02a"), 0, 2, "needs 2 stack items, 0 above the last MARK"},
		{"SETITEM across a MARK", f, []byte("\x80\x02}K\x01(K\x02s"), 0, 8, "needs 3 stack items, 1"},
		{"STOP on an empty stack", f, []byte("\x80\x02."), 0, 2, "needs 1 stack items"},
		{"MARKs nested too deep", f, deep, 0, int64(2 + maxMarkDepth), "more than 1024 nested MARKs"},
		{"APPEND to an int", f, []byte("\x80\x02K\x01K\x02a."), 0, -2, "APPEND requires"},
	})
}

func TestMalformedPickleShape(t *testing.T) {
	const f = "s.pickle"
	alloc := ev("alloc", 4096, 512)
	without := func(key string) pdict {
		var d pdict
		for _, kv := range alloc {
			if kv[0] != key {
				d = append(d, kv)
			}
		}
		return d
	}
	set := func(key string, v any) pdict {
		d := append(pdict{}, alloc...)
		for i := range d {
			if d[i][0] == key {
				d[i][1] = v
			}
		}
		return d
	}
	huge := new(big.Int).Lsh(big.NewInt(1), 70)
	cases := []struct {
		name string
		v    any
		msg  string
	}{
		{"top-level list", plist{}, "pickle: top level is a list, want a dict with segments and device_traces"},
		{"top-level None", nil, "top level is None"},
		{"no segments", pdict{{"device_traces", plist{}}}, "top-level dict has no segments"},
		{"no device_traces", pdict{{"segments", plist{}}}, "top-level dict has no device_traces"},
		{"segments not a list", pdict{{"segments", 3}, {"device_traces", plist{}}}, "segments: is an int, want a list"},
		{"device_traces a dict", pdict{{"segments", plist{}}, {"device_traces", pdict{}}}, "device_traces: is a dict, want a list"},
		{"device list a tuple", pdict{{"segments", plist{}}, {"device_traces", plist{ptuple{}}}}, "device_traces[0]: is a tuple, want a list"},
		{"entry an int", snap(ev("alloc", 1, 1), 5), "device_traces[0][1]: is an int, want a dict"},
		{"entry without action", snap(without("action")), "device_traces[0][0]: has no action"},
		{"action bytes", snap(set("action", praw("C\x05alloc"))), "action is bytes, want a str"},
		{"alloc without size", snap(without("size")), "alloc entry has no size"},
		{"alloc without addr", snap(without("addr")), "alloc entry has no addr"},
		{"alloc without stream", snap(without("stream")), "alloc entry has no stream"},
		{"free without addr", snap(pdict{{"action", "free_requested"}}), "free_requested entry has no addr"},
		{"negative size", snap(set("size", -512)), "size is -512, want a non-negative integer"},
		{"size a str", snap(set("size", "512")), "size is a str"},
		{"size a float", snap(set("size", 512.0)), "size is a float"},
		{"size a bool", snap(set("size", true)), "size is a bool"},
		{"size None", snap(set("size", nil)), "size is None"},
		{"action None", snap(set("action", nil)), "action is None, want a str"},
		{"addr over 64 bits", snap(set("addr", praw(pklBigInt(huge)))), "addr is 1180591620717411303424"},
		{"alloc at a live address", snap(alloc, alloc), "device_traces[0][1]: alloc at 0x1000, which is live"},
		{"two devices, no time_us", pdict{{"segments", plist{}}, {"device_traces", plist{plist{alloc}, plist{ev("alloc", 1, 1)}}}}, "has no integer time_us, needed to merge 2 devices"},
	}
	var mc []malformedCase
	for _, c := range cases {
		mc = append(mc, malformedCase{c.name, f, pkl(c.v), 0, -1, c.msg})
	}
	checkMalformed(t, mc)

	tooMany := pdict{}
	for i := range maxEntryKeys + 1 {
		tooMany = append(tooMany, [2]any{i, i})
	}
	tooMany = append(tooMany, [2]any{"action", "alloc"})
	checkMalformed(t, []malformedCase{{"entry with too many keys", f, pkl(snap(tooMany)), 0, -1, "has 66 keys, more than 64"}})
}

// pklBigInt returns LONG1 opcodes for x > 0.
func pklBigInt(x *big.Int) []byte {
	le := x.Bytes()
	for i, j := 0, len(le)-1; i < j; i, j = i+1, j-1 {
		le[i], le[j] = le[j], le[i]
	}
	le = append(le, 0) // sign byte
	return append([]byte{0x8a, byte(len(le))}, le...)
}

// A pickle whose decoded form would dwarf it is refused before decoding.
func TestPickleOutOfProportionIsTooLarge(t *testing.T) {
	t.Run("a million empty dicts", func(t *testing.T) {
		in := append([]byte{0x80, 4, ']', '('}, bytes.Repeat([]byte("}"), 1<<20)...)
		in = append(in, 'e', '.')
		_, err := Parse("dicts.pickle", bytes.NewReader(in))
		assert.ErrorIs(t, err, ErrTooLarge)
		assert.NotErrorIs(t, err, ErrMalformed)
	})
	t.Run("one device list referenced many times", func(t *testing.T) {
		// device_traces = [L, L, L, ...] with L memoized once: each
		// reference costs 2 bytes and brings len(L) entries.
		var l plist
		for range 100 {
			l = append(l, ev("snapshot", 0, 0))
		}
		body := []byte{0x80, 2, '}', '('}
		body = pklBody(body, "segments")
		body = pklBody(body, plist{})
		body = pklBody(body, "device_traces")
		body = append(body, ']', '(')
		body = pklBody(body, l)
		body = append(body, 'q', 1) // BINPUT 1
		for range 1000 {
			body = append(body, 'h', 1) // BINGET 1
		}
		body = append(body, 'e', 'u', '.')
		_, err := Parse("alias.pickle", bytes.NewReader(body))
		assert.ErrorIs(t, err, ErrTooLarge)
		assert.Contains(t, err.Error(), "more entries than the pickle has bytes")
	})
}

// scanPickle accepts every opcode of the real snapshots; it is the same
// walk the unpickler makes, so the two agree on where a pickle stops.
func TestScanPickleAcceptsRealSnapshots(t *testing.T) {
	for _, name := range []string{"lstm", "tdnn"} {
		b := gunzip(t, embedded(t, name+".snapshot.pickle.gz"))
		require.NoError(t, scanPickle(name, b))
		// Trailing bytes after STOP are ignored, as by Python.
		require.NoError(t, scanPickle(name, append(b, "junk"...)))
		// The budget allows 32 bytes per input byte; leave room for
		// denser snapshots (with stack frames, say).
		perByte := float64(estimate(t, b)) / float64(len(b))
		assert.Less(t, perByte, 20.0)
	}
}

// estimate returns scanPickle's memory estimate for b.
func estimate(t *testing.T, b []byte) int64 {
	s := &pickleScan{name: "x", b: b}
	for s.off < len(b) {
		stop, err := s.step()
		require.NoError(t, err)
		if stop {
			break
		}
	}
	return s.cost
}

func TestOpNameIsReadable(t *testing.T) {
	assert.Equal(t, `0x63 ('c')`, opName('c'))
	assert.Equal(t, "0xff", opName(0xff))
	assert.True(t, strings.HasPrefix(opName(0x80), "0x80"))
}

// One alloc and one free entry, memoized once and referenced alternately
// many times: 2 bytes a reference, 96 bytes of trace an event while
// converting (a 128 KB gzip file decoded to 15 GB before this check).
func TestPickleSharedEntriesAreTooLarge(t *testing.T) {
	body := []byte{0x80, 2, '}', '('}
	body = pklBody(body, "segments")
	body = pklBody(body, plist{})
	body = pklBody(body, "device_traces")
	body = append(body, ']', '(', ']', '(')
	body = pklBody(body, ev("alloc", 4096, 512))
	body = append(body, 'q', 1) // BINPUT 1
	body = pklBody(body, ev("free_requested", 4096, 512))
	body = append(body, 'q', 2)
	for range 1000 {
		body = append(body, 'h', 1, 'h', 2) // BINGET 1, BINGET 2
	}
	body = append(body, 'e', 'e', 'u', '.')
	_, err := Parse("shared.pickle", bytes.NewReader(body))
	assert.ErrorIs(t, err, ErrTooLarge)
	assert.Contains(t, err.Error(), "entries shared through the memo")
}
