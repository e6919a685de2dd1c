package pool

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/tlsf"
)

// Recorded streams.
//
// RecordStream is PyTorch's Tensor.record_stream (and its caching
// allocator's recordStream): a block allocated for one stream is also used
// by work on others. When it is freed, the pool records an event on the
// freeing stream and on every recorded stream (cuEventRecord, one each),
// and the block stays pending, reusable by no stream, until all of those
// events have completed; then it goes back to the index. The events are
// polled where pending stream-ordered frees are (streams.go): when an
// index search fails, every pollInterval such frees, and on the
// out-of-memory path, Trim and Close, which wait for them.
//
// A recorded stream that is destroyed by the time of the free (the event
// cannot be recorded: an invalid handle) is skipped: see "Destroyed
// streams" in streams.go.

// heldBlock is a freed block awaiting the events of its streams.
type heldBlock struct {
	addr uint64
	evs  []device.Event
}

// RecordStream marks live allocation ptr as used by work on stream s as
// well as on the stream it is freed on: its memory is reused only after
// the work queued on s before the free has completed. Recording a stream
// twice, or the stream of the later free, changes nothing. In a
// passthrough pool, the free synchronizes s before cuMemFree. Safe for
// concurrent use; takes the pool's lock.
//
// Errors: ErrUnknownPointer (not a live allocation of this pool: foreign,
// freed, or inside an allocation; a freed pointer may match ErrDoubleFree
// too), ErrClosed. Nothing changes on error.
func (p *Pool) RecordStream(ptr uintptr, s device.Stream) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	if p.pt != nil {
		if _, ok := p.pt.live[ptr]; !ok {
			return fmt.Errorf("%w: %#x is not a live allocation", ErrUnknownPointer, ptr)
		}
		p.ss.recordUse(uint64(ptr), s)
		return nil
	}
	if ptr%indexGranularity != 0 {
		return fmt.Errorf("%w: %#x is not %d-byte aligned", ErrUnknownPointer, ptr, indexGranularity)
	}
	b, err := p.x.Lookup(uint64(ptr))
	if err != nil {
		return p.translate(uint64(ptr), err)
	}
	switch p.state(b.ID) {
	case stateLive:
	case stateCached:
		// Handed out by a per-P cache, whose lock-free free knows nothing
		// of recorded streams: take it from its owner's table and count it
		// live in the pool's own counters, as freeBlock does, so that its
		// free comes here under the lock.
		// The pool cannot become empty here: the block stays live, in the
		// pool's own count, and its free under the lock looks for a
		// start-over (afterLockedFree), as for any block of the pool's.
		if ok, _ := p.cache.takeLive(b); !ok {
			return fmt.Errorf("%w: %#x is not a live allocation", ErrUnknownPointer, ptr)
		}
		p.uncache(b)
	default:
		return fmt.Errorf("%w: %#x is not a live allocation", ErrUnknownPointer, ptr)
	}
	p.ss.recordUse(b.Addr, s)
	return nil
}

// recordUse adds s to the streams using the live block at addr.
func (ss *streamSet) recordUse(addr uint64, s device.Stream) {
	if !slices.Contains(ss.uses[addr], s) {
		ss.uses[addr] = append(ss.uses[addr], s)
		ss.onChange()
	}
}

// holdForUses makes block b, freed on stream s and no longer counted
// anywhere, pending until events recorded now on s and on its recorded
// streams complete. It reports false, doing nothing, when b has no
// recorded stream other than s. On error nothing changed. Pool lock held.
func (p *Pool) holdForUses(b tlsf.Block, s device.Stream) (bool, error) {
	uses, ok := p.ss.uses[b.Addr]
	if !ok {
		return false, nil
	}
	if len(uses) == 1 && uses[0] == s {
		delete(p.ss.uses, b.Addr)
		p.ss.onChange()
		return false, nil
	}
	if !slices.Contains(uses, s) {
		uses = append(slices.Clip(uses), s)
	}
	evs, err := p.ss.recordOn(uses)
	if err != nil {
		return false, err
	}
	delete(p.ss.uses, b.Addr)
	p.ss.onChange()
	p.ss.held = append(p.ss.held, heldBlock{addr: b.Addr, evs: evs})
	p.pend(b)
	p.ss.frees++
	if p.ss.frees >= pollInterval {
		_ = p.pollPending(false)
	}
	return true, nil
}

// recordOn records an event on each stream, skipping destroyed ones. On
// error it records none (the events made go back to the spares).
func (ss *streamSet) recordOn(streams []device.Stream) ([]device.Event, error) {
	evs := make([]device.Event, 0, len(streams))
	for _, s := range streams {
		ev, err := ss.event()
		if err == nil {
			if err = ss.dev.EventRecord(ev, s); err == nil {
				evs = append(evs, ev)
				continue
			}
			ss.spare = append(ss.spare, ev)
			if streamGone(err) {
				continue
			}
		}
		ss.spare = append(ss.spare, evs...)
		return nil, fmt.Errorf("pool: recording the free's event on stream %#x: %w", uintptr(s), err)
	}
	return evs, nil
}

// pollHeld hands held blocks whose events all completed to reclaim; with
// wait, it waits for them. It returns the first device error; blocks it
// could not finish stay held.
func (ss *streamSet) pollHeld(wait bool, reclaim func(addr uint64)) error {
	var errs []error
	kept := ss.held[:0]
	for _, h := range ss.held {
		done := true
		for len(h.evs) > 0 {
			ok, err := ss.eventDone(h.evs[0], wait)
			if err != nil {
				errs = append(errs, err)
			}
			if !ok {
				done = false
				break
			}
			ss.spare = append(ss.spare, h.evs[0])
			h.evs = h.evs[1:]
		}
		if done {
			reclaim(h.addr)
		} else {
			kept = append(kept, h)
		}
	}
	clear(ss.held[len(kept):])
	ss.held = kept
	return errors.Join(errs...)
}

// polls reports whether anything awaits an event: pollPending has work.
func (ss *streamSet) polls() bool {
	return ss.multi || len(ss.held) > 0 || len(ss.orphaned) > 0
}

// syncUses synchronizes the streams recorded for the live passthrough
// allocation ptr before its cuMemFree (which itself waits only for the
// freeing stream's work when the caller synchronized it). Destroyed
// streams are skipped. On error nothing changed.
func (p *Pool) syncUses(ptr uintptr) error {
	for _, s := range p.ss.uses[uint64(ptr)] {
		if err := p.dev.StreamSynchronize(s); err != nil && !streamGone(err) {
			return fmt.Errorf("pool: passthrough free of %#x: synchronizing recorded stream %#x: %w", ptr, uintptr(s), err)
		}
	}
	return nil
}
