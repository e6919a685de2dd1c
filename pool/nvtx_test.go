package pool

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// recordingChecker is a memory checker that records the calls and keeps
// the state a real one would: heaps and their live regions. It fails the
// test on any call a tool would reject (a region outside its heap or
// overlapping a live one, an unknown heap or region).
type recordingChecker struct {
	t       *testing.T
	mu      sync.Mutex
	next    uintptr
	heaps   map[uintptr][2]uintptr // handle → [base, end)
	regions map[uintptr]uintptr    // ptr → end
	calls   []string
	// dev, when set, must still hold a heap's memory when it is
	// unregistered: the tool refuses to forget a heap already freed.
	dev device.Device
}

func newRecordingChecker(t *testing.T) *recordingChecker {
	return &recordingChecker{t: t, next: 0x1000, heaps: map[uintptr][2]uintptr{}, regions: map[uintptr]uintptr{}}
}

func (c *recordingChecker) HeapRegister(base uintptr, size uint64) uintptr {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.next++
	c.heaps[c.next] = [2]uintptr{base, base + uintptr(size)}
	c.calls = append(c.calls, fmt.Sprintf("heap+ %#x %d", base, size))
	return c.next
}

func (c *recordingChecker) HeapUnregister(h uintptr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.heaps[h]
	if !ok {
		c.t.Errorf("unregister of unknown heap %#x", h)
	}
	if c.dev != nil {
		var b [1]byte
		if err := c.dev.MemcpyDtoH(b[:], r[0]); err != nil {
			c.t.Errorf("heap %#x unregistered after its memory was freed: %v", r[0], err)
		}
	}
	for p := range c.regions {
		if p >= r[0] && p < r[1] {
			delete(c.regions, p) // dropped with the heap
		}
	}
	delete(c.heaps, h)
	c.calls = append(c.calls, fmt.Sprintf("heap- %#x", r[0]))
}

func (c *recordingChecker) RegionRegister(h, ptr uintptr, size uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r, ok := c.heaps[h]
	end := ptr + uintptr(size)
	if !ok || ptr < r[0] || end > r[1] {
		c.t.Errorf("region [%#x, %#x) outside heap %#x %v", ptr, end, h, r)
	}
	for p, e := range c.regions {
		if ptr < e && p < end {
			c.t.Errorf("region [%#x, %#x) overlaps live [%#x, %#x)", ptr, end, p, e)
		}
	}
	c.regions[ptr] = end
	c.calls = append(c.calls, fmt.Sprintf("region+ %#x %d", ptr, size))
}

func (c *recordingChecker) RegionUnregister(ptr uintptr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.regions[ptr]; !ok {
		c.t.Errorf("unregister of unknown region %#x", ptr)
	}
	delete(c.regions, ptr)
	c.calls = append(c.calls, fmt.Sprintf("region- %#x", ptr))
}

func (c *recordingChecker) live() (heaps, regions int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.heaps), len(c.regions)
}

func withChecker(t *testing.T) *recordingChecker {
	c := newRecordingChecker(t)
	old := openChecker
	openChecker = func() memChecker { return c }
	t.Cleanup(func() { openChecker = old })
	return c
}

// Every block handed out, cache hits included, is a region of a heap
// while live and only then; every heap goes when its memory goes back.
func TestCheckerSeesEveryBlock(t *testing.T) {
	for _, be := range []Backend{BackendAuto, BackendChunks} {
		for _, cm := range cacheModes {
			for _, guard := range []uint64{0, 64} {
				t.Run(fmt.Sprintf("%s/%s/guard=%d", be, cm.name, guard), func(t *testing.T) {
					chk := withChecker(t)
					sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
					chk.dev = sd
					d := onSim(sd)
					p := openPool(t, d, Options{Backend: be, Guard: guard, Cache: cm.opts()})
					require.NotNil(t, p.dbg)
					require.Equal(t, BackendChunks, p.Backend(), "with a checker, auto is chunks")
					live := map[uintptr]uint64{}
					sizes := []uint64{256, 1000, 256, 70 * kiB, 3 * miB, 256, 1000}
					for round := 0; round < 3; round++ {
						for _, n := range sizes {
							ptr, err := p.Alloc(n)
							require.NoError(t, err)
							live[ptr] = n
							chk.mu.Lock()
							end, ok := chk.regions[ptr]
							chk.mu.Unlock()
							require.True(t, ok, "block %#x not registered", ptr)
							require.Equal(t, ptr+uintptr(n), end, "the region is the request, red zone excluded")
						}
						pp, _, err := p.AllocPitch(100, 3)
						require.NoError(t, err)
						require.NoError(t, p.Free(pp))
						for ptr := range live {
							require.NoError(t, p.Free(ptr))
							delete(live, ptr)
						}
						_, regions := chk.live()
						require.Zero(t, regions, "a freed block stays registered")
						checkStep(t, p, d)
					}
					_, err := p.Trim()
					require.NoError(t, err)
					ptr, err := p.Alloc(4096) // left allocated: Close takes it
					require.NoError(t, err)
					_ = ptr
					require.NoError(t, p.Close())
					heaps, regions := chk.live()
					require.Zero(t, heaps, "a heap outlives the pool")
					require.Zero(t, regions)
				})
			}
		}
	}
}

// A passthrough pool tells the checker nothing: the driver does. Nor
// does a VMM pool: the tool refuses its heap (nvtx.go).
func TestCheckerNotUsedByPassthroughOrVMM(t *testing.T) {
	for _, be := range []Backend{BackendPassthrough, BackendVMM} {
		t.Run(be.String(), func(t *testing.T) {
			chk := withChecker(t)
			p := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{Backend: be})
			ptr, err := p.Alloc(1000)
			require.NoError(t, err)
			require.NoError(t, p.Free(ptr))
			require.Nil(t, p.dbg)
			require.Equal(t, be, p.Backend())
			require.Empty(t, chk.calls)
		})
	}
}

// A chunk whose cuMemFree fails (under compute-sanitizer: the context
// was destroyed by a reported store) is not registered again: the tool
// refuses a heap in a dead context, and counts the warning as an error.
func TestCheckerNoHeapAfterFailedFree(t *testing.T) {
	chk := withChecker(t)
	sd := sim.New(sim.Config{Capacity: giB})
	p, err := New(onSim(sd), Options{Backend: BackendChunks})
	require.NoError(t, err)
	ptr, err := p.Alloc(1000)
	require.NoError(t, err)
	require.NoError(t, p.Free(ptr))
	sd.FailNth(device.CallMemFree, 1, device.ErrIllegalAddress)
	require.Error(t, p.Close())
	require.Equal(t, []string{
		fmt.Sprintf("heap+ %#x %d", ptr, chunkGranularity),
		fmt.Sprintf("region+ %#x 1000", ptr),
		fmt.Sprintf("region- %#x", ptr),
		fmt.Sprintf("heap- %#x", ptr),
	}, chk.calls, "no heap+ after the failed free")
	heaps, regions := chk.live()
	require.Zero(t, heaps)
	require.Zero(t, regions)
}
