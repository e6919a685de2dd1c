package trace

import (
	"errors"
	"fmt"
	"math"
)

// Errors returned by this package. Test them with errors.Is.
var (
	// ErrMalformed is matched by every error that reports a defect in a
	// parsed input: bad syntax, a truncated or corrupt gzip stream, a pickle
	// of the wrong shape, or a text trace that breaks the alloc/free rules.
	// The concrete error is a *ParseError, which says where.
	ErrMalformed = errors.New("malformed trace")

	// ErrTooLarge is returned when an input decompresses to more than
	// MaxInputBytes (MaxPickleBytes for a pickle), or when a pickle would
	// need more memory to decode than its size justifies (see doc.go).
	ErrTooLarge = errors.New("trace input too large")

	// ErrInvalid is returned by Trace.Check and WriteText for a Trace value
	// that breaks an invariant (a free of a block that is not live, a zero
	// size, a reused live ID, a comment holding a line break).
	ErrInvalid = errors.New("invalid trace")

	// ErrEmpty is returned by NewSizeSampler for a trace with no allocation.
	ErrEmpty = errors.New("trace has no allocations")
)

// Format names the encoding a trace was parsed from.
type Format uint8

// The formats Parse recognises; see doc.go for their grammars.
const (
	FormatText    Format = iota + 1 // this project's text format
	FormatPyTorch                   // pickle of torch.cuda.memory._snapshot()
	FormatRMM                       // RMM logging_resource_adaptor CSV log
)

// String returns "text", "pytorch-snapshot" or "rmm-csv".
func (f Format) String() string {
	switch f {
	case FormatText:
		return "text"
	case FormatPyTorch:
		return "pytorch-snapshot"
	case FormatRMM:
		return "rmm-csv"
	}
	return fmt.Sprintf("Format(%d)", uint8(f))
}

// Op is one event of a trace: the allocation of a block or its release.
//
// For an allocation, ID names the new block, Size is its length in bytes
// (> 0) and Stream the stream it was requested on. For a free, ID names a
// live block and Size and Stream repeat the values of its allocation, so a
// replayer can call a sized free (RMM's deallocate, for one) without a map.
type Op struct {
	Free   bool   // false: allocate; true: free
	ID     uint64 // block identity, unique among live blocks
	Size   uint64 // bytes
	Stream uint64 // stream identity as recorded (PyTorch stream id, CUDA stream handle)
}

// liveBlock is what the snapshot and CSV parsers remember of a live block,
// by address.
type liveBlock struct {
	id, size, stream uint64
}

// Trace is an ordered sequence of allocations and frees recorded from one
// process, with where it came from. A Trace returned by Parse satisfies
// Check. Blocks still live at the end are never freed.
//
// A Trace is a plain value: it is safe to read from many goroutines, and
// its methods do not modify it.
type Trace struct {
	// Name is the short name of the trace: the base name of the file with
	// known extensions (.gz, .trace, .snapshot, .pickle, .pkl, .csv, .txt,
	// .log) removed, e.g. "lstm" for "data/lstm.snapshot.pickle.gz".
	Name string
	// Source is the name passed to Parse (usually a path).
	Source string
	// Format is the encoding the trace was parsed from.
	Format Format
	// Comments holds the text of the '#' lines of a text trace, without the
	// '#' and surrounding blanks, in order. WriteText writes them back.
	Comments []string
	// Ops is the event sequence.
	Ops []Op
	// Skipped counts pickle and CSV records that were ignored because the
	// recording began mid-run or they allocate nothing: frees of an address
	// with no live allocation, and allocations of zero bytes. Always 0 for
	// text traces, which are strict.
	Skipped int
	// Failures counts RMM "allocate failure" rows (CSV only); they allocate
	// nothing and are not in Ops.
	Failures int
}

// Allocs returns the number of allocations in t.Ops.
func (t *Trace) Allocs() int {
	n := 0
	for i := range t.Ops {
		if !t.Ops[i].Free {
			n++
		}
	}
	return n
}

// Frees returns the number of frees in t.Ops.
func (t *Trace) Frees() int { return len(t.Ops) - t.Allocs() }

// PeakLive returns the largest total size in bytes of the blocks live at
// once over the trace: the physical lower bound on the memory any allocator
// needs to replay it. It trusts the Size of free ops; for a Trace that
// fails Check the result is meaningless (but it does not wrap around).
func (t *Trace) PeakLive() uint64 {
	var live, peak uint64
	for _, op := range t.Ops {
		if op.Free {
			live -= min(live, op.Size)
			continue
		}
		live += min(op.Size, math.MaxUint64-live) // saturates: sizes may sum past 2^64
		peak = max(peak, live)
	}
	return peak
}

// Sizes returns the sizes in bytes of the allocations, in trace order, in a
// new slice.
func (t *Trace) Sizes() []uint64 {
	s := make([]uint64, 0, t.Allocs())
	for _, op := range t.Ops {
		if !op.Free {
			s = append(s, op.Size)
		}
	}
	return s
}

// Check verifies the invariants of t.Ops: every allocation has a nonzero
// size and an ID that is not live; every free names a live block and
// repeats its Size and Stream. It returns nil or an error wrapping
// ErrInvalid that names the first offending op by index. Check runs in
// O(len(t.Ops)) time and O(live blocks) memory.
func (t *Trace) Check() error {
	live := make(map[uint64]Op)
	for i, op := range t.Ops {
		if !op.Free {
			if op.Size == 0 {
				return fmt.Errorf("trace: op %d: allocation of ID %d has size 0: %w", i, op.ID, ErrInvalid)
			}
			if _, dup := live[op.ID]; dup {
				return fmt.Errorf("trace: op %d: allocation of ID %d, which is live: %w", i, op.ID, ErrInvalid)
			}
			live[op.ID] = op
			continue
		}
		a, ok := live[op.ID]
		if !ok {
			return fmt.Errorf("trace: op %d: free of ID %d, which is not live: %w", i, op.ID, ErrInvalid)
		}
		if a.Size != op.Size || a.Stream != op.Stream {
			return fmt.Errorf("trace: op %d: free of ID %d says size %d stream %d, allocation said %d and %d: %w",
				i, op.ID, op.Size, op.Stream, a.Size, a.Stream, ErrInvalid)
		}
		delete(live, op.ID)
	}
	return nil
}

// ParseError reports where an input is malformed. errors.Is(err,
// ErrMalformed) is true for every *ParseError.
type ParseError struct {
	File string // the name passed to Parse
	// Line is the 1-based line of a text or CSV input, or 0.
	Line int
	// Offset is the byte offset of a pickle defect (in the decompressed
	// pickle) or of a gzip defect (in the compressed stream), or -1 when
	// Line is used or the defect is in the shape of a decoded pickle, in
	// which case Msg names the element, like "device_traces[0][17]".
	Offset int64
	Msg    string // what is wrong
}

// Error formats the error as "trace: FILE:LINE: MSG", "trace: FILE: byte
// OFFSET: MSG" or "trace: FILE: MSG".
func (e *ParseError) Error() string {
	switch {
	case e.Line > 0:
		return fmt.Sprintf("trace: %s:%d: %s", e.File, e.Line, e.Msg)
	case e.Offset >= 0:
		return fmt.Sprintf("trace: %s: byte %d: %s", e.File, e.Offset, e.Msg)
	}
	return fmt.Sprintf("trace: %s: %s", e.File, e.Msg)
}

// Is reports whether target is ErrMalformed.
func (e *ParseError) Is(target error) bool { return target == ErrMalformed }

// atLine returns a *ParseError for line of file.
func atLine(file string, line int, format string, args ...any) *ParseError {
	return &ParseError{File: file, Line: line, Offset: -1, Msg: fmt.Sprintf(format, args...)}
}

// atByte returns a *ParseError for byte offset off of file.
func atByte(file string, off int64, format string, args ...any) *ParseError {
	return &ParseError{File: file, Offset: off, Msg: fmt.Sprintf(format, args...)}
}

// atPath returns a *ParseError for an element of a decoded pickle.
func atPath(file, path string, format string, args ...any) *ParseError {
	return &ParseError{File: file, Offset: -1, Msg: path + ": " + fmt.Sprintf(format, args...)}
}
