package fuzz

import (
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/internal/trace"
)

// Fuzz targets for the trace parsers (package internal/trace). Each checks
// that Parse, on any input:
//
//   - returns an error matching trace.ErrMalformed or trace.ErrTooLarge,
//     never a recovered unpickler panic (which would mean the pickle scan
//     missed a case), or
//   - returns a trace that passes Check (every free names a live block,
//     every size is > 0), whose counters add up, and which survives a
//     round trip through the text format unchanged.
//
// Parse tells formats by content, so the format-specific targets shape
// their input to reach the parser they aim at: FuzzParseCSV prepends the
// RMM header, FuzzParsePickle the PROTO opcode where it is missing.

// rmmHeader is the first line of an RMM log.
const rmmHeader = "Thread,Time,Action,Pointer,Size,Stream\n"

func FuzzParse(f *testing.F) {
	for _, s := range textSeeds {
		f.Add([]byte(s))
		f.Add(gz(f, []byte(s)))
	}
	for _, s := range csvSeeds {
		f.Add([]byte(rmmHeader + s))
	}
	for _, p := range pickleSeeds(f) {
		f.Add(p)
		f.Add(gz(f, p))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		check(t, in, 0)
	})
}

func FuzzParseText(f *testing.F) {
	for _, s := range textSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		check(t, in, 0)
	})
}

func FuzzParseCSV(f *testing.F) {
	for _, s := range csvSeeds {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, rows []byte) {
		check(t, append([]byte(rmmHeader), rows...), trace.FormatRMM)
	})
}

func FuzzParsePickle(f *testing.F) {
	for _, p := range pickleSeeds(f) {
		f.Add(p)
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if len(in) == 0 || in[0] != 0x80 {
			in = append([]byte{0x80}, in...)
		}
		check(t, in, trace.FormatPyTorch)
	})
}

// check parses in and verifies the invariants above; want, if not 0, is
// the format a successful parse must report.
func check(t *testing.T, in []byte, want trace.Format) {
	tr, err := trace.Parse("fuzz", bytes.NewReader(in))
	if err != nil {
		if strings.Contains(err.Error(), "panicked") {
			t.Fatalf("unpickler panic recovered: %v", err)
		}
		if !errors.Is(err, trace.ErrMalformed) && !errors.Is(err, trace.ErrTooLarge) {
			t.Fatalf("error matches neither ErrMalformed nor ErrTooLarge: %v", err)
		}
		var pe *trace.ParseError
		if errors.As(err, &pe) && (pe.File != "fuzz" || !strings.Contains(err.Error(), "fuzz")) {
			t.Fatalf("error does not name the file: %v", err)
		}
		return
	}
	// No format spends less than 4 bytes an op ("f 1\n"; a pickle entry
	// not shared through the memo takes 10): more ops means an input that
	// expands, as memo references to one entry did.
	if n := plainLen(in); len(tr.Ops) > n/4 {
		t.Fatalf("%d ops from %d bytes of input", len(tr.Ops), n)
	}
	if want != 0 && tr.Format != want {
		t.Fatalf("format %v, want %v", tr.Format, want)
	}
	if err := tr.Check(); err != nil {
		t.Fatalf("parsed trace fails Check: %v", err)
	}
	if tr.Allocs()+tr.Frees() != len(tr.Ops) || tr.Skipped < 0 || tr.Failures < 0 {
		t.Fatalf("counters: %d allocs + %d frees != %d ops; skipped %d failures %d",
			tr.Allocs(), tr.Frees(), len(tr.Ops), tr.Skipped, tr.Failures)
	}
	var buf bytes.Buffer
	if err := trace.WriteText(&buf, tr); err != nil {
		t.Fatalf("WriteText: %v", err)
	}
	if len(tr.Ops) == 0 && len(tr.Comments) == 0 {
		return // an empty text input is an error; nothing to compare
	}
	back, err := trace.Parse("fuzz.txt", &buf)
	if err != nil {
		t.Fatalf("parse of written text: %v", err)
	}
	if !equalOps(tr.Ops, back.Ops) {
		t.Fatalf("text round trip changed the ops")
	}
	if strings.Join(tr.Comments, "\n") != strings.Join(back.Comments, "\n") || len(tr.Comments) != len(back.Comments) {
		t.Fatalf("text round trip changed the comments: %q -> %q", tr.Comments, back.Comments)
	}
}

// plainLen returns the length of in after gzip decompression, if it is
// gzip.
func plainLen(in []byte) int {
	zr, err := gzip.NewReader(bytes.NewReader(in))
	if err != nil {
		return len(in)
	}
	n, _ := io.Copy(io.Discard, zr)
	return int(n)
}

func equalOps(a, b []trace.Op) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

var textSeeds = []string{
	"# source=seed workload=tiny\na 1 1556480 0\na 2 512 3\nf 1\na 1 4 0\n",
	"a 18446744073709551615 18446744073709551615 18446744073709551615\nf 18446744073709551615\n",
	"a 1 10 0\nf 2\n",
	"a 1 10 0\na 1 20 0\n",
	"  a\t7 512 0 \r\n# c\n\nf 7\n",
}

var csvSeeds = []string{
	"140573312345856,08:23:28.203218,free,0x7f8a3ff00000,256,0x0\n" +
		"140573312345856,08:23:28.203300,allocate,0x7f8a40000000,1024,0x0\n" +
		"140573312345856,08:23:28.203400,allocate,0x7f8a40000400,2048,0x7f8a38001020\n" +
		"140573312345856,08:23:28.203500,allocate failure,(nil),1099511627776,0x0\n" +
		"140573312345856,08:23:28.203600,free,0x7f8a40000000,1024,0x0\n",
	"1,t,allocate,0x10,8,0x0\n1,t,allocate,0x10,8,0x0\n",
	"1,t,allocate,(nil),0,0x0\n1,t,free,(nil),0,0x0\n1,t,deallocate,10,8,7\n",
}

// pickleSeeds returns the small snapshot pickles of internal/trace's
// testdata and a few hand-made ones.
func pickleSeeds(f *testing.F) [][]byte {
	var seeds [][]byte
	for _, name := range []string{"small.snapshot.pickle", "two_devices.snapshot.pickle"} {
		b, err := os.ReadFile("../internal/trace/testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		seeds = append(seeds, b)
	}
	return append(seeds,
		[]byte("\x80\x02}(X\x08\x00\x00\x00segments]X\r\x00\x00\x00device_traces]]a\x85u."),
		[]byte("\x80\x02}K\x01(K\x02s."),
		[]byte("\x80\x04\x95\x05\x00\x00\x00\x00\x00\x00\x00]\x94h\x00a."),
		// Python's pickle of [a, f, a, f] for one alloc entry a and one
		// free f: the second pair is memo references (h\x06h\x0c).
		[]byte("\x80\x02}q\x00(X\x08\x00\x00\x00segmentsq\x01]q\x02X\x0d\x00\x00\x00device_tracesq\x03]q\x04]q\x05("+
			"}q\x06(X\x06\x00\x00\x00actionq\x07X\x05\x00\x00\x00allocq\x08X\x04\x00\x00\x00addrq\x09K\x10X\x04\x00\x00\x00sizeq\x0aK\x10"+
			"X\x06\x00\x00\x00streamq\x0bK\x00u}q\x0c(h\x07X\x0e\x00\x00\x00free_requestedq\x0dh\x09K\x10uh\x06h\x0ceau."),
	)
}

func gz(f *testing.F, b []byte) []byte {
	var buf bytes.Buffer
	w := gzip.NewWriter(&buf)
	if _, err := w.Write(b); err != nil {
		f.Fatal(err)
	}
	if err := w.Close(); err != nil {
		f.Fatal(err)
	}
	return buf.Bytes()
}
