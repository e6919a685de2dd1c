// Package replay drives allocation traces through allocators and measures
// the outcome: peak live bytes, failed allocations, time per operation,
// and the smallest memory cap under which a trace replays without a
// failure (found by bisection).
//
// A trace's blocks are named by ID; the replayer maps IDs to the pointers
// the allocator returned. An allocation that fails is recorded and its
// later free is skipped, so a replay under a tight cap runs to the end.
package replay

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/gpumem/tlsf/internal/trace"
)

// Allocator is what a replay drives: allocate size bytes on a stream, and
// free a pointer on a stream. Stream values are the trace's.
type Allocator interface {
	Alloc(size, stream uint64) (uintptr, error)
	Free(ptr uintptr, stream uint64) error
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

// Left is a block a replay left live: its pointer and trace stream.
type Left struct {
	Ptr    uintptr
	Stream uint64
}

// FreeLeft frees the blocks a replay left live, so that the allocator can
// replay the trace again from the same state (a warm replay).
func (r *Result) FreeLeft(a Allocator) error {
	for _, l := range r.Left {
		if err := a.Free(l.Ptr, l.Stream); err != nil {
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

// Run replays t through a. A free that fails is an error (the trace or the
// allocator is broken); allocation failures are counted.
func Run(t *trace.Trace, a Allocator) (Result, error) {
	return RunSampled(t, a, 0, nil)
}

// RunSampled is Run that also calls sample before every every-th
// operation and after the last (every 0: never), with the index of the
// next operation and the live bytes at that point; an error from sample
// ends the replay. Sampling time counts in Elapsed.
func RunSampled(t *trace.Trace, a Allocator, every int, sample func(op int, live uint64) error) (Result, error) {
	type block struct {
		ptr    uintptr
		stream uint64
	}
	live := make(map[uint64]block, 1024)
	var res Result
	var cur uint64
	start := time.Now()
	for i, op := range t.Ops {
		if every > 0 && i%every == 0 {
			if err := sample(i, cur); err != nil {
				res.Elapsed = time.Since(start)
				return res, err
			}
		}
		if !op.Free {
			ptr, err := a.Alloc(op.Size, op.Stream)
			if err != nil {
				if res.Failed == 0 {
					res.FirstErr = err
				}
				res.Failed++
				continue
			}
			live[op.ID] = block{ptr, op.Stream}
			cur += op.Size
			res.PeakLive = max(res.PeakLive, cur)
			res.Ops++
			continue
		}
		b, ok := live[op.ID]
		if !ok {
			continue // its allocation failed
		}
		delete(live, op.ID)
		if err := a.Free(b.ptr, op.Stream); err != nil {
			return res, fmt.Errorf("replay %s: op %d: free of block %d: %w", t.Name, i, op.ID, err)
		}
		cur -= op.Size
		res.Ops++
	}
	if every > 0 {
		if err := sample(len(t.Ops), cur); err != nil {
			return res, err
		}
	}
	res.Elapsed = time.Since(start)
	for _, b := range live {
		res.Left = append(res.Left, Left{Ptr: b.ptr, Stream: b.stream})
	}
	slices.SortFunc(res.Left, func(x, y Left) int { return cmp.Compare(x.Ptr, y.Ptr) })
	return res, nil
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
