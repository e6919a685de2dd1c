package trace

import (
	"bytes"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseTextAcceptsTheGrammar(t *testing.T) {
	in := "# source=test workload=tiny\n" +
		"\n" +
		"a 1 1556480 0\n" +
		"  a\t2 512 3  \r\n" + // blanks around and between fields; CRLF
		"   # indented comment\n" +
		"f 1\n" +
		"a 1 4 0\n" + // an ID may be reused once freed
		"a 18446744073709551615 18446744073709551615 18446744073709551615\n"
	tr := parseBytes(t, "tiny.trace", []byte(in))
	assert.Equal(t, FormatText, tr.Format)
	assert.Equal(t, []string{"source=test workload=tiny", "indented comment"}, tr.Comments)
	const max = 1<<64 - 1
	assert.Equal(t, []Op{
		{ID: 1, Size: 1556480},
		{ID: 2, Size: 512, Stream: 3},
		{Free: true, ID: 1, Size: 1556480},
		{ID: 1, Size: 4},
		{ID: max, Size: max, Stream: max},
	}, tr.Ops)
	assert.Zero(t, tr.Skipped)
}

func TestParseTextCommentsOnlyIsAnEmptyTrace(t *testing.T) {
	tr := parseBytes(t, "c.trace", []byte("# nothing happened\n"))
	assert.Empty(t, tr.Ops)
	assert.Equal(t, []string{"nothing happened"}, tr.Comments)
}

func TestMalformedText(t *testing.T) {
	const f = "t.trace"
	long := "# " + strings.Repeat("x", maxLine+1) + "\n"
	checkMalformed(t, []malformedCase{
		{"unknown record", f, []byte("a 1 10 0\nx 2\n"), 2, -1, `unknown record "x"`},
		{"alloc spelled out", f, []byte("alloc 1 10 0\n"), 1, -1, `unknown record "alloc"`},
		{"non-numeric size", f, []byte("a 1 1O 0\n"), 1, -1, `size "1O" is not a decimal number`},
		{"hex ID", f, []byte("a 0x1 10 0\n"), 1, -1, `ID "0x1" is not a decimal number`},
		{"negative ID", f, []byte("a -1 10 0\n"), 1, -1, `ID "-1"`},
		{"plus sign", f, []byte("a +1 10 0\n"), 1, -1, `ID "+1"`},
		{"size over 2^64", f, []byte("a 1 18446744073709551616 0\n"), 1, -1, `size "18446744073709551616"`},
		{"non-numeric stream", f, []byte("a 1 10 s\n"), 1, -1, `stream "s"`},
		{"zero size", f, []byte("a 1 0 0\n"), 1, -1, "allocation of ID 1 has size 0"},
		{"free of unknown ID", f, []byte("a 1 10 0\nf 2\n"), 2, -1, "free of ID 2, which is not live"},
		{"double free", f, []byte("a 1 10 0\nf 1\nf 1\n"), 3, -1, "free of ID 1, which is not live"},
		{"duplicate live ID", f, []byte("a 1 10 0\na 1 20 0\n"), 2, -1, "allocation of ID 1, which is live since line 1"},
		{"alloc missing stream", f, []byte("a 1 10\n"), 1, -1, `want "a ID SIZE STREAM", got 3 fields`},
		{"alloc alone", f, []byte("a\n"), 1, -1, "got 1 fields"},
		{"alloc extra field", f, []byte("a 1 10 0 0\n"), 1, -1, "got 5 fields"},
		{"inline comment", f, []byte("a 1 10 0 # x\n"), 1, -1, "got 6 fields"},
		{"free missing ID", f, []byte("f\n"), 1, -1, `want "f ID", got 1 fields`},
		{"free with size", f, []byte("a 1 10 0\nf 1 10\n"), 2, -1, `want "f ID", got 3 fields`},
		{"line numbers count comments and blanks", f, []byte("# c\n\na 1 10 0\r\nf 9\n"), 4, -1, "free of ID 9"},
		{"empty input", f, nil, 0, 0, "empty input"},
		{"blanks only", f, []byte("\n  \n"), 2, -1, "empty input"},
		{"line too long", f, []byte("a 1 1 0\n" + long), 2, -1, "line longer than 65536 bytes"},
		{"binary junk", f, []byte{0, 1, 2, 3}, 0, 0, "binary data (begins 00 01 02 03)"},
		{"binary after a text line", f, []byte("a 1 10 0\n\xff\xfe\x00junk"), 0, 0, "binary data"},
		{"a text line that is not a trace", f, []byte("hello world\n"), 1, -1, `unknown record "hello"`},
	})
}

// Writing a trace and parsing the text gives the same trace back.
func TestWriteTextRoundTrip(t *testing.T) {
	inputs := map[string][]byte{
		"rmm_small.csv":         testdata(t, "rmm_small.csv"),
		"small.snapshot.pickle": testdata(t, "small.snapshot.pickle"),
	}
	for _, n := range Names() {
		inputs[n+".trace.gz"] = embedded(t, n+".trace.gz")
	}
	for name, in := range inputs {
		t.Run(name, func(t *testing.T) {
			tr := parseBytes(t, name, in)
			var buf bytes.Buffer
			require.NoError(t, WriteText(&buf, tr))
			back := parseBytes(t, "back.trace", buf.Bytes())
			assert.Equal(t, tr.Ops, back.Ops)
			assert.Equal(t, tr.Comments, back.Comments)
			if tr.Format == FormatText {
				// The embedded traces are already in canonical form.
				assert.Equal(t, string(gunzip(t, in)), buf.String())
			}
		})
	}
}

func TestWriteTextRefusesInvalidTraces(t *testing.T) {
	for name, tr := range map[string]*Trace{
		"free of unknown ID":    {Ops: []Op{{Free: true, ID: 1, Size: 1}}},
		"zero size":             {Ops: []Op{{ID: 1}}},
		"comment with newline":  {Comments: []string{"a\nf 1"}},
		"free with wrong size":  {Ops: []Op{{ID: 1, Size: 2}, {Free: true, ID: 1, Size: 3}}},
		"alloc of a live block": {Ops: []Op{{ID: 1, Size: 2}, {ID: 1, Size: 2}}},
	} {
		t.Run(name, func(t *testing.T) {
			var buf bytes.Buffer
			assert.ErrorIs(t, WriteText(&buf, tr), ErrInvalid)
			assert.Zero(t, buf.Len(), "nothing written")
		})
	}
}
