package pool

// Allocation history: what PyTorch records with
// torch.cuda.memory._record_memory_history, for snapshots (snapshot.go).
//
// With Options.History = N > 0 the pool keeps the last N events in a ring
// buffer: allocations, frees, growths and releases of device memory, and
// failures. Each event costs about 80 bytes of the ring and, with
// Options.HistoryStacks, the program counters of the call stack of the
// allocation (runtime.Callers: up to maxHistoryDepth frames, about 250 ns
// and 8 bytes a frame). Recording takes the history's own lock, reads the
// clock and updates a map of live allocations, so with history on, Alloc
// and Free of small blocks serialize on it: a 4 KiB Alloc+Free pair from
// the caches took 172 ns instead of 34, 420 ns with stacks (medians,
// BenchmarkSmallAllocFreeHistory, 2-core VM). Meant for debugging, as in
// PyTorch. The pool also remembers the requested size (and stack) of
// every live allocation made while recording, so that snapshots can give
// them for each block even after the ring wrapped.
//
// The hook is one branch at the top of AllocOn and of freeOn (a caller's
// free: FreeOn, FreeSizedOn) on a field that is nil when history is off.

import (
	"errors"
	"runtime"
	"sync"
	"time"

	"github.com/gpumem/tlsf/device"
)

// MaxHistory is the most events Options.History may keep: 2^24 events,
// about 1.3 GiB at 80 bytes each, already more than a debugging session
// reads; the bound keeps a configuration string from asking for more
// memory than the host has (a fatal error, not an error value).
const MaxHistory = 1 << 24

// maxHistoryDepth bounds the frames recorded per allocation: PyTorch's
// viewer shows the innermost few dozen, and deeper stacks only cost.
const maxHistoryDepth = 32

// Action is the kind of a history Event.
type Action uint8

const (
	// ActionAlloc: Alloc or AllocOn returned Addr for a request of Size
	// bytes ("alloc" in PyTorch's traces).
	ActionAlloc Action = iota + 1
	// ActionFree: Free or FreeOn freed Addr, requested as Size bytes
	// ("free_requested", and "free_completed" at the same time).
	ActionFree
	// ActionSegmentAlloc: the pool took Size bytes at Addr from the
	// driver as one allocation: a cuMemAlloc chunk (BackendChunks), or a
	// passthrough pool's allocation ("segment_alloc").
	ActionSegmentAlloc
	// ActionSegmentFree: the pool returned that allocation to the driver
	// (cuMemFree; "segment_free").
	ActionSegmentFree
	// ActionOOM: a request of Size bytes failed with ErrOutOfMemory while
	// the device had DeviceFree bytes free ("oom").
	ActionOOM
	// ActionSegmentMap: a VMM pool mapped Size bytes of pages at Addr
	// (cuMemMap; "segment_map", as PyTorch's expandable segments).
	ActionSegmentMap
	// ActionSegmentUnmap: a VMM pool unmapped Size bytes of pages at Addr
	// (cuMemUnmap; "segment_unmap").
	ActionSegmentUnmap
)

var actionNames = [...]string{"", "alloc", "free_requested", "segment_alloc", "segment_free", "oom", "segment_map", "segment_unmap"}

// String returns the action's name in PyTorch's traces.
func (a Action) String() string {
	if int(a) < len(actionNames) && a > 0 {
		return actionNames[a]
	}
	return "unknown"
}

// Event is one entry of the history.
type Event struct {
	Action Action
	// Addr is the device pointer (0 where the event has none).
	Addr uintptr
	// Size is the requested size in bytes (alloc, free, oom) or the bytes
	// taken or returned (segment events).
	Size   uint64
	Stream device.Stream
	// TimeUS is the time of the event in µs since the Unix epoch.
	TimeUS int64
	// DeviceFree is the device's free memory in bytes (oom only).
	DeviceFree uint64
	// Stack holds the program counters of the allocating goroutine's call
	// stack, innermost first (runtime.Callers), with
	// Options.HistoryStacks; free events repeat the allocation's.
	Stack []uintptr
}

// liveRec is what the history keeps of a live allocation.
type liveRec struct {
	size  uint64
	stack []uintptr
}

// history is the ring buffer of events. Its lock is taken after the
// pool's where both are held (segment events), never before.
type history struct {
	mu     sync.Mutex
	ring   []Event
	next   int  // where the next event goes
	full   bool // the ring wrapped
	stacks bool
	live   map[uintptr]liveRec
}

func newHistory(n int, stacks bool) *history {
	if n <= 0 {
		return nil
	}
	return &history{ring: make([]Event, n), stacks: stacks, live: map[uintptr]liveRec{}}
}

func (h *history) add(e Event) {
	e.TimeUS = time.Now().UnixMicro()
	h.ring[h.next] = e
	h.next++
	if h.next == len(h.ring) {
		h.next, h.full = 0, true
	}
}

// events returns the events oldest first.
func (h *history) events() []Event {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.full {
		return append([]Event(nil), h.ring[:h.next]...)
	}
	return append(append([]Event(nil), h.ring[h.next:]...), h.ring[:h.next]...)
}

// lookup returns the requested size and stack of a live allocation at
// addr recorded by the history.
func (h *history) lookup(addr uintptr) (liveRec, bool) {
	h.mu.Lock()
	defer h.mu.Unlock()
	r, ok := h.live[addr]
	return r, ok
}

// allocRecorded is AllocOn with history on.
func (p *Pool) allocRecorded(size uint64, s device.Stream) (uintptr, error) {
	var stack []uintptr
	if p.hist.stacks {
		var pcs [maxHistoryDepth]uintptr
		n := runtime.Callers(3, pcs[:]) // skip Callers, allocRecorded, AllocOn
		stack = append([]uintptr(nil), pcs[:n]...)
	}
	ptr, err := p.allocOn(size, s)
	h := p.hist
	switch {
	case err == nil:
		h.mu.Lock()
		if p.pt != nil { // each driver allocation is a segment
			h.add(Event{Action: ActionSegmentAlloc, Addr: ptr, Size: size, Stream: s})
		}
		h.add(Event{Action: ActionAlloc, Addr: ptr, Size: size, Stream: s, Stack: stack})
		h.live[ptr] = liveRec{size, stack}
		h.mu.Unlock()
	case errors.Is(err, ErrOutOfMemory):
		free, _, _ := p.dev.unlockedMemGetInfo()
		h.mu.Lock()
		h.add(Event{Action: ActionOOM, Size: size, Stream: s, DeviceFree: free, Stack: stack})
		h.mu.Unlock()
	}
	return ptr, err
}

// freeRecorded is FreeOn with history on. The free is recorded before
// it is made, so that an allocation that reuses the address at once is
// recorded after it; should the free fail, the allocation is recorded
// again.
func (p *Pool) freeRecorded(ptr uintptr, s device.Stream) error {
	h := p.hist
	h.mu.Lock()
	r, known := h.live[ptr]
	if known {
		delete(h.live, ptr)
		h.add(Event{Action: ActionFree, Addr: ptr, Size: r.size, Stream: s, Stack: r.stack})
		if p.pt != nil {
			h.add(Event{Action: ActionSegmentFree, Addr: ptr, Size: r.size, Stream: s})
		}
	}
	h.mu.Unlock()
	err := p.freeOn(ptr, 0, s, false)
	switch {
	case err != nil && known:
		h.mu.Lock()
		if p.pt != nil {
			h.add(Event{Action: ActionSegmentAlloc, Addr: ptr, Size: r.size, Stream: s})
		}
		h.live[ptr] = r
		h.add(Event{Action: ActionAlloc, Addr: ptr, Size: r.size, Stream: s, Stack: r.stack})
		h.mu.Unlock()
	case err == nil && !known: // AllocPitch's blocks are not recorded
		h.mu.Lock()
		h.add(Event{Action: ActionFree, Addr: ptr, Stream: s})
		h.mu.Unlock()
	}
	return err
}

// noteSegment records a segment event. Pool lock held.
func (p *Pool) noteSegment(a Action, addr uintptr, n uint64) {
	if h := p.hist; h != nil && n > 0 {
		h.mu.Lock()
		h.add(Event{Action: a, Addr: addr, Size: n})
		h.mu.Unlock()
	}
}

// watchHeap has the heap report its mappings and chunks to the history,
// so that the segment events replay into the snapshot's segments.
func (p *Pool) watchHeap() {
	if p.hist == nil {
		return
	}
	switch h := p.heap.(type) {
	case *vmmHeap:
		h.note = func(addr, size uint64, mapped bool) {
			p.noteSegment(cond(mapped, ActionSegmentMap, ActionSegmentUnmap), uintptr(addr), size)
		}
	case *chunkHeap:
		h.note = func(addr, size uint64, allocated bool) {
			p.noteSegment(cond(allocated, ActionSegmentAlloc, ActionSegmentFree), uintptr(addr), size)
		}
	}
}

func cond[T any](c bool, a, b T) T {
	if c {
		return a
	}
	return b
}

// History returns the recorded events, oldest first: at most
// Options.History of them, none when it is 0. Safe for concurrent use.
func (p *Pool) History() []Event {
	if p.hist == nil {
		return nil
	}
	return p.hist.events()
}
