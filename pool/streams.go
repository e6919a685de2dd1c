package pool

import (
	"errors"
	"slices"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/tlsf"
)

// Stream order.
//
// A block freed on stream S may still be in use by work queued on S. The
// pool lets a later request on S reuse it at once (S runs in order), and
// makes any other reuse wait for an event recorded on S after the free.
//
// While the pool has seen one stream only (most programs, and all of the
// shared traces), a free returns the block to the index at once: every
// later request is on that stream. The stream is marked dirty, and before
// the pool returns memory to the driver it synchronizes every dirty stream
// (cuMemUnmap and cuMemFree must not pull memory from under running work).
//
// When a second stream appears, the pool switches to multi-stream mode: it
// records a switch event on the first stream, and makes every new stream
// wait for it (cuStreamWaitEvent), which orders all frees made so far
// before the new stream's work. From then on a free on S does not return
// the block to the index: it joins S's pending set and its open batch. A
// request on S first reuses a pending block of S of exactly the size the
// index would give it (Pool.fitSize: the request rounded up to 256 bytes
// under best fit, its size class with GoodFit).
// When an index search fails, and every pollInterval frees, the pool seals
// the open batches, recording one event on each stream after all of its
// frees (one driver call per batch, not per free), and polls the sealed
// ones; blocks of completed batches go back to the index (and merge). On
// the out-of-memory path the pool waits for every batch.

// pollInterval: multi-stream frees between two polls of pending batches.
const pollInterval = 64

type batch struct {
	ev    device.Event
	seq   uint64
	addrs []uint64
}

// pendingBlock is a block awaiting its batch's event. The size tells a
// current entry of bySize from a stale one left by an earlier block at
// the same address: a block reclaimed, reallocated at another size class
// and freed again on the stream is pending under its new size only.
type pendingBlock struct {
	seq  uint64 // the batch
	size uint64 // bytes
}

type streamState struct {
	s     device.Stream
	dirty bool // frees went to the index since the last synchronization

	pending map[uint64]pendingBlock // multi mode: by block address
	bySize  map[uint64][]uint64     // block size → addresses (entries may be stale)
	stale   int                     // stale entries in bySize
	open    *batch                  // its event is recorded after every free
	sealed  []*batch                // oldest first
}

type streamSet struct {
	dev  *counted
	all  map[device.Stream]*streamState
	uses map[uint64][]device.Stream // RecordStream: live block address → other streams using it
	held []heldBlock                // freed blocks awaiting the events of their uses (record.go)
	// orphaned are sealed batches of dropped streams whose event a drop
	// could not wait for: their blocks stay pending until it completes.
	orphaned      []batch
	first         *streamState
	multi         bool
	switchEv      device.Event
	switchPending bool // new streams must wait for switchEv
	spare         []device.Event
	seq           uint64
	frees         int // multi-stream frees since the last poll
	// onChange runs after first, multi or uses changed (Pool.updateGate).
	onChange func()
}

func newStreamSet(dev *counted) *streamSet {
	return &streamSet{dev: dev, all: map[device.Stream]*streamState{}, uses: map[uint64][]device.Stream{}, onChange: func() {}}
}

// use returns stream s's state, registering s on first sight (and
// switching to multi-stream mode at the second stream). On error nothing
// changed.
func (ss *streamSet) use(s device.Stream) (*streamState, error) {
	// A single-stream pool (the common case) finds its stream without the
	// map.
	if st := ss.first; st != nil && st.s == s && !ss.multi {
		return st, nil
	}
	if st, ok := ss.all[s]; ok {
		return st, nil
	}
	st := &streamState{s: s}
	if ss.first == nil {
		ss.first = st
		ss.all[s] = st
		ss.onChange()
		return st, nil
	}
	if !ss.multi && ss.first.dirty {
		ev, err := ss.event()
		if err != nil {
			return nil, err
		}
		if err := ss.dev.EventRecord(ev, ss.first.s); err != nil {
			ss.spare = append(ss.spare, ev)
			if !streamGone(err) {
				return nil, err
			}
			// The first stream was destroyed: its frees went to the index
			// already and no event can be recorded after them. Forget it;
			// s takes its place, still in single-stream mode.
			delete(ss.all, ss.first.s)
			ss.first = st
			ss.all[s] = st
			ss.onChange()
			return st, nil
		}
		ss.switchEv, ss.switchPending = ev, true
	}
	if ss.switchPending {
		if err := ss.dev.StreamWaitEvent(s, ss.switchEv); err != nil {
			if !ss.multi && ss.switchPending {
				ss.spare = append(ss.spare, ss.switchEv)
				ss.switchPending = false
			}
			return nil, err
		}
	}
	ss.multi = true
	st.pending = map[uint64]pendingBlock{}
	st.bySize = map[uint64][]uint64{}
	if ss.first.pending == nil {
		ss.first.pending = map[uint64]pendingBlock{}
		ss.first.bySize = map[uint64][]uint64{}
	}
	ss.all[s] = st
	ss.onChange() // multi
	return st, nil
}

// joins reports whether s is a stream the set has not seen, joining one it
// has (use would register it, switching to multi-stream mode).
func (ss *streamSet) joins(s device.Stream) bool {
	if ss.first == nil || ss.first.s == s && !ss.multi {
		return false
	}
	_, ok := ss.all[s]
	return !ok
}

// event returns a spare event or creates one.
func (ss *streamSet) event() (device.Event, error) {
	if k := len(ss.spare); k > 0 {
		ev := ss.spare[k-1]
		ss.spare = ss.spare[:k-1]
		return ev, nil
	}
	return ss.dev.EventCreate()
}

// defer_ adds block b, freed on st, to st's pending set and records st's
// open batch event after it. On error nothing changed.
func (ss *streamSet) defer_(st *streamState, b tlsf.Block) {
	if st.open == nil {
		ss.seq++
		st.open = &batch{seq: ss.seq}
	}
	st.open.addrs = append(st.open.addrs, b.Addr)
	st.pending[b.Addr] = pendingBlock{seq: st.open.seq, size: b.Size}
	st.bySize[b.Size] = append(st.bySize[b.Size], b.Addr)
	ss.frees++
}

// seal records the event of st's open batch, after all of its frees, and
// queues the batch. If the event cannot be recorded, it waits for the
// stream instead and hands the batch's blocks to reclaim at once; if that
// fails too, the batch stays open and the error is returned.
func (ss *streamSet) seal(st *streamState, reclaim func(addr uint64)) error {
	b := st.open
	if b == nil {
		return nil
	}
	ev, err := ss.event()
	if err == nil {
		if err = ss.dev.EventRecord(ev, st.s); err == nil {
			b.ev = ev
			st.sealed = append(st.sealed, b)
			st.open = nil
			return nil
		}
		ss.spare = append(ss.spare, ev)
	}
	if serr := ss.dev.StreamSynchronize(st.s); serr != nil {
		if streamGone(err) && streamGone(serr) {
			ss.drop(st, reclaim)
			return nil
		}
		return err
	}
	st.reclaim(b, reclaim)
	st.open = nil
	return nil
}

// reclaim hands the blocks of batch b, which completed, to reclaim.
func (st *streamState) reclaim(b *batch, reclaim func(addr uint64)) {
	for _, addr := range b.addrs {
		if pb, ok := st.pending[addr]; ok && pb.seq == b.seq {
			delete(st.pending, addr)
			st.stale++
			reclaim(addr)
		}
	}
}

// take removes batch b's blocks still pending from st, without reclaiming
// them, and returns their addresses.
func (st *streamState) take(b *batch) []uint64 {
	var addrs []uint64
	for _, addr := range b.addrs {
		if pb, ok := st.pending[addr]; ok && pb.seq == b.seq {
			delete(st.pending, addr)
			st.stale++
			addrs = append(addrs, addr)
		}
	}
	return addrs
}

// eventDone reports whether event ev completed: cuEventQuery, or with
// wait cuEventSynchronize (done unless it fails).
func (ss *streamSet) eventDone(ev device.Event, wait bool) (bool, error) {
	if wait {
		err := ss.dev.EventSynchronize(ev)
		return err == nil, err
	}
	return ss.dev.EventQuery(ev)
}

// pollOrphaned reclaims the blocks of orphaned batches whose events
// completed (with wait, waits for them).
func (ss *streamSet) pollOrphaned(wait bool, reclaim func(addr uint64)) error {
	var errs []error
	kept := ss.orphaned[:0]
	for _, b := range ss.orphaned {
		done, err := ss.eventDone(b.ev, wait)
		if err != nil {
			errs = append(errs, err)
		}
		if !done {
			kept = append(kept, b)
			continue
		}
		for _, addr := range b.addrs {
			reclaim(addr)
		}
		ss.spare = append(ss.spare, b.ev)
	}
	clear(ss.orphaned[len(kept):])
	ss.orphaned = kept
	return errors.Join(errs...)
}

// reuse pops a pending block of st of exactly size bytes (a size-class
// boundary), if any.
func (ss *streamSet) reuse(st *streamState, size uint64) (uint64, bool) {
	list := st.bySize[size]
	for len(list) > 0 {
		addr := list[len(list)-1]
		list = list[:len(list)-1]
		if pb, ok := st.pending[addr]; ok && pb.size == size {
			delete(st.pending, addr)
			st.bySize[size] = list
			return addr, true
		}
		st.stale--
	}
	delete(st.bySize, size)
	return 0, false
}

// poll seals open batches and hands the blocks of every completed batch
// to reclaim, oldest first. With wait, it waits for every batch. It
// returns the first device error; batches it could not finish stay.
func (ss *streamSet) poll(wait bool, reclaim func(addr uint64)) error {
	ss.frees = 0
	var firstErr error
	for _, st := range ss.all {
		if err := ss.seal(st, reclaim); err != nil && firstErr == nil {
			firstErr = err
		}
		for len(st.sealed) > 0 {
			b := st.sealed[0]
			done, err := ss.eventDone(b.ev, wait)
			if err != nil && firstErr == nil {
				firstErr = err
			}
			if !done {
				break
			}
			st.reclaim(b, reclaim)
			ss.spare = append(ss.spare, b.ev)
			st.sealed[0] = nil
			st.sealed = st.sealed[1:]
		}
		if st.stale > 64 && st.stale > 2*len(st.pending) {
			st.compact()
		}
	}
	if err := ss.pollHeld(wait, reclaim); err != nil && firstErr == nil {
		firstErr = err
	}
	if err := ss.pollOrphaned(wait, reclaim); err != nil && firstErr == nil {
		firstErr = err
	}
	if ss.switchPending {
		done, err := ss.dev.EventQuery(ss.switchEv)
		if wait && err == nil && !done {
			err = ss.dev.EventSynchronize(ss.switchEv)
			done = err == nil
		}
		if err != nil && firstErr == nil {
			firstErr = err
		}
		if done {
			ss.spare = append(ss.spare, ss.switchEv)
			ss.switchPending = false
		}
	}
	return firstErr
}

// compact drops stale entries from bySize.
func (st *streamState) compact() {
	for size, list := range st.bySize {
		kept := list[:0]
		for _, a := range list {
			if pb, ok := st.pending[a]; ok && pb.size == size {
				kept = append(kept, a)
			}
		}
		if len(kept) == 0 {
			delete(st.bySize, size)
		} else {
			st.bySize[size] = kept
		}
	}
	st.stale = 0
}

// syncDirty synchronizes every stream whose frees went straight to the
// index, so that memory under free blocks is no longer in use by the GPU.
func (ss *streamSet) syncDirty() error {
	for _, st := range ss.all {
		if st.dirty {
			if err := ss.dev.StreamSynchronize(st.s); err != nil {
				if !streamGone(err) {
					return err
				}
				// Destroyed: its frees to the index cannot be waited for.
				// Blocks still pending on it (it was dirty before the switch
				// to multi-stream mode) are dropped with it by the next seal.
				st.dirty = false
				if len(st.pending) == 0 {
					ss.drop(st, nil)
				}
				continue
			}
			st.dirty = false
		}
	}
	return nil
}

// pendingCount is the number of blocks awaiting events.
func (ss *streamSet) pendingCount() int {
	n := len(ss.held)
	for _, b := range ss.orphaned {
		n += len(b.addrs)
	}
	for _, st := range ss.all {
		n += len(st.pending)
	}
	return n
}

// close waits for and destroys every event.
func (ss *streamSet) close(reclaim func(addr uint64)) error {
	errs := []error{ss.poll(true, reclaim)}
	for _, ev := range ss.spare {
		errs = append(errs, ss.dev.EventDestroy(ev))
	}
	ss.spare = nil
	return errors.Join(errs...)
}

// forget synchronizes stream s, hands its pending blocks to reclaim,
// takes it off the uses of live blocks (RecordStream) and drops it. The
// caller is about to destroy s; a stream destroyed already is dropped as
// drop does. A stream known only from RecordStream is synchronized too:
// before, its uses stayed, and the free of such a block named the
// destroyed stream (cuEventRecord; on the H200 a crash), or, skipping it
// as gone, let the block be reused under the stream's queued work. With
// named (guard mode's records name s), s is synchronized even where the
// set does not know it. On error nothing changed.
func (ss *streamSet) forget(s device.Stream, named bool, reclaim func(addr uint64)) error {
	st, known := ss.all[s]
	recorded := false
	for _, uses := range ss.uses {
		if slices.Contains(uses, s) {
			recorded = true
			break
		}
	}
	if !known && !recorded && !named {
		return nil
	}
	if err := ss.dev.StreamSynchronize(s); err != nil && !streamGone(err) {
		return err
	}
	// Every free on s is now done, every event recorded on it, and every
	// use of a live block on it.
	if recorded {
		for addr, uses := range ss.uses {
			if i := slices.Index(uses, s); i >= 0 {
				uses = slices.Delete(slices.Clone(uses), i, i+1)
				if len(uses) == 0 {
					delete(ss.uses, addr)
				} else {
					ss.uses[addr] = uses
				}
			}
		}
		ss.onChange()
	}
	if known {
		ss.drop(st, reclaim)
	}
	return nil
}

// Destroyed streams.
//
// To the CUDA driver, a stream handle used after cuStreamDestroy is
// undefined behaviour: on the H200 (driver 580, 2026-12-03)
// cuStreamSynchronize, cuEventRecord and cuStreamWaitEvent on a destroyed
// stream, or on a handle that was never created, crashed the process.
// Call ForgetStream before destroying a stream the pool has seen. What
// follows is the pool's answer where a driver call on such a stream fails
// instead with an invalid handle (device.ErrInvalidValue), as the
// simulated device's calls do for a stream that is not live.
//
// A stream destroyed without ForgetStream is then found when a driver
// call on it fails: the pool drops the stream's state and keeps serving,
// where it used to fail every later registration, Trim and Close. What it
// cannot do is order reuse after work still queued on the dead stream
// (cuStreamDestroy returns at once and lets that work finish): blocks of
// batches sealed with an event wait for the event (where the drop cannot
// wait for it, in the set's polls: orphaned); blocks freed after the
// last event, and frees that went straight to the index in single-stream
// mode, are reusable at once. Destroying a stream with work still queued
// on memory being freed is the caller's race, as it would be with
// cudaFree.
//
// Stream handles are not validated: that would take a driver call per new
// stream, and the driver's answer for a bad handle may be a crash. On the
// simulated device a handle that was never created fails as a destroyed
// one does, so it is mostly taken for one (AllocOn, FreeOn and
// RecordStream return nil); a call that must order work on it first
// (AllocOn's cuStreamWaitEvent when a second stream joins) returns the
// error instead.

// streamGone reports whether err, from a driver call naming a stream, says
// the stream is not a live stream.
func streamGone(err error) bool { return errors.Is(err, device.ErrInvalidValue) }

// drop forgets stream state st: the blocks of its sealed batches are
// handed to reclaim once their events complete (the events outlive the
// stream), those of its open batch at once. reclaim may be nil when
// nothing is pending.
func (ss *streamSet) drop(st *streamState, reclaim func(addr uint64)) {
	for _, b := range st.sealed {
		if err := ss.dev.EventSynchronize(b.ev); err != nil {
			// Done already after a synchronize, but for a stream that was
			// destroyed: its work may still run. The blocks wait for the
			// event in the set's polls, without the stream's state.
			ss.orphaned = append(ss.orphaned, batch{ev: b.ev, addrs: st.take(b)})
			continue
		}
		st.reclaim(b, reclaim)
		ss.spare = append(ss.spare, b.ev)
	}
	if st.open != nil {
		st.reclaim(st.open, reclaim)
	}
	st.sealed, st.open = nil, nil
	delete(ss.all, st.s)
	if ss.first == st && !ss.multi {
		ss.first = nil // no stream left: the next one starts single-stream mode again
		ss.onChange()
	}
}
