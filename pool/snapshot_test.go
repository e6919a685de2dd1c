package pool

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/stretchr/testify/require"
)

// replayOps runs ops through p on the default stream and returns the
// pointers of the blocks still live, by trace ID.
func replayOps(t *testing.T, p *Pool, ops []trace.Op) map[uint64]uintptr {
	t.Helper()
	live := map[uint64]uintptr{}
	for i, op := range ops {
		if op.Free {
			require.NoError(t, p.Free(live[op.ID]), "op %d", i)
			delete(live, op.ID)
			continue
		}
		ptr, err := p.Alloc(op.Size)
		require.NoError(t, err, "op %d: %d bytes", i, op.Size)
		live[op.ID] = ptr
	}
	return live
}

// shape is a trace's ops without IDs: which earlier allocation each free
// frees, by its rank.
func shape(ops []trace.Op) [][3]uint64 {
	rank := map[uint64]uint64{}
	var out [][3]uint64
	n := uint64(0)
	for _, op := range ops {
		if op.Free {
			out = append(out, [3]uint64{1, rank[op.ID], op.Size})
			continue
		}
		rank[op.ID] = n
		out = append(out, [3]uint64{0, n, op.Size})
		n++
	}
	return out
}

// checkTiling: every segment is tiled by its blocks, and the segments add
// up to the reserved memory.
func checkTiling(t *testing.T, s *Snapshot) {
	t.Helper()
	var total uint64
	for _, sg := range s.Segments {
		next := sg.Addr
		for _, b := range sg.Blocks {
			require.Equal(t, next, b.Addr, "segment %#x: blocks tile it", sg.Addr)
			next += b.Size
		}
		require.Equal(t, sg.Addr+sg.Size, next, "segment %#x ends with its last block", sg.Addr)
		total += sg.Size
	}
	require.Equal(t, s.Stats.Reserved, total, "segments add up to reserved memory")
}

func TestSnapshotRoundTripsThroughTheTraceReader(t *testing.T) {
	tr, err := trace.Load("lstm")
	require.NoError(t, err)
	ops := tr.Ops[:1500]
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}, History: 4096, HistoryStacks: true})
				live := replayOps(t, p, ops)
				snap, err := p.Snapshot()
				require.NoError(t, err)
				checkTiling(t, snap)
				var nLive int
				for _, sg := range snap.Segments {
					for _, b := range sg.Blocks {
						if b.State == BlockLive {
							nLive++
							require.NotEmpty(t, b.Stack, "live block %#x has its allocation's stack", b.Addr)
						}
					}
				}
				require.Equal(t, len(live), nLive, "live blocks in the snapshot")

				var buf bytes.Buffer
				require.NoError(t, snap.WritePickle(&buf))
				back, err := trace.Parse("snap.pickle", bytes.NewReader(buf.Bytes()))
				require.NoError(t, err)
				require.Equal(t, trace.FormatPyTorch, back.Format)
				require.Zero(t, back.Skipped)
				require.Equal(t, shape(ops), shape(back.Ops), "the trace read back is the trace replayed")

				// And it replays.
				d2 := onSim(sim.New(sim.Config{}))
				p2 := openPool(t, d2, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				replayOps(t, p2, back.Ops)
				require.Equal(t, p.Stats().Allocated, p2.Stats().Allocated)
				checkStep(t, p2, d2)
			})
		}
	}
}

func TestSnapshotShowsReleasedPagesInNoSegment(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	a, err := p.Alloc(64 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	_, err = p.Trim()
	require.NoError(t, err)
	s, err := p.Snapshot()
	require.NoError(t, err)
	checkTiling(t, s)
	require.Less(t, s.Stats.Reserved, 64*miB)
	require.NoError(t, p.Free(b))
}

func TestSnapshotWithoutHistoryHasEmptyTraces(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{})
	a, err := p.Alloc(3 * miB)
	require.NoError(t, err)
	s, err := p.Snapshot()
	require.NoError(t, err)
	require.Empty(t, s.History)
	var buf bytes.Buffer
	require.NoError(t, s.WritePickle(&buf))
	back, err := trace.Parse("snap.pickle", &buf)
	require.NoError(t, err)
	require.Empty(t, back.Ops)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Close())
	_, err = p.Snapshot()
	require.ErrorIs(t, err, ErrClosed)
}

func TestHistoryKeepsTheLastEvents(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{History: 5, Cache: CacheOptions{Disable: true}})
	var ptrs []uintptr
	for i := range 4 {
		ptr, err := p.Alloc(uint64(i+1) * kiB)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	require.NoError(t, p.Free(ptrs[0]))
	_, err := p.Alloc(2 * giB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	h := p.History()
	require.Len(t, h, 5)
	var acts []string
	for _, e := range h {
		acts = append(acts, e.Action.String())
	}
	// The first event (segment_map of the first growth) has gone.
	require.Equal(t, []string{"alloc", "alloc", "alloc", "free_requested", "oom"}, acts)
	require.Equal(t, uint64(1*kiB), h[3].Size, "a free gives the requested size")
	require.Equal(t, uint64(2*giB), h[4].Size)
	require.NotZero(t, h[4].DeviceFree)
	require.Nil(t, h[0].Stack, "no stacks without HistoryStacks")
	for i := 1; i < len(h); i++ {
		require.LessOrEqual(t, h[i-1].TimeUS, h[i].TimeUS)
	}
	for _, ptr := range ptrs[1:] {
		require.NoError(t, p.Free(ptr))
	}
}

// Python's own unpickler reads what WritePickle writes, and the segments
// pass the check PyTorch's `_memory_viz stats` asserts (blocks add up to
// the segment). Skipped where python3 is absent.
func TestSnapshotPickleLoadsInPython(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{History: 100, HistoryStacks: true})
	a, err := p.Alloc(5 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(1000)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	s, err := p.Snapshot()
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "snap.pickle")
	f, err := os.Create(path)
	require.NoError(t, err)
	require.NoError(t, s.WritePickle(f))
	require.NoError(t, f.Close())
	script := `
import pickle, sys
d = pickle.load(open(sys.argv[1], 'rb'))
for seg in d['segments']:
    assert sum(b['size'] for b in seg['blocks']) == seg['total_size']
    for k in ('device', 'address', 'total_size', 'allocated_size', 'active_size', 'requested_size', 'stream', 'segment_type'):
        assert k in seg, k
    for b in seg['blocks']:
        for k in ('address', 'size', 'requested_size', 'state', 'frames'):
            assert k in b, k
acts = [e['action'] for e in d['device_traces'][0]]
print(' '.join(acts))
fr = [e for e in d['device_traces'][0] if e['action'] == 'alloc'][0]['frames'][0]
print(sorted(fr.keys()), fr['name'].split('.')[-1])
`
	out, err := exec.Command(py, "-c", script, path).CombinedOutput()
	require.NoError(t, err, "%s", out)
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	require.Equal(t, "segment_map alloc alloc free_requested free_completed", lines[0])
	require.Equal(t, "['filename', 'line', 'name'] TestSnapshotPickleLoadsInPython", lines[1])
	require.NoError(t, p.Free(b))
}

// Many goroutines allocate and free with history and stacks on while
// others take snapshots: run with -race.
func TestHistoryAndSnapshotsUnderConcurrency(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
	p := openPool(t, d, Options{History: 512, HistoryStacks: true})
	done := make(chan struct{})
	errs := make(chan error, 8)
	for g := range 4 {
		go func() {
			defer func() { done <- struct{}{} }()
			var live []uintptr
			for i := range 2000 {
				n := uint64(256 << ((g + i) % 14))
				ptr, err := p.Alloc(n)
				if err != nil {
					errs <- err
					return
				}
				live = append(live, ptr)
				if len(live) > 8 {
					if err := p.Free(live[0]); err != nil {
						errs <- err
						return
					}
					live = live[1:]
				}
			}
			for _, ptr := range live {
				if err := p.Free(ptr); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	go func() {
		defer func() { done <- struct{}{} }()
		for range 20 {
			s, err := p.Snapshot()
			if err != nil {
				errs <- err
				return
			}
			if err := s.WritePickle(&bytes.Buffer{}); err != nil {
				errs <- err
				return
			}
		}
	}()
	for range 5 {
		<-done
	}
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	checkStep(t, p, d)
	s, err := p.Snapshot()
	require.NoError(t, err)
	checkTiling(t, s)
	require.Len(t, s.History, 512)
	require.Zero(t, s.Stats.Allocations)
}

// The history's segment events, replayed from an empty device, give the
// snapshot's segments, and every block allocated lies in a segment when
// it is allocated: what PyTorch's viewer assumes when it steps through
// the history ("Allocator State History").
func TestSnapshotSegmentEventsReplayIntoItsSegments(t *testing.T) {
	tr, err := trace.Load("tdnn")
	require.NoError(t, err)
	for _, be := range allBackends {
		for _, rf := range []float64{0, 0.03} {
			t.Run(fmt.Sprintf("%s/ReleaseFraction=%v", be, rf), func(t *testing.T) {
				if be == BackendPassthrough && rf > 0 {
					t.Skip("no ReleaseFraction in passthrough")
				}
				d := onSim(sim.New(sim.Config{}))
				p := openPool(t, d, Options{Backend: be, ReleaseFraction: rf, History: 1 << 20})
				live := replayOps(t, p, tr.Ops)
				_, err := p.Trim()
				require.NoError(t, err)
				s, err := p.Snapshot()
				require.NoError(t, err)

				mapped := map[uint64]bool{} // by 256-byte unit... too fine: by granule
				const unit = 2 << 20
				inSegment := func(addr, size uint64) bool {
					for a := addr / unit * unit; a < addr+size; a += unit {
						if !mapped[a] {
							return false
						}
					}
					return true
				}
				for i, e := range s.History {
					a := uint64(e.Addr)
					switch e.Action {
					case ActionSegmentMap, ActionSegmentAlloc:
						require.Zero(t, a%256, "event %d", i)
						for x := a / unit * unit; x < a+e.Size; x += unit {
							if be != BackendPassthrough {
								require.False(t, mapped[x], "event %d maps %#x twice", i, x)
							}
							mapped[x] = true
						}
					case ActionSegmentUnmap, ActionSegmentFree:
						for x := a / unit * unit; x < a+e.Size; x += unit {
							if be != BackendPassthrough {
								require.True(t, mapped[x], "event %d unmaps %#x, not mapped", i, x)
							}
							delete(mapped, x)
						}
					case ActionAlloc:
						require.True(t, inSegment(a, e.Size), "event %d: alloc at %#x outside every segment", i, a)
					}
				}
				if be == BackendPassthrough {
					return // driver allocations share pages: the unit model is too coarse
				}
				var segBytes uint64
				for _, sg := range s.Segments {
					require.True(t, inSegment(sg.Addr, sg.Size), "segment %#x not mapped by the events", sg.Addr)
					segBytes += sg.Size
				}
				require.Equal(t, segBytes, uint64(len(mapped))*unit, "the events map exactly the segments")
				for _, ptr := range live {
					require.NoError(t, p.Free(ptr))
				}
			})
		}
	}
}
