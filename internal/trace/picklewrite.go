package trace

// Writing pickles: the inverse of the reader in pickle.go, for the
// snapshots package pool writes in the format of
// torch.cuda.memory._snapshot().
//
// The writer emits protocol 2 (Python 2.3 and later read it; every
// opcode it uses is in the plain-data subset scanPickle accepts): a dict
// is EMPTY_DICT, then MARK, its keys and values, SETITEMS in batches of
// pickleBatch pairs; a list is EMPTY_LIST, MARK, items, APPENDS; strings
// are BINUNICODE (UTF-8 with a 4-byte length); integers BININT1, BININT2
// or BININT where they fit, else LONG1 (little-endian two's complement,
// as Python's encode_long writes it); no memo, so a value referenced
// twice is written twice.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
	"math"
)

// pickleBatch is how many items one SETITEMS or APPENDS takes: Python's
// pickler uses 1000, and so the unpickler's stack never holds more.
const pickleBatch = 1000

// Item is one key and value of a Dict.
type Item struct {
	Key   string
	Value any
}

// Dict is a Python dict with string keys, written in order.
type Dict []Item

// WritePickle writes v as a protocol-2 pickle. v is built of nil (None),
// bool, int, int64, uint64, float64, string, Dict, []Dict, []any and
// []string; Python reads it with pickle.load and this package with
// Parse. Errors: those of w, and an error naming the path of a value of
// any other type (nothing useful is written then).
func WritePickle(w io.Writer, v any) error {
	pw := &pickleWriter{w: bufio.NewWriter(w)}
	pw.b = append(pw.b, pickleProto, 2)
	if err := pw.value("", v); err != nil {
		return err
	}
	pw.b = append(pw.b, opStop)
	pw.flush()
	if pw.err != nil {
		return pw.err
	}
	return pw.w.Flush()
}

type pickleWriter struct {
	w   *bufio.Writer
	b   []byte
	err error
}

// flush moves the buffered opcodes to w once they fill 64 KiB.
func (pw *pickleWriter) flush() {
	if pw.err == nil {
		_, pw.err = pw.w.Write(pw.b)
	}
	pw.b = pw.b[:0]
}

func (pw *pickleWriter) value(path string, v any) error {
	if len(pw.b) >= 64<<10 {
		pw.flush()
	}
	switch v := v.(type) {
	case nil:
		pw.b = append(pw.b, opNone)
	case bool:
		if v {
			pw.b = append(pw.b, opNewTrue)
		} else {
			pw.b = append(pw.b, opNewFalse)
		}
	case int:
		pw.int(int64(v), v < 0)
	case int64:
		pw.int(v, v < 0)
	case uint64:
		if v > math.MaxInt64 {
			pw.long(v, false)
		} else {
			pw.int(int64(v), false)
		}
	case float64:
		pw.b = append(pw.b, opBinFloat)
		pw.b = binary.BigEndian.AppendUint64(pw.b, math.Float64bits(v))
	case string:
		pw.b = append(pw.b, opBinUnicode)
		pw.b = binary.LittleEndian.AppendUint32(pw.b, uint32(len(v)))
		pw.b = append(pw.b, v...)
	case Dict:
		pw.b = append(pw.b, opEmptyDict)
		for i := 0; i < len(v); i += pickleBatch {
			pw.b = append(pw.b, opMark)
			for _, it := range v[i:min(i+pickleBatch, len(v))] {
				if err := pw.value("", it.Key); err != nil {
					return err
				}
				if err := pw.value(path+"."+it.Key, it.Value); err != nil {
					return err
				}
			}
			pw.b = append(pw.b, opSetItems)
		}
	case []Dict:
		return list(pw, path, v)
	case []any:
		return list(pw, path, v)
	case []string:
		return list(pw, path, v)
	default:
		return fmt.Errorf("trace: cannot pickle %T at %q", v, path)
	}
	return nil
}

func list[T any](pw *pickleWriter, path string, v []T) error {
	pw.b = append(pw.b, opEmptyList)
	for i := 0; i < len(v); i += pickleBatch {
		pw.b = append(pw.b, opMark)
		for j, it := range v[i:min(i+pickleBatch, len(v))] {
			if err := pw.value(fmt.Sprintf("%s[%d]", path, i+j), it); err != nil {
				return err
			}
		}
		pw.b = append(pw.b, opAppends)
	}
	return nil
}

// int writes v (negative when neg) in the shortest form.
func (pw *pickleWriter) int(v int64, neg bool) {
	switch {
	case v >= 0 && v < 1<<8:
		pw.b = append(pw.b, opBinInt1, byte(v))
	case v >= 0 && v < 1<<16:
		pw.b = append(pw.b, opBinInt2)
		pw.b = binary.LittleEndian.AppendUint16(pw.b, uint16(v))
	case v >= math.MinInt32 && v <= math.MaxInt32:
		pw.b = append(pw.b, opBinInt)
		pw.b = binary.LittleEndian.AppendUint32(pw.b, uint32(int32(v)))
	default:
		pw.long(uint64(v), neg)
	}
}

// long writes the 64-bit two's complement u (negative when neg) as LONG1:
// the fewest little-endian bytes whose top bit is the sign.
func (pw *pickleWriter) long(u uint64, neg bool) {
	var buf [9]byte
	binary.LittleEndian.PutUint64(buf[:8], u)
	n := 9
	if neg {
		buf[8] = 0xff
		for n > 1 && buf[n-1] == 0xff && buf[n-2]&0x80 != 0 {
			n--
		}
	} else {
		for n > 1 && buf[n-1] == 0 && buf[n-2]&0x80 == 0 {
			n--
		}
	}
	pw.b = append(pw.b, opLong1, byte(n))
	pw.b = append(pw.b, buf[:n]...)
}
