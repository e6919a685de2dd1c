package trace

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// textLive is what the text parser remembers of a live block.
type textLive struct {
	size, stream uint64
	line         int // where it was allocated, for error messages
}

// parseText parses the text format (see doc.go) strictly: any defect is an
// error naming its line.
func parseText(name string, r *limitReader) (*Trace, error) {
	t, err := textLines(name, r)
	if err != nil {
		return nil, r.or(err)
	}
	return t, nil
}

// textLines is parseText, less the choice of which error to report.
func textLines(name string, r *limitReader) (*Trace, error) {
	t := &Trace{Name: traceName(name), Source: name, Format: FormatText}
	live := make(map[uint64]textLive)
	sc := newScanner(r)
	line := 0
	var f [4][]byte
	for sc.Scan() {
		line++
		s := bytes.TrimSpace(sc.Bytes())
		if len(s) == 0 {
			continue
		}
		if s[0] == '#' {
			t.Comments = append(t.Comments, string(bytes.TrimSpace(s[1:])))
			continue
		}
		n := fields(s, f[:])
		switch string(f[0]) {
		case "a":
			if n != 4 {
				return nil, atLine(name, line, `want "a ID SIZE STREAM", got %d fields`, n)
			}
			id, err := decimal(name, line, "ID", f[1])
			if err != nil {
				return nil, err
			}
			size, err := decimal(name, line, "size", f[2])
			if err != nil {
				return nil, err
			}
			stream, err := decimal(name, line, "stream", f[3])
			if err != nil {
				return nil, err
			}
			if size == 0 {
				return nil, atLine(name, line, "allocation of ID %d has size 0", id)
			}
			if b, dup := live[id]; dup {
				return nil, atLine(name, line, "allocation of ID %d, which is live since line %d", id, b.line)
			}
			live[id] = textLive{size: size, stream: stream, line: line}
			t.Ops = append(t.Ops, Op{ID: id, Size: size, Stream: stream})
		case "f":
			if n != 2 {
				return nil, atLine(name, line, `want "f ID", got %d fields`, n)
			}
			id, err := decimal(name, line, "ID", f[1])
			if err != nil {
				return nil, err
			}
			b, ok := live[id]
			if !ok {
				return nil, atLine(name, line, "free of ID %d, which is not live", id)
			}
			delete(live, id)
			t.Ops = append(t.Ops, Op{Free: true, ID: id, Size: b.size, Stream: b.stream})
		default:
			return nil, atLine(name, line, `unknown record %q: want "a ID SIZE STREAM", "f ID" or "# comment"`, clip(f[0]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, scanError(name, line, err)
	}
	if len(t.Ops) == 0 && len(t.Comments) == 0 {
		return nil, atLine(name, max(line, 1), "empty input: no ops and no comments")
	}
	return t, nil
}

// fields splits s at runs of blanks into f and returns how many fields s
// has, which may exceed len(f); fields past len(f) are not stored.
func fields(s []byte, f [][]byte) int {
	n := 0
	for len(s) > 0 {
		i := bytes.IndexAny(s, " \t")
		if i < 0 {
			i = len(s)
		}
		if i > 0 {
			if n < len(f) {
				f[n] = s[:i]
			}
			n++
		}
		s = s[min(i+1, len(s)):]
	}
	return n
}

// decimal parses b as an unsigned decimal integer below 2^64.
func decimal(name string, line int, what string, b []byte) (uint64, error) {
	if len(b) == 0 || len(b) > 20 {
		return 0, atLine(name, line, "%s %q is not a decimal number below 2^64", what, clip(b))
	}
	var v uint64
	for _, c := range b {
		d := uint64(c - '0')
		if d > 9 || v > (1<<64-1-d)/10 {
			return 0, atLine(name, line, "%s %q is not a decimal number below 2^64", what, clip(b))
		}
		v = v*10 + d
	}
	return v, nil
}

// clip shortens a field for an error message.
func clip(b []byte) string {
	const n = 40
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// WriteText writes t to w in the text format (see doc.go): its Comments as
// '#' lines, then one line per op. Parse reads the output back to equal Ops
// and, for comments without leading or trailing blanks, equal Comments.
//
// Errors: an error wrapping ErrInvalid, before anything is written, if t
// fails Check or a comment holds a line break; otherwise the first error of
// w. WriteText only reads t.
func WriteText(w io.Writer, t *Trace) error {
	if err := t.Check(); err != nil {
		return err
	}
	for i, c := range t.Comments {
		if strings.ContainsRune(c, '\n') {
			return fmt.Errorf("trace: comment %d holds a line break: %w", i, ErrInvalid)
		}
	}
	bw := bufio.NewWriterSize(w, 64<<10)
	for _, c := range t.Comments {
		bw.WriteString("# ")
		bw.WriteString(c)
		bw.WriteByte('\n')
	}
	var buf []byte
	for _, op := range t.Ops {
		buf = buf[:0]
		if op.Free {
			buf = append(buf, "f "...)
			buf = strconv.AppendUint(buf, op.ID, 10)
		} else {
			buf = append(buf, "a "...)
			buf = strconv.AppendUint(buf, op.ID, 10)
			buf = append(buf, ' ')
			buf = strconv.AppendUint(buf, op.Size, 10)
			buf = append(buf, ' ')
			buf = strconv.AppendUint(buf, op.Stream, 10)
		}
		buf = append(buf, '\n')
		if _, err := bw.Write(buf); err != nil {
			return err
		}
	}
	return bw.Flush()
}
