package pool

// Snapshots: the state of a pool's memory, block by block, with its
// history, in the shape of torch.cuda.memory._snapshot() so that
// PyTorch's memory viewer (pytorch.org/memory_viz, or python -m
// torch.cuda._memory_viz) reads what WritePickle writes.
//
// PyTorch's segments are cudaMalloc'd ranges, each tiled by its blocks.
// Here a segment is a range of device memory the pool holds: a chunk
// (BackendChunks), a maximal run of mapped pages of the VMM range (so
// that the segments add up to reserved memory and pages released under
// free blocks appear in none), or one driver allocation (passthrough).
// Blocks are the index's blocks clipped to their segment; blocks in
// per-P caches are free to the viewer ("inactive"), except those the
// caches handed out, which are live. The segments add up to the reserved
// memory, less physical memory a VMM pool holds unmapped (spares kept by
// ReleaseFraction, allocations whose release failed).
//
// With history on, the heaps report every mapping and chunk as it is made
// or undone ("segment_map"/"segment_unmap" for VMM pages, as PyTorch's
// expandable segments; "segment_alloc"/"segment_free" for chunks and
// passthrough allocations), so that the history replays into the
// segments: the viewer's "Allocator State History" steps through it.

import (
	"io"
	"maps"
	"runtime"
	"slices"
	"strings"

	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/tlsf"
)

// BlockState is the state of a snapshot's block.
type BlockState uint8

const (
	// BlockFree: free in the index ("inactive").
	BlockFree BlockState = iota
	// BlockLive: allocated to the caller ("active_allocated").
	BlockLive
	// BlockPending: freed on a stream whose work has not passed the free
	// yet ("active_pending_free").
	BlockPending
	// BlockCached: held free by a per-P cache ("inactive").
	BlockCached
)

var blockStateNames = [...]string{"inactive", "active_allocated", "active_pending_free", "inactive"}

// String returns PyTorch's name for the state.
func (s BlockState) String() string {
	if int(s) < len(blockStateNames) {
		return blockStateNames[s]
	}
	return "unknown"
}

// SnapshotBlock is one block of a segment.
type SnapshotBlock struct {
	// Addr is the block's device address; Size its size in bytes.
	Addr, Size uint64
	// Requested is the size in bytes the caller asked for, where history
	// recorded the allocation; else Size (live blocks) or 0.
	Requested uint64
	State     BlockState
	// Stack is the allocation's call stack (Options.HistoryStacks), as
	// program counters, innermost first.
	Stack []uintptr
}

// Segment is a range of device memory the pool holds, tiled by its
// blocks in address order.
type Segment struct {
	// Addr is the segment's device address; Size its size in bytes.
	Addr, Size uint64
	Blocks     []SnapshotBlock
}

// Allocated returns the bytes of the segment's live blocks; Active adds
// those pending on streams; Requested the bytes requested of live blocks.
func (s *Segment) Allocated() (allocated, active, requested uint64) {
	for _, b := range s.Blocks {
		switch b.State {
		case BlockLive:
			allocated += b.Size
			active += b.Size
			requested += b.Requested
		case BlockPending:
			active += b.Size
		}
	}
	return
}

// Snapshot is the state of a pool's memory at one moment.
type Snapshot struct {
	// Device is the device's ordinal.
	Device   int
	Backend  Backend
	Segments []Segment
	// History is the recorded history, oldest first (Options.History).
	History []Event
	// Stats are the pool's statistics at the snapshot.
	Stats Stats
}

// Snapshot returns the state of the pool's memory: every segment of
// device memory it holds with its blocks, and the history. It takes the
// pool's lock for a walk of every block: O(blocks + pages), meant for
// debugging. Errors: ErrClosed.
func (p *Pool) Snapshot() (*Snapshot, error) {
	p.lockAside()
	defer p.unlockAside()
	if p.closed {
		return nil, ErrClosed
	}
	s := &Snapshot{Device: p.dev.Ordinal(), Backend: p.backend, Stats: p.statsLocked()}
	if p.dbg != nil {
		p.dbg.adjustStats(&s.Stats) // red zones excluded, as in Stats
	}
	if p.hist != nil {
		s.History = p.hist.events()
	}
	if p.pt != nil {
		for _, ptr := range slices.Sorted(maps.Keys(p.pt.live)) {
			n := p.pt.live[ptr].size
			s.Segments = append(s.Segments, Segment{Addr: uint64(ptr), Size: n,
				Blocks: []SnapshotBlock{p.snapBlock(uint64(ptr), n, BlockLive)}})
		}
		return s, nil
	}
	// The segments, in address order.
	var segs [][2]uint64
	if h := p.vmm; h != nil {
		n := (h.end-h.base)/h.gran + h.standby
		for pg := uint64(0); pg < n; {
			if !h.mapped[pg] || h.stray[pg] {
				pg++
				continue
			}
			q := pg
			for q < n && h.mapped[q] && !h.stray[q] {
				q++
			}
			segs = append(segs, [2]uint64{h.pageAddr(pg), (q - pg) * h.gran})
			pg = q
		}
	} else {
		for _, r := range p.x.Regions() {
			segs = append(segs, [2]uint64{r.Base, r.Size})
		}
		slices.SortFunc(segs, func(a, b [2]uint64) int { return cmpU64(a[0], b[0]) })
	}
	for _, sg := range segs {
		s.Segments = append(s.Segments, Segment{Addr: sg[0], Size: sg[1]})
	}
	// Blocks, clipped to segments: the walk and the segments are both in
	// address order.
	i := 0
	p.x.Walk(func(b tlsf.Block) bool {
		state := BlockFree
		if !b.Free {
			state = p.blockState(b)
		}
		lo, hi := b.Addr, b.Addr+b.Size
		for i < len(s.Segments) && s.Segments[i].Addr+s.Segments[i].Size <= lo {
			i++
		}
		for j := i; j < len(s.Segments) && s.Segments[j].Addr < hi; j++ {
			sg := &s.Segments[j]
			a, e := max(lo, sg.Addr), min(hi, sg.Addr+sg.Size)
			if a < e {
				sb := SnapshotBlock{Addr: a, Size: e - a, State: state}
				if a == b.Addr && e == hi && state == BlockLive {
					sb = p.snapBlock(a, e-a, state)
				}
				sg.Blocks = append(sg.Blocks, sb)
			}
		}
		return true
	})
	if h := p.vmm; h != nil && h.standby > 0 {
		// Standby pages: free memory above the index's region, shown as
		// the free top they become (the segment holding them ends there).
		if k := len(s.Segments) - 1; k >= 0 {
			sg := &s.Segments[k]
			size := h.standby * h.gran
			if n := len(sg.Blocks); n > 0 && sg.Blocks[n-1].State == BlockFree && sg.Blocks[n-1].Addr+sg.Blocks[n-1].Size == h.end {
				sg.Blocks[n-1].Size += size
			} else {
				sg.Blocks = append(sg.Blocks, SnapshotBlock{Addr: h.end, Size: size, State: BlockFree})
			}
		}
	}
	return s, nil
}

// blockState tells the state of allocated block b. Pool lock held.
func (p *Pool) blockState(b tlsf.Block) BlockState {
	switch p.state(b.ID) {
	case stateLive:
		return BlockLive
	case statePending:
		return BlockPending
	case stateCached:
		if p.cache.handedOut(p.owner(b), b.Addr) {
			return BlockLive
		}
	}
	return BlockCached
}

// snapBlock describes a live block with what history knows of it.
func (p *Pool) snapBlock(addr, size uint64, state BlockState) SnapshotBlock {
	b := SnapshotBlock{Addr: addr, Size: size, Requested: size, State: state}
	if p.hist != nil {
		if r, ok := p.hist.lookup(uintptr(addr)); ok {
			b.Requested, b.Stack = r.size, r.stack
		}
	}
	return b
}

func cmpU64(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// WritePickle writes the snapshot as the pickle that PyTorch's
// torch.cuda.memory._snapshot() returns and _dump_snapshot writes: a
// dict with "segments" (each with "device", "address", "total_size",
// "allocated_size", "active_size", "requested_size", "stream",
// "segment_type", "segment_pool_id", "is_expandable" and "blocks" of
// "address", "size", "requested_size", "state", "frames") and
// "device_traces", one list per device up to this one, of entries with
// "action", "addr", "size", "stream", "time_us", "frames" (and
// "device_free" for "oom"). A free is written as "free_requested" and
// "free_completed" at the same time. Frames are dicts of "filename",
// "line" and "name", resolved from the recorded program counters.
// Errors: those of w.
func (s *Snapshot) WritePickle(w io.Writer) error {
	segType := "large"
	expandable := s.Backend == BackendVMM
	segs := make([]trace.Dict, 0, len(s.Segments))
	for _, sg := range s.Segments {
		blocks := make([]trace.Dict, 0, len(sg.Blocks))
		for _, b := range sg.Blocks {
			blocks = append(blocks, trace.Dict{
				{Key: "address", Value: b.Addr},
				{Key: "size", Value: b.Size},
				{Key: "requested_size", Value: b.Requested},
				{Key: "state", Value: b.State.String()},
				{Key: "frames", Value: pyFrames(b.Stack)},
			})
		}
		alloc, active, req := sg.Allocated()
		segs = append(segs, trace.Dict{
			{Key: "device", Value: s.Device},
			{Key: "address", Value: sg.Addr},
			{Key: "total_size", Value: sg.Size},
			{Key: "allocated_size", Value: alloc},
			{Key: "active_size", Value: active},
			{Key: "requested_size", Value: req},
			{Key: "stream", Value: 0},
			{Key: "segment_type", Value: segType},
			{Key: "segment_pool_id", Value: []any{0, 0}},
			{Key: "is_expandable", Value: expandable},
			{Key: "frames", Value: []trace.Dict{}},
			{Key: "blocks", Value: blocks},
		})
	}
	var entries []trace.Dict
	for _, e := range s.History {
		entry := func(action string) trace.Dict {
			d := trace.Dict{
				{Key: "action", Value: action},
				{Key: "addr", Value: uint64(e.Addr)},
				{Key: "size", Value: e.Size},
				{Key: "stream", Value: uint64(e.Stream)},
				{Key: "time_us", Value: e.TimeUS},
				{Key: "frames", Value: pyFrames(e.Stack)},
			}
			if e.Action == ActionOOM {
				d = append(d, trace.Item{Key: "device_free", Value: e.DeviceFree})
			}
			return d
		}
		entries = append(entries, entry(e.Action.String()))
		if e.Action == ActionFree {
			entries = append(entries, entry("free_completed"))
		}
	}
	traces := make([]any, max(s.Device+1, 1))
	for i := range traces {
		traces[i] = []trace.Dict{}
	}
	traces[max(s.Device, 0)] = entries
	if entries == nil {
		traces[max(s.Device, 0)] = []trace.Dict{}
	}
	return trace.WritePickle(w, trace.Dict{
		{Key: "segments", Value: segs},
		{Key: "device_traces", Value: traces},
		{Key: "allocator_settings", Value: trace.Dict{{Key: "allocator", Value: "tlsf-" + s.Backend.String()}}},
	})
}

// poolMethodPrefix begins the function names of the Pool's methods.
const poolMethodPrefix = "github.com/gpumem/tlsf/pool.(*Pool)."

// pyFrames resolves program counters to PyTorch's frame dicts.
func pyFrames(stack []uintptr) []trace.Dict {
	out := []trace.Dict{}
	if len(stack) == 0 {
		return out
	}
	frames := runtime.CallersFrames(stack)
	for {
		f, more := frames.Next()
		// The pool's own entry points (Alloc calling AllocOn) are not
		// where the memory went.
		inPool := len(out) == 0 && strings.HasPrefix(f.Function, poolMethodPrefix)
		if !inPool && (f.Function != "" || f.File != "") {
			out = append(out, trace.Dict{
				{Key: "filename", Value: f.File},
				{Key: "line", Value: f.Line},
				{Key: "name", Value: f.Function},
			})
		}
		if !more {
			break
		}
	}
	return out
}
