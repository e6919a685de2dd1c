package trace

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestParseCSVHeaderOnlyIsAnEmptyTrace(t *testing.T) {
	tr := parseBytes(t, "r.csv", []byte(rmmHeader+"\r\n"))
	assert.Equal(t, FormatRMM, tr.Format)
	assert.Empty(t, tr.Ops)
}

func TestParseCSVAcceptsAByteOrderMarkAndDecimalStreams(t *testing.T) {
	tr := parseBytes(t, "r.csv", []byte("\ufeff"+rmmHeader+"\n1,t,allocate,7f0000001000,4096,12\n1,t,deallocate,0x7f0000001000,4096,12\n"))
	assert.Equal(t, []Op{{ID: 1, Size: 4096, Stream: 12}, {Free: true, ID: 1, Size: 4096, Stream: 12}}, tr.Ops)
}

func TestMalformedCSV(t *testing.T) {
	const f = "r.csv"
	row := func(s string) []byte { return []byte(rmmHeader + "\n" + s + "\n") }
	checkMalformed(t, []malformedCase{
		{"header missing a column", f, []byte("Thread,Time,Action,Pointer,Size\n1,t,allocate,0x10,8\n"), 1, -1, "CSV header"},
		{"header in other case", f, []byte("thread,time,action,pointer,size,stream\n"), 1, -1, "CSV header"},
		{"no header", f, []byte("1,t,allocate,0x10,8,0x0\n"), 1, -1, "CSV header"},
		{"unknown action", f, row("1,t,allocat,0x10,8,0x0"), 2, -1, `action "allocat"`},
		{"non-numeric size", f, row("1,t,allocate,0x10,eight,0x0"), 2, -1, `size "eight" is not a decimal number`},
		{"negative size", f, row("1,t,allocate,0x10,-8,0x0"), 2, -1, `size "-8"`},
		{"too few fields", f, row("1,t,allocate,0x10,8"), 2, -1, "5 fields, want 6"},
		{"too many fields", f, row("1,t,allocate,0x10,8,0x0,extra"), 2, -1, "7 fields, want 6"},
		{"bad pointer", f, row("1,t,allocate,0xZZ,8,0x0"), 2, -1, `pointer "0xZZ" is not a 64-bit hexadecimal address`},
		{"pointer over 64 bits", f, row("1,t,allocate,0x10000000000000000,8,0x0"), 2, -1, "pointer"},
		{"empty pointer", f, row("1,t,free,,8,0x0"), 2, -1, `pointer ""`},
		{"bad stream", f, row("1,t,allocate,0x10,8,stream"), 2, -1, `stream "stream"`},
		{"bad size in a failure row", f, row("1,t,allocate failure,(nil),x,0x0"), 2, -1, `size "x"`},
		{"allocate at a live pointer", f, row("1,t,allocate,0x10,8,0x0\n1,t,allocate,0x10,8,0x0"), 3, -1, "allocate at 0x10, which is live"},
	})
}
