package replay

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/gpumem/tlsf/internal/trace"
)

// bump is an allocator that never reuses an address and fails requests
// above limit bytes: enough to see what the replay loop does. A free must
// come with its allocation's size and stream.
type bump struct {
	next  uintptr
	limit uint64
	live  map[uintptr][2]uint64 // size, stream
	frees int
}

var errBig = errors.New("too big")

func (b *bump) Alloc(size, stream uint64) (uintptr, error) {
	if b.limit > 0 && size > b.limit {
		return 0, errBig
	}
	b.next += 256
	if b.live == nil {
		b.live = map[uintptr][2]uint64{}
	}
	b.live[b.next] = [2]uint64{size, stream}
	return b.next, nil
}

func (b *bump) Free(ptr uintptr, size, stream uint64) error {
	if s, ok := b.live[ptr]; !ok || s != [2]uint64{size, stream} {
		return fmt.Errorf("bad free of %#x: %d bytes on stream %d, allocated as %v", ptr, size, stream, s)
	}
	delete(b.live, ptr)
	b.frees++
	return nil
}

func tiny() *trace.Trace {
	return &trace.Trace{Name: "tiny", Ops: []trace.Op{
		{ID: 7, Size: 100},
		{ID: 9, Size: 5000, Stream: 3},
		{ID: 7, Size: 100, Free: true},
		{ID: 11, Size: 300},
		{ID: 9, Size: 5000, Stream: 3, Free: true},
		{ID: 12, Size: 200, Stream: 2},
	}}
}

func TestCompileReusesSlots(t *testing.T) {
	c := Compile(tiny())
	if c.Slots != 2 {
		t.Fatalf("slots = %d, want 2 (at most two blocks live at once)", c.Slots)
	}
	if c.Ops[3].Slot != c.Ops[0].Slot {
		t.Errorf("block 11 got slot %d, want the freed slot %d", c.Ops[3].Slot, c.Ops[0].Slot)
	}
}

func TestRunCountsAndLeavesLive(t *testing.T) {
	b := &bump{}
	r, err := Run(tiny(), b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Ops != 6 || r.Failed != 0 || r.PeakLive != 5300 {
		t.Fatalf("ops %d failed %d peak %d, want 6 0 5300", r.Ops, r.Failed, r.PeakLive)
	}
	if len(r.Left) != 2 || r.Left[0] != (Left{Ptr: r.Left[0].Ptr, Size: 300}) || r.Left[1] != (Left{Ptr: r.Left[1].Ptr, Size: 200, Stream: 2}) {
		t.Fatalf("left %+v, want blocks 11 (300 bytes, stream 0) and 12 (200 bytes, stream 2)", r.Left)
	}
	if err := r.FreeLeft(b); err != nil || len(b.live) != 0 {
		t.Fatalf("FreeLeft: %v, %d still live", err, len(b.live))
	}
}

func TestRunSkipsFreeOfFailedAlloc(t *testing.T) {
	b := &bump{limit: 1000}
	r, err := Run(tiny(), b)
	if err != nil {
		t.Fatal(err)
	}
	if r.Failed != 1 || !errors.Is(r.FirstErr, errBig) || r.Ops != 4 {
		t.Fatalf("failed %d (%v), ops %d; want 1 failure and 4 ops", r.Failed, r.FirstErr, r.Ops)
	}
}

func TestRunSampledSamplesEveryK(t *testing.T) {
	var at []int
	_, err := RunSampled(tiny(), &bump{}, 4, func(op int, live uint64) error {
		at = append(at, op)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(at) != 3 || at[0] != 0 || at[1] != 4 || at[2] != 6 {
		t.Fatalf("samples at %v, want [0 4 6]", at)
	}
}

func TestWarmMedianAndMin(t *testing.T) {
	b := &bump{}
	w, err := Compile(tiny()).Warm(b, MinWarmRuns)
	if err != nil {
		t.Fatal(err)
	}
	if len(w.Runs) != MinWarmRuns || w.MinNsPerOp > w.MedianNsPerOp || len(b.live) != 0 {
		t.Fatalf("runs %d min %v median %v live %d", len(w.Runs), w.MinNsPerOp, w.MedianNsPerOp, len(b.live))
	}
	if b.frees != 4*MinWarmRuns {
		t.Fatalf("%d frees, want %d", b.frees, 4*MinWarmRuns)
	}
}

func TestWarmUpReplaysAtLeastOnceAndFreesWhatIsLeft(t *testing.T) {
	b := &bump{}
	n, err := Compile(tiny()).WarmUp(b, 0)
	if err != nil || n != 1 || len(b.live) != 0 || b.frees != 4 {
		t.Fatalf("n %d err %v live %d frees %d, want one replay, every block freed", n, err, len(b.live), b.frees)
	}
	b = &bump{}
	d := time.Duration(warmedUp.Load()) + 50*time.Millisecond
	n, err = Compile(tiny()).WarmUp(b, d)
	if err != nil || n < 2 || len(b.live) != 0 || b.frees != 4*n || time.Duration(warmedUp.Load()) < d {
		t.Fatalf("n %d err %v live %d frees %d", n, err, len(b.live), b.frees)
	}
	// The process is warm now: one replay.
	if n, err = Compile(tiny()).WarmUp(&bump{}, d); err != nil || n != 1 {
		t.Fatalf("n %d err %v once warm, want one replay", n, err)
	}
	// A replay whose free fails ends the warm-up with its error.
	bad := &trace.Trace{Name: "bad", Ops: []trace.Op{{ID: 1, Size: 100, Stream: 1}, {ID: 1, Size: 100, Free: true}}}
	if _, err := Compile(bad).WarmUp(&bump{}, time.Second); err == nil {
		t.Fatal("a failing free did not end the warm-up")
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := Median(c.in); got != c.want {
			t.Errorf("Median(%v) = %v, want %v", c.in, got, c.want)
		}
	}
}
