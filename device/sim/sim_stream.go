package sim

// Streams, events, held work and the happens-before order.
//
// Sim runs work the moment it is issued, unless it cannot: its stream is
// held (HoldStream), or it sits behind a StreamWaitEvent whose event's work
// has not run. Such work waits in its stream's queue, in order. Lifting a
// hold (ReleaseStream, or a synchronize that needs the held work) runs
// queues until nothing more can run; streams are visited in creation
// order, so the interleaving is deterministic.
//
// Order between streams is tracked with vector clocks (Lamport; Fidge and
// Mattern): every stream numbers its items, and a clock holds, per stream,
// how many of its items are known to come first. An item's clock is its
// stream's clock when it was issued; EventRecord captures the stream's
// clock, StreamWaitEvent folds it into the waiting stream's, and what the
// host has seen complete (StreamSynchronize, EventSynchronize, an
// EventQuery that says done) is folded into every item issued afterwards.
// Item J is ordered after item I exactly when J's clock counts I:
// J.clock[I.stream] >= I.seq.
//
// With that, Sim reports misuse as violations (Violations), not errors,
// because the driver would not refuse the call either; the GPU would
// compute garbage:
//   - memory freed or unmapped while queued work still writes it;
//   - a memset that runs while queued work on another stream, not
//     ordered after it, will write the same physical bytes (the queued
//     write lands later and clobbers it: the stream-ordered reuse bug);
//   - a host-synchronous memset or copy touching bytes queued work will
//     write.
// Work that already ran cannot be caught: tests hold streams to keep the
// window open.

import (
	"fmt"
	"slices"

	"github.com/gpumem/tlsf/device"
)

// simClock is a vector clock: entry i counts the items of the stream with
// index i known to come before.
type simClock []uint64

func (c simClock) at(i int) uint64 {
	if i < len(c) {
		return c[i]
	}
	return 0
}

func (c *simClock) set(i int, v uint64) {
	for len(*c) <= i {
		*c = append(*c, 0)
	}
	(*c)[i] = v
}

// join makes c the entry-wise maximum of c and o.
func (c *simClock) join(o simClock) {
	for i, v := range o {
		if v > c.at(i) {
			c.set(i, v)
		}
	}
}

// simStream is one stream; index 0 is the default stream.
type simStream struct {
	h         device.Stream
	idx       int  // index in vector clocks
	held      bool // HoldStream: nothing on it runs
	destroyed bool
	seq       uint64   // items issued so far
	clock     simClock // what the stream's next item comes after
	queue     []*simItem
}

// state describes why a stream's queued work waits, for messages.
func (st *simStream) state() string {
	if st.held {
		return "held"
	}
	return "waiting on an event"
}

type simItemKind uint8

const (
	simItemMemset simItemKind = iota // cuMemsetD32Async
	simItemRecord                    // cuEventRecord
	simItemWait                      // cuStreamWaitEvent on work not yet run
	simItemCopy                      // cuMemcpyDtoDAsync within this GPU's memory
)

// simItem is one piece of work issued on a stream.
type simItem struct {
	kind  simItemKind
	st    *simStream
	seq   uint64   // its number on st, from 1
	clock simClock // what it comes after (itself included)

	ptr   uintptr // simItemMemset, simItemCopy: the call's arguments (a copy's destination; words: its bytes)
	value uint32
	words uint64
	d8    bool      // simItemMemset: cuMemsetD8Async; value is the byte, words the bytes
	spans []simSpan // simItemMemset, simItemCopy: the physical bytes it writes
	src   []simSpan // simItemCopy: the physical bytes it reads
	from  uintptr   // simItemCopy: the source address

	rec *simRecord // simItemRecord: the record it completes; simItemWait: the one it waits for
}

func (it *simItem) ready() bool { return it.kind != simItemWait || it.rec.done }

func (it *simItem) String() string {
	if it.kind == simItemCopy {
		return fmt.Sprintf("cuMemcpyDtoDAsync(%#x, %#x, %d bytes) on stream %#x", it.ptr, it.from, it.words, uintptr(it.st.h))
	}
	if it.d8 {
		return fmt.Sprintf("cuMemsetD8Async(%#x, %#02x, %d bytes) on stream %#x", it.ptr, it.value, it.words, uintptr(it.st.h))
	}
	return fmt.Sprintf("cuMemsetD32Async(%#x, %#08x, %d words) on stream %#x", it.ptr, it.value, it.words, uintptr(it.st.h))
}

// simRecord is one EventRecord: done once the work before it has run.
type simRecord struct {
	st    *simStream
	seq   uint64
	clock simClock
	done  bool
}

// simEvent is an event; last is its latest record, nil if never recorded.
type simEvent struct {
	h    device.Event
	last *simRecord
}

func (s *Device) stream(c device.Call, h device.Stream) (*simStream, error) {
	st := s.streams[h]
	if st == nil || st.destroyed {
		return nil, simErr(c, device.ErrInvalidValue, "stream %#x is not a live stream of this process", uintptr(h))
	}
	return st, nil
}

func (s *Device) event(c device.Call, h device.Event) (*simEvent, error) {
	ev := s.events[h]
	if ev == nil {
		return nil, simErr(c, device.ErrInvalidValue, "event %#x is not a live event of this process", uintptr(h))
	}
	return ev, nil
}

// enqueue issues it on st: it runs now if nothing holds it back, else it
// joins st's queue.
func (s *Device) enqueue(st *simStream, it *simItem) {
	st.clock.join(s.host)
	st.seq++
	st.clock.set(st.idx, st.seq)
	it.st, it.seq, it.clock = st, st.seq, slices.Clone(st.clock)
	if it.kind == simItemRecord {
		it.rec.st, it.rec.seq, it.rec.clock = st, it.seq, it.clock
	}
	if len(st.queue) == 0 && !st.held && it.ready() {
		s.execute(it)
		return
	}
	st.queue = append(st.queue, it)
}

// execute runs it.
func (s *Device) execute(it *simItem) {
	switch it.kind {
	case simItemMemset:
		s.raceQueued(it)
		if it.d8 {
			s.writeBytes(it.spans, byte(it.value))
		} else {
			s.write(it.spans, it.value)
		}
	case simItemCopy:
		s.raceQueued(it)
		s.eachQueued(func(q *simItem) {
			if q.st != it.st && q.clock.at(it.st.idx) < it.seq && spansOverlap(it.src, q.spans) {
				s.violate("race: %s read memory while %s, %s and not ordered after it, will write it", it, q, q.st.state())
			}
		})
		if s.cfg.Shadow && allLive(it.spans) && allLive(it.src) {
			copySpans(it.spans, it.src)
		}
	case simItemRecord:
		it.rec.done = true
	}
}

// progress runs queued work until nothing more can run, then retires
// destroyed streams with empty queues.
func (s *Device) progress() {
	for moved := true; moved; {
		moved = false
		for _, st := range s.live {
			for !st.held && len(st.queue) > 0 && st.queue[0].ready() {
				it := st.queue[0]
				st.queue[0] = nil
				st.queue = st.queue[1:]
				s.execute(it)
				moved = true
			}
		}
	}
	s.live = slices.DeleteFunc(s.live, func(st *simStream) bool { return st.destroyed && len(st.queue) == 0 })
}

// complete runs st's work until done reports true, lifting the hold on st
// and on every stream whose work st's work waits for: what a synchronize
// does when the GPU catches up.
func (s *Device) complete(st *simStream, done func() bool) {
	for !done() {
		st.held = false
		s.progress()
		if done() {
			return
		}
		// st is not held, so its head is a wait for a record not yet done,
		// issued earlier on another stream: no cycles.
		rec := st.queue[0].rec
		s.complete(rec.st, func() bool { return rec.done })
	}
}

// simSide is the memory a queued item writes or reads, with the verb
// that says which.
type simSide struct {
	spans []simSpan
	verb  string
}

// sides returns what it writes and, for a copy, what it reads.
func (it *simItem) sides() [2]simSide {
	return [2]simSide{{it.spans, "writes"}, {it.src, "reads"}}
}

// raceQueued records a violation for every queued write on another
// stream, not ordered after it, that will write the memory it writes, or
// copy that will read it.
func (s *Device) raceQueued(it *simItem) {
	s.eachQueued(func(q *simItem) {
		if q.st == it.st || q.clock.at(it.st.idx) >= it.seq {
			return
		}
		if spansOverlap(it.spans, q.spans) {
			s.violate("race: %s ran while %s, %s and not ordered after it, will write the same memory", it, q, q.st.state())
		} else if spansOverlap(it.spans, q.src) {
			s.violate("race: %s wrote memory while %s, %s and not ordered after it, will read it", it, q, q.st.state())
		}
	})
}

// allLive reports whether every span is still reachable.
func allLive(spans []simSpan) bool {
	for i := range spans {
		if !spans[i].live() {
			return false
		}
	}
	return true
}

// eachQueued calls f for every queued memset or copy (the writes).
func (s *Device) eachQueued(f func(it *simItem)) {
	for _, st := range s.live {
		for _, it := range st.queue {
			if it.kind == simItemMemset || it.kind == simItemCopy {
				f(it)
			}
		}
	}
}

// spansOverlap reports whether a live span of a overlaps a live span of b.
func spansOverlap(a, b []simSpan) bool {
	for i := range a {
		if !a[i].live() {
			continue
		}
		for j := range b {
			if b[j].live() && a[i].overlaps(&b[j]) {
				return true
			}
		}
	}
	return false
}

// killPending records a violation for every queued memset with a live span
// that match selects (memory call c is about to free or unmap), and marks
// those spans dead: their writes will never land.
func (s *Device) killPending(c device.Call, what string, match func(sp *simSpan) bool) {
	s.eachQueued(func(it *simItem) {
		for _, side := range it.sides() {
			hit := false
			for i := range side.spans {
				sp := &side.spans[i]
				if sp.live() && match(sp) {
					if !hit {
						s.violate("%s: memory [%#x, +%d) %s while %s, %s, still %s it", c, sp.addr, sp.n, what, it, it.st.state(), side.verb)
					}
					hit = true
					sp.dead = true
				}
			}
		}
	})
}

// hostRace records a violation for every queued memset or copy that will
// write bytes the host-synchronous call c touches now, and, where c writes
// them (verb "wrote"), every queued copy that will read them.
func (s *Device) hostRace(c device.Call, spans []simSpan, verb string) {
	s.eachQueued(func(it *simItem) {
		if spansOverlap(spans, it.spans) {
			s.violate("race: %s %s [%#x, +%d) while %s, %s, will write it", c, verb, spans[0].addr, spanBytes(spans), it, it.st.state())
		} else if verb == "wrote" && spansOverlap(spans, it.src) {
			s.violate("race: %s %s [%#x, +%d) while %s, %s, will read it", c, verb, spans[0].addr, spanBytes(spans), it, it.st.state())
		}
	})
}

func spanBytes(spans []simSpan) uint64 {
	var n uint64
	for _, sp := range spans {
		n += sp.n
	}
	return n
}

func (s *Device) violate(format string, args ...any) {
	s.violations = append(s.violations, fmt.Sprintf(format, args...))
}

// StreamCreate creates a stream (cuStreamCreate, non-blocking). Handles are
// never reused. Stream 0, the default stream, always exists.
func (s *Device) StreamCreate() (h device.Stream, err error) {
	err = s.do(device.CallStreamCreate, func() (uint64, error) {
		s.nextStream++
		h = device.Stream(s.simTag(simTagStream, s.nextStream))
		st := &simStream{h: h, idx: int(s.nextStream)}
		s.streams[h] = st
		s.live = append(s.live, st)
		return 0, nil
	})
	return h, err
}

// StreamDestroy destroys stream h (cuStreamDestroy_v2). Work still queued
// on it (held, or waiting) stays queued and runs when it can, as the
// driver finishes it in the background; ReleaseStream still lifts a hold
// on it. Errors: the default stream, an unknown or destroyed stream is
// ErrInvalidValue.
func (s *Device) StreamDestroy(h device.Stream) error {
	const c = device.CallStreamDestroy
	return s.do(c, func() (uint64, error) {
		if h == 0 {
			return 0, simErr(c, device.ErrInvalidValue, "the default stream cannot be destroyed")
		}
		st, err := s.stream(c, h)
		if err != nil {
			return 0, err
		}
		st.destroyed = true
		s.progress()
		return 0, nil
	})
}

// StreamSynchronize completes all work issued on stream h
// (cuStreamSynchronize): it lifts a hold on h, and on the streams whose
// work h's work waits for, and runs that work. The async pool then
// returns memory beyond its release threshold (sim_async.go). Errors: an unknown or
// destroyed stream is ErrInvalidValue.
func (s *Device) StreamSynchronize(h device.Stream) error {
	const c = device.CallStreamSynchronize
	return s.do(c, func() (uint64, error) {
		st, err := s.stream(c, h)
		if err != nil {
			return 0, err
		}
		st.held = false
		s.complete(st, func() bool { return len(st.queue) == 0 })
		s.host.join(st.clock)
		s.asyncRelease(c, s.apool.threshold/s.cfg.Granularity*s.cfg.Granularity)
		return 0, nil
	})
}

// StreamWaitEvent makes work issued on stream sh from now on wait for the
// work before event eh's latest record (cuStreamWaitEvent). An event never
// recorded makes it a no-op. Errors: an unknown or destroyed stream or
// event is ErrInvalidValue.
func (s *Device) StreamWaitEvent(sh device.Stream, eh device.Event) error {
	const c = device.CallStreamWaitEvent
	return s.do(c, func() (uint64, error) {
		st, err := s.stream(c, sh)
		if err != nil {
			return 0, err
		}
		ev, err := s.event(c, eh)
		if err != nil {
			return 0, err
		}
		if rec := ev.last; rec != nil {
			st.clock.join(rec.clock)
			if !rec.done {
				s.enqueue(st, &simItem{kind: simItemWait, rec: rec})
			}
		}
		return 0, nil
	})
}

// EventCreate creates an event (cuEventCreate, timing disabled). Handles
// are never reused.
func (s *Device) EventCreate() (h device.Event, err error) {
	err = s.do(device.CallEventCreate, func() (uint64, error) {
		s.nextEvent++
		h = device.Event(s.simTag(simTagEvent, s.nextEvent))
		s.events[h] = &simEvent{h: h}
		return 0, nil
	})
	return h, err
}

// EventDestroy destroys event h (cuEventDestroy_v2); a queued record of it
// still completes, and waits on it still wait. Errors: an unknown or
// destroyed event is ErrInvalidValue.
func (s *Device) EventDestroy(h device.Event) error {
	const c = device.CallEventDestroy
	return s.do(c, func() (uint64, error) {
		if _, err := s.event(c, h); err != nil {
			return 0, err
		}
		delete(s.events, h)
		return 0, nil
	})
}

// EventRecord records event eh on stream sh (cuEventRecord): the event is
// done once the work issued on sh so far has run. Errors: an unknown or
// destroyed stream or event is ErrInvalidValue.
func (s *Device) EventRecord(eh device.Event, sh device.Stream) error {
	const c = device.CallEventRecord
	return s.do(c, func() (uint64, error) {
		ev, err := s.event(c, eh)
		if err != nil {
			return 0, err
		}
		st, err := s.stream(c, sh)
		if err != nil {
			return 0, err
		}
		rec := &simRecord{}
		s.enqueue(st, &simItem{kind: simItemRecord, rec: rec})
		ev.last = rec
		return 0, nil
	})
}

// EventQuery reports whether the work before event h's latest record has
// run (cuEventQuery): false while that work is held back, true for an
// event never recorded. Errors: an unknown or destroyed event is
// ErrInvalidValue.
func (s *Device) EventQuery(h device.Event) (done bool, err error) {
	const c = device.CallEventQuery
	err = s.do(c, func() (uint64, error) {
		ev, err := s.event(c, h)
		if err != nil {
			return 0, err
		}
		done = ev.last == nil || ev.last.done
		if done && ev.last != nil {
			s.host.join(ev.last.clock)
		}
		return 0, nil
	})
	return done, err
}

// EventSynchronize completes the work before event h's latest record
// (cuEventSynchronize), lifting the holds that work waits behind; the
// async pool then returns memory beyond its release threshold. Errors:
// an unknown or destroyed event is ErrInvalidValue.
func (s *Device) EventSynchronize(h device.Event) error {
	const c = device.CallEventSynchronize
	return s.do(c, func() (uint64, error) {
		ev, err := s.event(c, h)
		if err != nil {
			return 0, err
		}
		if rec := ev.last; rec != nil {
			s.complete(rec.st, func() bool { return rec.done })
			s.host.join(rec.clock)
		}
		s.asyncRelease(c, s.apool.threshold/s.cfg.Granularity*s.cfg.Granularity)
		return 0, nil
	})
}

// HoldStream stalls stream h as if the GPU were busy with it: from now on
// work issued on h stays queued, events recorded on h report not done, and
// memory that queued work writes must not be freed, unmapped or reused
// (see Violations). The hold lasts until ReleaseStream, StreamSynchronize
// on h, or an EventSynchronize or other synchronize that needs h's work.
// The default stream (0) can be held too. It is not a driver call: not
// counted, no hook, no faults. Errors: an unknown or destroyed stream is
// ErrInvalidValue.
func (s *Device) HoldStream(h device.Stream) error {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	st := s.streams[h]
	if st == nil || st.destroyed {
		return fmt.Errorf("device: sim HoldStream: stream %#x is not a live stream of this process: %w", uintptr(h), device.ErrInvalidValue)
	}
	st.held = true
	return nil
}

// ReleaseStream lifts a hold on stream h and runs the work that can now
// run; without a hold it does nothing. A stream destroyed while held can
// still be released. Errors: a stream this process never made is
// ErrInvalidValue.
func (s *Device) ReleaseStream(h device.Stream) error {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	st := s.streams[h]
	if st == nil {
		return fmt.Errorf("device: sim ReleaseStream: stream %#x is not a stream of this process: %w", uintptr(h), device.ErrInvalidValue)
	}
	st.held = false
	s.progress()
	return nil
}
