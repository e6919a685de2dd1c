package trace

import (
	"bytes"
)

// rmmHeader is the first line RMM's logging_resource_adaptor writes.
const rmmHeader = "Thread,Time,Action,Pointer,Size,Stream"

// parseCSV parses an RMM logging_resource_adaptor log (see doc.go). The log
// may begin mid-run, so a free of an address that is not live is counted
// in Skipped, not rejected.
func parseCSV(name string, r *limitReader) (*Trace, error) {
	t, err := csvLines(name, r)
	if err != nil {
		return nil, r.or(err)
	}
	return t, nil
}

// csvLines is parseCSV, less the choice of which error to report.
func csvLines(name string, r *limitReader) (*Trace, error) {
	t := &Trace{Name: traceName(name), Source: name, Format: FormatRMM}
	live := make(map[uint64]liveBlock) // by pointer
	var nextID uint64 = 1
	sc := newScanner(r)
	line := 0
	var f [6][]byte
	for sc.Scan() {
		line++
		s := bytes.TrimSpace(sc.Bytes())
		if line == 1 {
			s = bytes.TrimPrefix(s, []byte("\ufeff"))
			if string(s) != rmmHeader {
				return nil, atLine(name, line, "not a trace this package reads (text, PyTorch snapshot pickle, or RMM CSV): CSV header %q, want %q", clip(s), rmmHeader)
			}
			continue
		}
		if len(s) == 0 {
			continue
		}
		if n := splitComma(s, f[:]); n != len(f) {
			return nil, atLine(name, line, "%d fields, want 6 (%s)", n, rmmHeader)
		}
		action, ptrField, sizeField, streamField := string(f[2]), f[3], f[4], f[5]
		switch action {
		case "allocate":
			size, err := decimal(name, line, "size", sizeField)
			if err != nil {
				return nil, err
			}
			ptr, err := hexPointer(name, line, "pointer", ptrField)
			if err != nil {
				return nil, err
			}
			stream, err := streamValue(name, line, streamField)
			if err != nil {
				return nil, err
			}
			if size == 0 {
				t.Skipped++
				continue
			}
			if _, dup := live[ptr]; dup {
				return nil, atLine(name, line, "allocate at %#x, which is live", ptr)
			}
			live[ptr] = liveBlock{id: nextID, size: size, stream: stream}
			t.Ops = append(t.Ops, Op{ID: nextID, Size: size, Stream: stream})
			nextID++
		case "free", "deallocate":
			if _, err := decimal(name, line, "size", sizeField); err != nil {
				return nil, err
			}
			ptr, err := hexPointer(name, line, "pointer", ptrField)
			if err != nil {
				return nil, err
			}
			if _, err := streamValue(name, line, streamField); err != nil {
				return nil, err
			}
			b, ok := live[ptr]
			if !ok {
				t.Skipped++
				continue
			}
			delete(live, ptr)
			t.Ops = append(t.Ops, Op{Free: true, ID: b.id, Size: b.size, Stream: b.stream})
		case "allocate failure":
			if _, err := decimal(name, line, "size", sizeField); err != nil {
				return nil, err
			}
			t.Failures++
		default:
			return nil, atLine(name, line, `action %q, want "allocate", "allocate failure" or "free"`, clip(f[2]))
		}
	}
	if err := sc.Err(); err != nil {
		return nil, scanError(name, line, err)
	}
	return t, nil
}

// splitComma splits s at commas into f, with blanks around each field
// trimmed, and returns how many fields s has, which may exceed len(f).
func splitComma(s []byte, f [][]byte) int {
	n := 0
	for {
		i := bytes.IndexByte(s, ',')
		field := s
		if i >= 0 {
			field = s[:i]
		}
		if n < len(f) {
			f[n] = bytes.TrimSpace(field)
		}
		n++
		if i < 0 {
			return n
		}
		s = s[i+1:]
	}
}

// hexPointer parses a pointer as printf's %p writes it: hexadecimal with an
// optional 0x, or "(nil)" for the null pointer.
func hexPointer(name string, line int, what string, b []byte) (uint64, error) {
	if string(b) == "(nil)" {
		return 0, nil
	}
	h := b
	if len(h) > 2 && h[0] == '0' && (h[1] == 'x' || h[1] == 'X') {
		h = h[2:]
	}
	if len(h) == 0 || len(h) > 16 {
		return 0, atLine(name, line, "%s %q is not a 64-bit hexadecimal address", what, clip(b))
	}
	var v uint64
	for _, c := range h {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, atLine(name, line, "%s %q is not a 64-bit hexadecimal address", what, clip(b))
		}
		v = v<<4 | uint64(d)
	}
	return v, nil
}

// streamValue parses a stream: a handle in hexadecimal with 0x (how RMM
// prints cudaStream_t), a decimal number, or "(nil)".
func streamValue(name string, line int, b []byte) (uint64, error) {
	if len(b) > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X') || string(b) == "(nil)" {
		return hexPointer(name, line, "stream", b)
	}
	return decimal(name, line, "stream", b)
}
