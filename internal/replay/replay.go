// Package replay drives allocation traces through allocators and measures
// the outcome: peak live bytes, failed allocations, time per operation
// (cold, and the median and minimum of several warm replays), and the
// smallest memory cap under which a trace replays without a failure
// (found by bisection).
//
// # Compiled traces
//
// A trace names its blocks by ID. Before anything is timed, Compile turns
// the IDs into dense slots (a slot is reused once its block is freed), so
// the replay loop indexes a slice where a naive loop would look up a Go
// map per operation: on the shared traces the map cost about 40% of the
// pool's warm figure. The loop then makes one interface call per
// operation and nothing else; a failed allocation is recorded and its
// later free skipped, so a replay under a tight cap runs to the end.
//
// # Warm figures
//
// One timed replay is noise on a shared machine (runs differ 2×): Warm
// replays a compiled trace n times on the same allocator (freeing what
// each leaves live) and reports the median and the minimum ns per
// operation. tlsf-stress and bench both take their figures from it,
// after WarmUp, which replays untimed until the process has spent
// WarmUpTime in such replays: timed replays then find the CPU as a
// long-running program would, not as the process start left it.
package replay

import (
	"cmp"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/gpumem/tlsf/internal/trace"
)

// Allocator is what a replay drives: allocate size bytes on a stream, and
// free a pointer on a stream, given the size its allocation asked for (as
// PyTorch's pluggable allocator's free is). Stream values are the
// trace's.
type Allocator interface {
	Alloc(size, stream uint64) (uintptr, error)
	Free(ptr uintptr, size, stream uint64) error
}

// Result is the outcome of one replay.
type Result struct {
	Ops      int           // operations performed (failed allocations and their frees excluded)
	Failed   int           // allocations that returned an error
	FirstErr error         // the first allocation error
	PeakLive uint64        // peak of the bytes of live blocks, as the trace sizes them
	Elapsed  time.Duration // wall time of the replay loop
	// Left holds the blocks the trace leaves live (it never frees them),
	// for FreeLeft.
	Left []Left
}

// Left is a block a replay left live: its pointer, the size its
// allocation asked for, and its trace stream.
type Left struct {
	Ptr    uintptr
	Size   uint64
	Stream uint64
}

// FreeLeft frees the blocks a replay left live, so that the allocator can
// replay the trace again from the same state (a warm replay).
func (r *Result) FreeLeft(a Allocator) error {
	for _, l := range r.Left {
		if err := a.Free(l.Ptr, l.Size, l.Stream); err != nil {
			return fmt.Errorf("replay: freeing a block left live: %w", err)
		}
	}
	r.Left = nil
	return nil
}

// NsPerOp is the wall time per operation in nanoseconds.
func (r Result) NsPerOp() float64 {
	if r.Ops == 0 {
		return 0
	}
	return float64(r.Elapsed.Nanoseconds()) / float64(r.Ops)
}

// Compiled is a trace with its block IDs turned into dense slots: the
// form the replay loop runs. It is read-only once made and may be
// replayed by several goroutines at once.
type Compiled struct {
	Name  string
	Ops   []COp
	Slots int // slots in use at most: the trace's peak of live blocks
	// last is, by slot, the size and stream of the last allocation into
	// it: those of a block left live at the end.
	last []COp
}

// COp is one compiled operation: an allocation of Size bytes on Stream
// into Slot, or the free of the block in Slot (Size and Stream repeat the
// allocation's).
type COp struct {
	Size   uint64
	Stream uint64
	Slot   int32
	Free   bool
}

// Compile turns t's block IDs into dense slots. A free of an ID that is
// not live (a trace that fails Check) is dropped.
func Compile(t *trace.Trace) *Compiled {
	c := &Compiled{Name: t.Name, Ops: make([]COp, 0, len(t.Ops))}
	slot := make(map[uint64]int32, 1024)
	var spare []int32
	for _, op := range t.Ops {
		if !op.Free {
			var s int32
			if k := len(spare); k > 0 {
				s, spare = spare[k-1], spare[:k-1]
			} else {
				s = int32(c.Slots)
				c.Slots++
			}
			slot[op.ID] = s
			cop := COp{Size: op.Size, Stream: op.Stream, Slot: s}
			if int(s) == len(c.last) {
				c.last = append(c.last, cop)
			}
			c.last[s] = cop
			c.Ops = append(c.Ops, cop)
			continue
		}
		s, ok := slot[op.ID]
		if !ok {
			continue
		}
		delete(slot, op.ID)
		spare = append(spare, s)
		c.Ops = append(c.Ops, COp{Size: op.Size, Stream: op.Stream, Slot: s, Free: true})
	}
	return c
}

// Run replays t through a. A free that fails is an error (the trace or the
// allocator is broken); allocation failures are counted. The trace is
// compiled first, outside the timed loop; callers that replay a trace
// more than once compile it once and call Compiled.Run.
func Run(t *trace.Trace, a Allocator) (Result, error) {
	return Compile(t).Run(a)
}

// RunSampled is Run with sampling: see Compiled.RunSampled.
func RunSampled(t *trace.Trace, a Allocator, every int, sample func(op int, live uint64) error) (Result, error) {
	return Compile(t).RunSampled(a, every, sample)
}

// Run replays c through a: see the package comment.
func (c *Compiled) Run(a Allocator) (Result, error) {
	return c.RunSampled(a, 0, nil)
}

// RunSampled is Run that also calls sample before every every-th
// operation and after the last (every 0: never), with the index of the
// next operation and the live bytes at that point; an error from sample
// ends the replay. Sampling time counts in Elapsed.
func (c *Compiled) RunSampled(a Allocator, every int, sample func(op int, live uint64) error) (Result, error) {
	ptrs := make([]uintptr, c.Slots)
	live := make([]bool, c.Slots)
	var res Result
	var cur uint64
	var err error
	start := time.Now()
	if every <= 0 {
		err = c.loop(a, ptrs, live, &res, &cur)
	} else {
		for i := 0; i < len(c.Ops) && err == nil; i += every {
			if err = sample(i, cur); err != nil {
				break
			}
			err = c.loopRange(a, i, min(i+every, len(c.Ops)), ptrs, live, &res, &cur)
		}
		if err == nil {
			err = sample(len(c.Ops), cur)
		}
	}
	res.Elapsed = time.Since(start)
	if err != nil {
		return res, err
	}
	for s, l := range live {
		if l {
			res.Left = append(res.Left, Left{Ptr: ptrs[s], Size: c.last[s].Size, Stream: c.last[s].Stream})
		}
	}
	slices.SortFunc(res.Left, func(x, y Left) int { return cmp.Compare(x.Ptr, y.Ptr) })
	return res, nil
}

// loop is the timed loop over every operation.
func (c *Compiled) loop(a Allocator, ptrs []uintptr, live []bool, res *Result, cur *uint64) error {
	return c.loopRange(a, 0, len(c.Ops), ptrs, live, res, cur)
}

// loopRange replays operations [from, to).
func (c *Compiled) loopRange(a Allocator, from, to int, ptrs []uintptr, live []bool, res *Result, cur *uint64) error {
	ops := c.Ops[from:to]
	for i := range ops {
		op := &ops[i]
		s := op.Slot
		if !op.Free {
			ptr, err := a.Alloc(op.Size, op.Stream)
			if err != nil {
				if res.Failed == 0 {
					res.FirstErr = err
				}
				res.Failed++
				continue
			}
			ptrs[s], live[s] = ptr, true
			*cur += op.Size
			res.PeakLive = max(res.PeakLive, *cur)
			res.Ops++
			continue
		}
		if !live[s] {
			continue // its allocation failed
		}
		live[s] = false
		if err := a.Free(ptrs[s], op.Size, op.Stream); err != nil {
			return fmt.Errorf("replay %s: op %d: free of slot %d: %w", c.Name, from+i, s, err)
		}
		*cur -= op.Size
		res.Ops++
	}
	return nil
}

// WarmResult is the outcome of Warm: n replays on a warm allocator.
type WarmResult struct {
	// Runs holds each replay's ns per operation, in the order run.
	Runs []float64
	// MedianNsPerOp and MinNsPerOp are the median and the minimum of Runs.
	MedianNsPerOp, MinNsPerOp float64
	// Last is the last replay's result (its Left already freed).
	Last Result
	// Failed is the failed allocations over all replays.
	Failed int
}

// MinWarmRuns is the fewest warm replays a figure should come from: the
// median of 10 is stable to a few percent on a shared machine where single
// runs differ 2×.
const MinWarmRuns = 10

// WarmUpTime is the time a process spends in untimed replays (WarmUp)
// before its first timed warm replay. Measured on the simulated H200
// (development VM, GOMAXPROCS=1, pinned to one core, 2026-12-03,
// tlsf-stress replay of lstm, resnet50 and tdnn in one process, two runs
// each): the medians of ten warm replays were 59–61, 72–74 and 54–62 ns
// per operation with 1 ms of warm-up, 66–67, 76 and 40–47 with 100 ms,
// 58–73, 50–51 and 40–52 with 300 ms, and 44, 50–51 and 40 with 1 s,
// where the minima were 42–43, 49–68 and 39–42 throughout: for about the
// first second of a process, replays ran up to 1.7× their later time,
// and figures timed then were the process start's, not the allocator's.
const WarmUpTime = time.Second

// warmedUp is the wall time this process has spent in WarmUp's replays
// (each replay's FreeLeft and any preemption included), summed over all
// callers: with several at once, each stops sooner.
var warmedUp atomic.Int64

// WarmUp replays c through a, untimed, freeing what each replay leaves
// live: once, and then until this process has spent d in WarmUp's
// replays in all (so the first call of a process takes about d, later
// ones about one replay each). It returns the number of replays. Safe
// for concurrent use with other allocators. Errors: a replay's (Run,
// FreeLeft).
func (c *Compiled) WarmUp(a Allocator, d time.Duration) (int, error) {
	n := 0
	for n == 0 || time.Duration(warmedUp.Load()) < d {
		start := time.Now()
		r, err := c.Run(a)
		if err == nil {
			err = r.FreeLeft(a)
		}
		warmedUp.Add(int64(time.Since(start)))
		if err != nil {
			return n, err
		}
		n++
	}
	return n, nil
}

// Warm replays c n times through a (at least once), freeing the blocks
// each replay leaves live before the next, and reports the median and the
// minimum of the replays' ns per operation. The caller warms a first
// (WarmUp) if cold-start cost is not to count.
func (c *Compiled) Warm(a Allocator, n int) (WarmResult, error) {
	var w WarmResult
	for i := 0; i < max(n, 1); i++ {
		r, err := c.Run(a)
		if err != nil {
			return w, err
		}
		w.Failed += r.Failed
		w.Runs = append(w.Runs, r.NsPerOp())
		if err := r.FreeLeft(a); err != nil {
			return w, err
		}
		w.Last = r
	}
	w.MedianNsPerOp, w.MinNsPerOp = Median(w.Runs), slices.Min(w.Runs)
	return w, nil
}

// Median returns the median of xs (the mean of the middle two for an even
// count; 0 for none). xs is not modified.
func Median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// MinCap finds by bisection the smallest cap in bytes, a multiple of
// step, for which replay(cap) reports no failed allocation, searching
// from [lo, hi]; while replay(hi) fails, hi is raised by half (at most 8
// times). It returns the cap and the number of replays it ran. Bisection
// assumes that a replay that succeeds under a cap succeeds under any
// larger one, which holds closely but not exactly for a real allocator:
// the result is the boundary bisection finds.
//
// The result lies in (lo, hi]: lo itself is taken as failing (a cap of
// peak live bytes leaves no room for anything but the live blocks). step
// must be positive.
func MinCap(lo, hi, step uint64, replay func(cap uint64) (ok bool, err error)) (uint64, int, error) {
	if step == 0 {
		return 0, 0, fmt.Errorf("replay: MinCap with a step of 0")
	}
	lo, hi = lo/step*step, (hi+step-1)/step*step
	runs := 0
	for {
		ok, err := replay(hi)
		runs++
		if err != nil {
			return 0, runs, err
		}
		if ok {
			break
		}
		if runs > 8 {
			return 0, runs, fmt.Errorf("replay: fails even under a cap of %d bytes", hi)
		}
		lo, hi = hi, (hi+hi/2+step-1)/step*step
	}
	for hi-lo > step {
		mid := lo + (hi-lo)/2/step*step
		ok, err := replay(mid)
		runs++
		if err != nil {
			return 0, runs, err
		}
		if ok {
			hi = mid
		} else {
			lo = mid
		}
	}
	return hi, runs, nil
}
