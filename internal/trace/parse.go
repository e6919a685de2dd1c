package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"strings"
	"unicode/utf8"
)

// Input limits. They bound the memory a hostile or runaway input can make
// Parse use; see doc.go for the accounting.
const (
	// MaxInputBytes bounds a text or CSV input after decompression. The
	// shortest op line pair "a 1 1 0\n" + "f 1\n" is 12 bytes for two
	// 32-byte Ops, so 256 MiB of input holds at most about 1.4 GiB of Ops;
	// the largest trace we have (resnet50, 42,915 ops) is 0.8 MiB of text.
	MaxInputBytes = 256 << 20

	// MaxPickleBytes bounds a pickle after decompression. A pickle is read
	// whole and decoded into a tree before conversion, which takes about 6
	// bytes of heap per pickle byte (and at most 32 by scanPickle's
	// estimate); PyTorch writes about 55 bytes per trace entry, so 128 MiB
	// holds some 2.4 million entries. The embedded snapshots hold 4,922
	// (lstm) and 10,993 (tdnn).
	MaxPickleBytes = 128 << 20
)

// maxLine bounds one line of a text or CSV input. The longest well-formed
// op line is 2+20+1+20+1+20 = 64 bytes and an RMM row about 100; 64 KiB
// leaves room for long comments while keeping a line-less input from
// growing the scanner's buffer without limit.
const maxLine = 64 << 10

// ParseFile opens the file at path and parses it with Parse. Errors from
// opening or reading the file are returned as they are (*fs.PathError);
// defects of its content are as for Parse.
func ParseFile(path string) (*Trace, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	return Parse(path, f)
}

// Parse reads a trace from r. name is used for Trace.Name and Trace.Source
// and in error messages; it is not opened.
//
// A gzip stream (magic bytes 1f 8b) is decompressed first. The format is
// then told by content: a pickle starts with the PROTO opcode (0x80); an
// input whose first line is not a '#' comment and holds a comma is an RMM
// CSV log; anything else is a text trace. doc.go gives each grammar.
//
// Errors: a *ParseError matching ErrMalformed for any defect of the input
// (including an empty input and a corrupt gzip stream), naming the line
// (text, CSV) or byte offset (gzip, pickle syntax) or pickle element
// (pickle shape); an error matching ErrTooLarge past MaxInputBytes or
// MaxPickleBytes; or a read error of r, returned as it is.
//
// Parse does not panic on any input, keeps no state between calls and is
// safe to call from many goroutines at once.
func Parse(name string, r io.Reader) (*Trace, error) {
	br := bufio.NewReaderSize(r, 64<<10)
	var src io.Reader = br
	if magic, _ := br.Peek(2); len(magic) == 2 && magic[0] == 0x1f && magic[1] == 0x8b {
		cr := &countingReader{r: br}
		zr, err := gzip.NewReader(cr)
		if err != nil {
			return nil, gzipError(name, cr.n, err)
		}
		src = &gzipReader{z: zr, c: cr, name: name}
	}

	head := bufio.NewReaderSize(src, 64<<10)
	first, err := head.Peek(1)
	if len(first) == 0 {
		if err != nil && err != io.EOF {
			return nil, err
		}
		return nil, atByte(name, 0, "empty input")
	}
	if first[0] == pickleProto {
		return parsePickle(name, head)
	}
	// Binary data is named as such when the parsers refuse it, rather
	// than as a bad CSV header or text line; input they accept (text
	// comments may hold any bytes) is a trace whatever its bytes.
	binary, isBinary := binaryStart(head)
	in := &limitReader{r: head, left: MaxInputBytes, name: name}
	var t *Trace
	if isCSV(head) {
		t, err = parseCSV(name, in)
	} else {
		t, err = parseText(name, in)
	}
	if err != nil && isBinary {
		return nil, atByte(name, 0, "not a trace this package reads (text, PyTorch snapshot pickle, or RMM CSV, each plain or gzip): binary data (begins % x)", binary)
	}
	return t, err
}

// binaryStart reports whether the input begins with what looks like
// binary data rather than text: a NUL or another control character other than tab, CR, LF
// and form feed, or bytes that are not UTF-8, in its first 512 bytes. It
// returns the first 8 bytes to show.
func binaryStart(r *bufio.Reader) ([]byte, bool) {
	buf, _ := r.Peek(512)
	show := buf[:min(len(buf), 8)]
	for i := 0; i < len(buf); {
		c, n := utf8.DecodeRune(buf[i:])
		if c == utf8.RuneError && n <= 1 {
			if len(buf)-i < utf8.UTFMax && !utf8.FullRune(buf[i:]) {
				break // a rune cut by the end of the peek
			}
			return show, true
		}
		if c < 0x20 && c != '\t' && c != '\r' && c != '\n' && c != '\f' {
			return show, true
		}
		i += n
	}
	return nil, false
}

// isCSV reports whether the first line of r, as far as a buffer reaches,
// is not a comment and holds a comma: text ops never do.
func isCSV(r *bufio.Reader) bool {
	buf, _ := r.Peek(r.Size()) // a short read returns what there is
	if i := bytes.IndexByte(buf, '\n'); i >= 0 {
		buf = buf[:i]
	}
	buf = bytes.TrimLeft(buf, " \t\ufeff")
	return !bytes.HasPrefix(buf, []byte("#")) && bytes.IndexByte(buf, ',') >= 0
}

// newScanner returns a line scanner over r whose lines may not exceed
// maxLine bytes.
func newScanner(r io.Reader) *bufio.Scanner {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4096), maxLine)
	return sc
}

// scanError turns the error of a line scanner that stopped after line into
// the error Parse returns.
func scanError(name string, line int, err error) error {
	if errors.Is(err, bufio.ErrTooLong) {
		return atLine(name, line+1, "line longer than %d bytes", maxLine)
	}
	return err // a *ParseError from gzip, ErrTooLarge, or a read error
}

// traceName returns the short name for a trace read from file: its base
// name less known extensions.
func traceName(file string) string {
	base := path.Base(filepath.ToSlash(file))
	for {
		ext := strings.ToLower(path.Ext(base))
		switch ext {
		case ".gz", ".trace", ".snapshot", ".pickle", ".pkl", ".csv", ".txt", ".log":
			if len(base) > len(ext) {
				base = base[:len(base)-len(ext)]
				continue
			}
		}
		return base
	}
}

// countingReader counts the bytes read through it, so that gzip errors can
// name an offset in the compressed stream. It implements io.ByteReader so
// that compress/flate reads no further than it needs.
type countingReader struct {
	r *bufio.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *countingReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

// gzipReader turns the errors of a gzip.Reader into *ParseErrors naming the
// compressed offset reached.
type gzipReader struct {
	z    *gzip.Reader
	c    *countingReader
	name string
}

func (g *gzipReader) Read(p []byte) (int, error) {
	n, err := g.z.Read(p)
	if err != nil && err != io.EOF {
		err = gzipError(g.name, g.c.n, err)
	}
	return n, err
}

// gzipError describes err, met at compressed offset off of file.
func gzipError(file string, off int64, err error) error {
	var pe *ParseError
	if errors.As(err, &pe) {
		return err
	}
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	msg := strings.TrimPrefix(err.Error(), "gzip: ")
	return atByte(file, off, "gzip: %s (offset in the compressed stream)", msg)
}

// limitReader returns an ErrTooLarge error once more than left bytes have
// been read through it. It remembers the first error other than io.EOF:
// bufio.Scanner hands out a last partial line before reporting an error,
// and the line parsers report the error (a cut gzip stream, say) rather
// than what is wrong with that partial line.
type limitReader struct {
	r    io.Reader
	left int64
	name string
	err  error
}

func (l *limitReader) Read(p []byte) (n int, err error) {
	switch {
	case l.err != nil:
		return 0, l.err
	case l.left < 0:
		l.err = l.tooLarge()
		return 0, l.err
	}
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err = l.r.Read(p)
	l.left -= int64(n)
	if l.left < 0 {
		n, err = n-int(-l.left), l.tooLarge()
	}
	if err != nil && err != io.EOF {
		l.err = err
	}
	return n, err
}

// or returns the error met reading, if any, else err.
func (l *limitReader) or(err error) error {
	if l.err != nil {
		return l.err
	}
	return err
}

func (l *limitReader) tooLarge() error {
	return fmt.Errorf("trace: %s: more than %d bytes after decompression: %w", l.name, MaxInputBytes, ErrTooLarge)
}
