package trace

// Reading PyTorch memory snapshots.
//
// A snapshot is a Python pickle. We decode it with gopickle, but gopickle
// trusts its input: a length field of 2^40 makes it allocate 2^40 bytes, an
// odd item count under DICT or SETITEMS indexes past a slice, opcode 0xff
// indexes past its dispatch table, and a LONG1 of zero bytes reads byte -1.
// So scanPickle walks the opcode stream first, without building anything,
// and rejects what gopickle cannot take safely:
//
//   - any opcode outside the plain-data subset a snapshot uses (no GLOBAL,
//     REDUCE, BUILD, sets, persistent IDs, extensions or buffers: a snapshot
//     is dicts, lists, tuples, strings, numbers, booleans and None);
//   - a length field that reaches past the end of the input;
//   - an opcode that pops more than the stack holds, or a MARK-delimited
//     DICT/SETITEMS with an odd item count (it keeps the stack depth since
//     each MARK, as the unpickler will);
//   - integers wider than maxIntBytes, whose decoding is quadratic;
//   - nesting deeper than maxMarkDepth MARKs;
//   - inputs whose decoding would take more than pickleBudget bytes, by an
//     estimate of what each opcode makes the unpickler allocate.
//
// Only then does gopickle run; a panic in it is still recovered and
// reported, and the fuzzers fail on such a report, so a gap in the scan
// shows up as a test failure rather than a crash in a caller.

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"fmt"
	"io"
	"math/big"
	"slices"
	"strings"

	"github.com/nlpodyssey/gopickle/pickle"
	"github.com/nlpodyssey/gopickle/types"
)

// Pickle opcodes accepted by scanPickle (see Python's Lib/pickletools.py
// for their definitions).
const (
	pickleProto      = 0x80
	opMark           = '('
	opStop           = '.'
	opPop            = '0'
	opPopMark        = '1'
	opDup            = '2'
	opFloat          = 'F'
	opInt            = 'I'
	opBinInt         = 'J'
	opBinInt1        = 'K'
	opLong           = 'L'
	opBinInt2        = 'M'
	opNone           = 'N'
	opString         = 'S'
	opBinString      = 'T'
	opShortBinString = 'U'
	opUnicode        = 'V'
	opBinUnicode     = 'X'
	opAppend         = 'a'
	opDict           = 'd'
	opEmptyDict      = '}'
	opAppends        = 'e'
	opGet            = 'g'
	opBinGet         = 'h'
	opLongBinGet     = 'j'
	opList           = 'l'
	opEmptyList      = ']'
	opPut            = 'p'
	opBinPut         = 'q'
	opLongBinPut     = 'r'
	opSetItem        = 's'
	opTuple          = 't'
	opEmptyTuple     = ')'
	opSetItems       = 'u'
	opBinFloat       = 'G'
	opTuple1         = 0x85
	opTuple2         = 0x86
	opTuple3         = 0x87
	opNewTrue        = 0x88
	opNewFalse       = 0x89
	opLong1          = 0x8a
	opLong4          = 0x8b
	opBinBytes       = 'B'
	opShortBinBytes  = 'C'
	opShortBinUni    = 0x8c
	opBinUnicode8    = 0x8d
	opBinBytes8      = 0x8e
	opMemoize        = 0x94
	opFrame          = 0x95
)

// Limits of scanPickle.
const (
	// maxProtocol is the highest pickle protocol (Python 3.8+ writes 5).
	maxProtocol = 5
	// maxMarkDepth bounds open MARKs. A snapshot nests about five deep
	// (dict > list > list > dict > frames list); each open MARK holds a
	// 16-slot stack segment in gopickle, 256 bytes.
	maxMarkDepth = 1024
	// maxIntBytes bounds LONG1/LONG4 payloads and the digits of INT/LONG
	// lines: gopickle decodes wide integers in time quadratic in their
	// length. Addresses and sizes take at most 9 bytes (8 + a sign byte),
	// 20 digits.
	maxIntBytes = 64
	// maxEntryKeys bounds the keys of one trace entry dict; PyTorch 2.11
	// writes 7. The bound keeps the time to read entries linear in the
	// pickle's length even when one entry is referenced many times.
	maxEntryKeys = 64
	// minEventBytes is the fewest pickle bytes an alloc or free_requested
	// entry takes unless it is shared through the memo: a free is at least
	// MARK, two memoized keys and a memoized action (BINGET, 2 bytes
	// each), a BININT1 address and DICT, 10 bytes. Past one event per
	// minEventBytes, entries are referenced many times over, and the
	// trace (96 bytes an event while converting) would dwarf the pickle.
	minEventBytes = 10
)

// Estimated bytes of the decoded value that each opcode adds, for
// pickleBudget. They follow gopickle's data structures on a 64-bit
// machine. A MARK's stack segment is not counted: it is garbage once
// closed, and maxMarkDepth bounds the open ones.
const (
	costSlot      = 16  // an interface value, in a container or on the stack
	costBox       = 16  // a boxed number or string header
	costContainer = 160 // EMPTY_DICT: *Dict (24) + room for 4 entries of 32
	costMemo      = 64  // one map[int]interface{} entry with map overhead
	costGrowth    = 16  // amortised slack of append's doubling, per item
)

// pickleBudget is the estimated decoding memory allowed for a pickle of n
// bytes: 32 bytes per input byte plus 64 MiB. The embedded PyTorch
// snapshots estimate at 17 bytes per input byte (their measured live heap
// is 6); a pickle of nothing but EMPTY_DICT opcodes would estimate at 176
// (measured: 169). With MaxPickleBytes, the estimate never passes much
// more than 4 GiB; the process's heap may take up to twice what is live
// (Go's GC target). The worst case measured is a pickle of memo
// references to two entries (BINGET, 2 bytes each, estimated at 16 bytes
// per input byte): 7.3 GB at the peak for 132 MB decoded, which
// convertSnapshot then refuses (minEventBytes).
func pickleBudget(n int) int64 { return 64<<20 + 32*int64(n) }

// parsePickle reads a whole pickle from r and converts its device traces.
func parsePickle(name string, r io.Reader) (*Trace, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxPickleBytes+1))
	if err != nil {
		return nil, err
	}
	if len(b) > MaxPickleBytes {
		return nil, fmt.Errorf("trace: %s: pickle larger than %d bytes: %w", name, MaxPickleBytes, ErrTooLarge)
	}
	if err := scanPickle(name, b); err != nil {
		return nil, err
	}
	v, err := unpickle(name, b)
	if err != nil {
		return nil, err
	}
	return convertSnapshot(name, v, len(b))
}

// unpickle runs gopickle on b, which scanPickle accepted.
func unpickle(name string, b []byte) (v any, err error) {
	cr := &byteCounter{r: bytes.NewReader(b)}
	defer func() {
		if p := recover(); p != nil {
			v, err = nil, atByte(name, cr.n, "internal error: unpickler panicked: %v", p)
		}
	}()
	u := pickle.NewUnpickler(cr)
	v, err = u.Load()
	if err != nil {
		return nil, atByte(name, cr.n, "pickle: %v (offset reached when detected)", err)
	}
	return v, nil
}

// byteCounter counts the bytes the unpickler has consumed.
type byteCounter struct {
	r *bytes.Reader
	n int64
}

func (c *byteCounter) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

func (c *byteCounter) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		c.n++
	}
	return b, err
}

// scanPickle checks that gopickle can decode b safely; see the comment at
// the top of this file.
func scanPickle(name string, b []byte) error {
	s := &pickleScan{name: name, b: b}
	budget := pickleBudget(len(b))
	for s.off < len(b) {
		stop, err := s.step()
		if err != nil {
			return err
		}
		if stop {
			return nil
		}
		if s.cost > budget {
			return fmt.Errorf("trace: %s: byte %d: decoding the pickle would take more than %d bytes (32 per input byte + 64 MiB): %w",
				name, s.at, budget, ErrTooLarge)
		}
	}
	return atByte(name, int64(len(b)), "pickle ends without STOP")
}

// pickleScan is the state of scanPickle.
type pickleScan struct {
	name  string
	b     []byte
	off   int   // next byte to read
	at    int   // offset of the current opcode
	op    byte  // the current opcode
	marks []int // depth of the enclosing segment at each open MARK
	depth int   // items pushed since the innermost MARK
	cost  int64 // estimated bytes the unpickler allocates
}

// step checks the opcode at s.off and its argument, and advances past them.
// It reports whether the opcode was STOP.
func (s *pickleScan) step() (stop bool, err error) {
	s.at, s.op = s.off, s.b[s.off]
	s.off++
	n := 0       // payload bytes of a pushed value
	push := true // whether the opcode pushes one item
	switch s.op {
	case pickleProto:
		var a []byte
		if a, err = s.fixed(1); err == nil && a[0] > maxProtocol {
			err = s.bad("protocol %d, want at most %d", a[0], maxProtocol)
		}
		push = false
	case opFrame:
		// The frame's opcodes follow and are scanned as usual; only its
		// length, which gopickle allocates, needs checking.
		var a []byte
		if a, err = s.fixed(8); err == nil {
			if l := binary.LittleEndian.Uint64(a); l > uint64(len(s.b)-s.off) {
				err = s.bad("frame of %d bytes reaches past the end of the input (%d bytes left)", l, len(s.b)-s.off)
			}
		}
		push = false
	case opStop:
		if err := s.need(1); err != nil {
			return false, err
		}
		return true, nil
	case opMark:
		if len(s.marks) >= maxMarkDepth {
			return false, s.bad("more than %d nested MARKs", maxMarkDepth)
		}
		s.marks = append(s.marks, s.depth)
		s.depth = 0
		push = false
	case opPop:
		if s.depth > 0 {
			s.depth--
		} else {
			err = s.popMark()
		}
		push = false
	case opPopMark:
		err = s.popMark()
		push = false
	case opDup:
		err = s.need(1)
	case opBinGet:
		_, err = s.fixed(1)
	case opLongBinGet:
		_, err = s.fixed(4)
	case opGet:
		_, err = s.line(maxIntBytes)
	case opNone, opNewTrue, opNewFalse, opEmptyTuple:
		s.cost += costBox
	case opBinInt1:
		_, err = s.fixed(1)
		s.cost += costBox
	case opBinInt2:
		_, err = s.fixed(2)
		s.cost += costBox
	case opBinInt:
		_, err = s.fixed(4)
		s.cost += costBox
	case opBinFloat:
		_, err = s.fixed(8)
		s.cost += costBox
	case opLong1, opLong4:
		width := 1
		if s.op == opLong4 {
			width = 4
		}
		if n, err = s.counted(width, maxIntBytes); err == nil && n == 0 {
			err = s.bad("zero-length integer")
		}
	case opInt, opLong, opFloat:
		n, err = s.line(maxIntBytes)
	case opString, opUnicode:
		n, err = s.line(len(s.b))
	case opShortBinString, opShortBinBytes, opShortBinUni:
		n, err = s.counted(1, 255)
	case opBinString:
		n, err = s.counted(4, 1<<31-1)
	case opBinBytes, opBinUnicode:
		n, err = s.counted(4, 1<<32-1)
	case opBinUnicode8, opBinBytes8:
		n, err = s.counted(8, uint64(len(s.b)))
	case opEmptyList, opEmptyDict:
		s.cost += costContainer
	case opPut, opBinPut, opLongBinPut, opMemoize:
		switch s.op {
		case opPut:
			_, err = s.line(maxIntBytes)
		case opBinPut:
			_, err = s.fixed(1)
		case opLongBinPut:
			_, err = s.fixed(4)
		}
		if err == nil {
			err = s.need(1)
		}
		s.cost += costMemo
		push = false
	case opTuple, opList:
		err = s.popMark()
		s.cost += costContainer
	case opDict:
		if s.depth%2 != 0 {
			err = s.bad("odd number of items (%d) for key/value pairs", s.depth)
		} else {
			err = s.popMark()
		}
		s.cost += costContainer
	case opTuple1, opTuple2, opTuple3:
		k := int(s.op-opTuple1) + 1
		if err = s.need(k); err == nil {
			s.depth -= k // then the tuple is pushed
		}
		s.cost += costContainer
	case opAppend, opSetItem:
		k := 2 // list, item; the list is pushed back
		if s.op == opSetItem {
			k = 3 // dict, key, value
		}
		if err = s.need(k); err == nil {
			s.depth -= k
		}
		s.cost += costGrowth
	case opAppends, opSetItems:
		items := s.depth
		if s.op == opSetItems && items%2 != 0 {
			err = s.bad("odd number of items (%d) for key/value pairs", items)
		} else if err = s.popMark(); err == nil {
			if err = s.need(1); err == nil {
				s.depth-- // the container, pushed back
			}
		}
		s.cost += costGrowth * int64(items)
	default:
		return false, s.bad("not allowed in a memory snapshot, which holds only dicts, lists, tuples, strings and numbers")
	}
	if err != nil {
		return false, err
	}
	if push {
		s.depth++
		s.cost += costSlot + int64(n)
		if n > 0 {
			s.cost += costBox
		}
	}
	return false, nil
}

// bad returns an error about the current opcode.
func (s *pickleScan) bad(format string, args ...any) error {
	return atByte(s.name, int64(s.at), "pickle opcode %s: %s", opName(s.op), fmt.Sprintf(format, args...))
}

// fixed reads an n-byte argument.
func (s *pickleScan) fixed(n int) ([]byte, error) {
	if len(s.b)-s.off < n {
		return nil, s.bad("wants %d argument bytes, %d left", n, len(s.b)-s.off)
	}
	a := s.b[s.off : s.off+n]
	s.off += n
	return a, nil
}

// counted reads a little-endian length of width bytes, then that many
// bytes, which may not exceed limit, and returns the length.
func (s *pickleScan) counted(width int, limit uint64) (int, error) {
	a, err := s.fixed(width)
	if err != nil {
		return 0, err
	}
	var l uint64
	switch width {
	case 1:
		l = uint64(a[0])
	case 4:
		l = uint64(binary.LittleEndian.Uint32(a))
	default:
		l = binary.LittleEndian.Uint64(a)
	}
	if l > limit {
		return 0, s.bad("length %d exceeds %d", l, limit)
	}
	if l > uint64(len(s.b)-s.off) {
		return 0, s.bad("length %d reaches past the end of the input (%d bytes left)", l, len(s.b)-s.off)
	}
	s.off += int(l)
	return int(l), nil
}

// line reads a newline-terminated argument of at most limit bytes and
// returns its length.
func (s *pickleScan) line(limit int) (int, error) {
	i := bytes.IndexByte(s.b[s.off:], '\n')
	if i < 0 {
		return 0, s.bad("argument has no terminating newline")
	}
	if i > limit {
		return 0, s.bad("argument of %d bytes exceeds %d", i, limit)
	}
	s.off += i + 1
	return i, nil
}

// need checks that n items were pushed since the innermost MARK.
func (s *pickleScan) need(n int) error {
	if s.depth < n {
		return s.bad("needs %d stack items, %d above the last MARK", n, s.depth)
	}
	return nil
}

// popMark closes the innermost MARK.
func (s *pickleScan) popMark() error {
	if len(s.marks) == 0 {
		return s.bad("no MARK to pop")
	}
	s.depth = s.marks[len(s.marks)-1]
	s.marks = s.marks[:len(s.marks)-1]
	return nil
}

// opName names a pickle opcode for error messages.
func opName(op byte) string {
	if op >= 0x21 && op < 0x7f {
		return fmt.Sprintf("%#02x (%q)", op, op)
	}
	return fmt.Sprintf("%#02x", op)
}

// snapEvent is one alloc or free_requested entry of a snapshot.
type snapEvent struct {
	dev, idx int // position in device_traces, for messages
	free     bool
	addr     uint64
	size     uint64
	stream   uint64
	time     int64
	hasTime  bool
}

// convertSnapshot turns a decoded snapshot into a Trace. n is the pickle's
// size, which bounds the number of entries it may visit: a list
// referenced many times from the memo could otherwise expand a small
// pickle into a huge trace.
func convertSnapshot(name string, v any, n int) (*Trace, error) {
	top, ok := v.(*types.Dict)
	if !ok {
		return nil, atPath(name, "pickle", "top level is %s, want a dict with segments and device_traces", typeName(v))
	}
	seg, ok := dictGet(top, "segments")
	if !ok {
		return nil, atPath(name, "pickle", "top-level dict has no segments")
	}
	if _, ok := seg.(*types.List); !ok {
		return nil, atPath(name, "segments", "is %s, want a list", typeName(seg))
	}
	dtv, ok := dictGet(top, "device_traces")
	if !ok {
		return nil, atPath(name, "pickle", "top-level dict has no device_traces")
	}
	dt, ok := dtv.(*types.List)
	if !ok {
		return nil, atPath(name, "device_traces", "is %s, want a list", typeName(dtv))
	}

	var events []snapEvent
	visited := 0
	devices := 0 // devices with at least one event
	for dev, lv := range *dt {
		l, ok := lv.(*types.List)
		if !ok {
			return nil, atPath(name, fmt.Sprintf("device_traces[%d]", dev), "is %s, want a list", typeName(lv))
		}
		visited += len(*l)
		if visited > n {
			return nil, fmt.Errorf("trace: %s: device_traces hold more entries than the pickle has bytes (lists shared through the memo): %w", name, ErrTooLarge)
		}
		before := len(events)
		for i, ev := range *l {
			e, err := snapshotEntry(name, dev, i, ev)
			if err != nil {
				return nil, err
			}
			if e != nil {
				if len(events) >= n/minEventBytes {
					return nil, fmt.Errorf("trace: %s: device_traces hold more alloc and free entries than %d bytes of pickle can (entries shared through the memo): %w", name, n, ErrTooLarge)
				}
				events = append(events, *e)
			}
		}
		if len(events) > before {
			devices++
		}
	}
	if devices > 1 {
		// Entries of different devices interleave in time; each list is
		// in time order, so a stable sort by time_us merges them.
		for _, e := range events {
			if !e.hasTime {
				return nil, atPath(name, fmt.Sprintf("device_traces[%d][%d]", e.dev, e.idx), "has no integer time_us, needed to merge %d devices", devices)
			}
		}
		slices.SortStableFunc(events, func(a, b snapEvent) int {
			return cmp.Compare(a.time, b.time)
		})
	}

	t := &Trace{Name: traceName(name), Source: name, Format: FormatPyTorch}
	type key struct {
		dev  int
		addr uint64
	}
	live := make(map[key]liveBlock)
	var nextID uint64 = 1
	for _, e := range events {
		k := key{e.dev, e.addr}
		if e.free {
			b, ok := live[k]
			if !ok {
				t.Skipped++
				continue
			}
			delete(live, k)
			t.Ops = append(t.Ops, Op{Free: true, ID: b.id, Size: b.size, Stream: b.stream})
			continue
		}
		if e.size == 0 {
			t.Skipped++
			continue
		}
		if _, dup := live[k]; dup {
			return nil, atPath(name, fmt.Sprintf("device_traces[%d][%d]", e.dev, e.idx), "alloc at %#x, which is live", e.addr)
		}
		live[k] = liveBlock{id: nextID, size: e.size, stream: e.stream}
		t.Ops = append(t.Ops, Op{ID: nextID, Size: e.size, Stream: e.stream})
		nextID++
	}
	return t, nil
}

// snapshotEntry reads entry i of device dev: nil for an action other than
// alloc and free_requested. It reads the entry's keys in one pass, the
// last of duplicate keys winning as in a Python dict, so that a pickle
// referencing one big entry many times costs time linear in its length.
func snapshotEntry(name string, dev, i int, v any) (*snapEvent, error) {
	path := func() string { return fmt.Sprintf("device_traces[%d][%d]", dev, i) }
	d, ok := v.(*types.Dict)
	if !ok {
		return nil, atPath(name, path(), "is %s, want a dict", typeName(v))
	}
	if len(*d) > maxEntryKeys {
		return nil, atPath(name, path(), "has %d keys, more than %d", len(*d), maxEntryKeys)
	}
	var action, addr, size, stream, time any = absent{}, absent{}, absent{}, absent{}, absent{}
	for _, kv := range *d {
		switch kv.Key {
		case "action":
			action = kv.Value
		case "addr":
			addr = kv.Value
		case "size":
			size = kv.Value
		case "stream":
			stream = kv.Value
		case "time_us":
			time = kv.Value
		}
	}
	if action == (absent{}) {
		return nil, atPath(name, path(), "has no action")
	}
	act, ok := action.(string)
	if !ok {
		return nil, atPath(name, path(), "action is %s, want a str", typeName(action))
	}
	e := &snapEvent{dev: dev, idx: i}
	switch act {
	case "alloc":
	case "free_requested":
		e.free = true
	default:
		return nil, nil // free_completed, segment_*, snapshot, oom, ...
	}
	var err error
	field := func(key string, v any) uint64 {
		if err != nil {
			return 0
		}
		if v == (absent{}) {
			err = atPath(name, path(), "%s entry has no %s", act, key)
			return 0
		}
		x, ok := toUint64(v)
		if !ok && key == "stream" {
			var s int64
			if s, ok = toInt64(v); ok {
				x = uint64(s) // a negative stream id keeps its bits
			}
		}
		if !ok {
			err = atPath(name, path(), "%s is %s, want a non-negative integer", key, describe(v))
		}
		return x
	}
	e.addr = field("addr", addr)
	if !e.free {
		e.size = field("size", size)
		e.stream = field("stream", stream)
	}
	if err != nil {
		return nil, err
	}
	e.time, e.hasTime = toInt64(time)
	return e, nil
}

// absent marks a key missing from an entry (nil is Python's None).
type absent struct{}

// dictGet returns the value of the last entry of d whose key is the string
// key (a Python dict keeps the last of duplicate keys).
func dictGet(d *types.Dict, key string) (any, bool) {
	for i := len(*d) - 1; i >= 0; i-- {
		if k, ok := (*d)[i].Key.(string); ok && k == key {
			return (*d)[i].Value, true
		}
	}
	return nil, false
}

func toUint64(v any) (uint64, bool) {
	switch x := v.(type) {
	case int:
		return uint64(x), x >= 0
	case *big.Int:
		if x.Sign() >= 0 && x.IsUint64() {
			return x.Uint64(), true
		}
	}
	return 0, false
}

func toInt64(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case *big.Int:
		if x.IsInt64() {
			return x.Int64(), true
		}
	}
	return 0, false
}

// typeName names the Python type of a decoded value.
func typeName(v any) string {
	switch v.(type) {
	case nil:
		return "None"
	case *types.Dict:
		return "a dict"
	case *types.List:
		return "a list"
	case *types.Tuple:
		return "a tuple"
	case string:
		return "a str"
	case []byte:
		return "bytes"
	case int, *big.Int:
		return "an int"
	case float64:
		return "a float"
	case bool:
		return "a bool"
	}
	return fmt.Sprintf("%T", v)
}

// describe is typeName, with the value for a negative or huge integer.
func describe(v any) string {
	switch x := v.(type) {
	case int:
		return fmt.Sprintf("%d", x)
	case *big.Int:
		s := x.String()
		if len(s) > 30 {
			s = s[:30] + "..."
		}
		return strings.TrimSpace(s)
	}
	return typeName(v)
}
