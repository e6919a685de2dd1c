package pool

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/tlsf"
	"github.com/stretchr/testify/require"
)

// After a growth for a request, a search whose best fit lies on released
// pages a full device will not back takes the candidate lying on the
// fewest instead, backed (Pool.searchGrown): here the heap's free top,
// one released page short under the block. The plain search fails there,
// the index unchanged. Where backing the top fails with a device error,
// that error is returned (before, the search's out-of-room error), and
// nothing changed.
func TestASearchAfterAGrowthTakesTheBlockItCanBack(t *testing.T) {
	for _, fault := range []bool{false, true} {
		t.Run(fmt.Sprintf("fault=%v", fault), func(t *testing.T) { testSearchGrown(t, fault) })
	}
}

func testSearchGrown(t *testing.T, fault bool) {
	sd := sim.New(sim.Config{Capacity: 256 * miB})
	d := onSim(sd)
	p := openPool(t, d, Options{MaxBytes: 200 * miB}) // capped: one-page handles, each page moves alone
	var live []uintptr
	alloc := func(n uint64) uintptr {
		ptr, err := p.Alloc(n)
		require.NoError(t, err)
		return ptr
	}
	live = append(live, alloc(20*miB))
	f := alloc(39 * miB)              // the best fit to be, its pages released
	live = append(live, alloc(1*miB)) // f's last page stays under a live block
	live = append(live, alloc(2*miB)) // keeps f from merging with the top
	top := alloc(40 * miB)            // the free top to be, its last page released
	require.NoError(t, p.Free(f))
	require.NoError(t, p.Free(top))
	h := p.vmm
	var plainErr, grownErr error
	var got tlsf.Block
	var err error
	func() {
		p.mu.Lock() // no require below until it is given back: Close takes it
		defer p.mu.Unlock()
		for _, r := range h.freeMappings(^uint64(0)) {
			limit := r.n * h.gran // all of f's movable pages
			if h.pageAddr(r.first) >= uint64(top) {
				limit = h.gran // the top's last page
			}
			var n uint64
			if n, err = h.unmapFree([]mappingRun{r}, 0, limit, false, true); err != nil {
				return
			}
			p.noteReleased(n)
		}
		free, _, _ := sd.MemGetInfo()
		if err = sd.Occupy(free - 4*miB); err != nil { // room for the page, not for f
			return
		}
		p.full = fullDevice{on: true, limit: p.reserved()}
		_, plainErr = p.search(39*miB, 0)
		if fault {
			sd.FailNth(device.CallMemMap, 1, nil)
		}
		if got, grownErr = p.searchGrown(39*miB, 0); grownErr == nil {
			p.noteAlloc(got, false)
		}
	}()
	require.NoError(t, err)
	require.ErrorIs(t, plainErr, errNoRoom, "best fit takes f, which the device cannot back")
	if fault {
		require.ErrorIs(t, grownErr, device.ErrInjected)
		checkStep(t, p, d)
		for _, ptr := range live {
			require.NoError(t, p.Free(ptr))
		}
		return
	}
	require.NoError(t, grownErr)
	require.Equal(t, uint64(top), got.Addr, "the top, its page backed")
	checkStep(t, p, d)
	for _, ptr := range append(live, uintptr(got.Addr)) {
		require.NoError(t, p.Free(ptr))
	}
}

// The case the test above comes from, through the C ABI's defaults: the
// out-of-memory path moved pages from under the free top to serve a block
// it could not back (a full device), then grew the top for the request
// with them, leaving the top's own released pages unmapped; the request
// failed with the memory it needed mapped (its best fit, the top kept for
// last by the wilderness heuristic, lay on released pages the full device
// would not back, and the search took only blocks lying on none), and the
// growth stayed reserved.
func TestAGrowthAfterAMoveServesItsRequest(t *testing.T) {
	f, err := os.Open("testdata/top-holes.ops")
	require.NoError(t, err)
	defer f.Close()
	type op struct {
		malloc    bool
		id, bytes uint64
		s         device.Stream
	}
	var ops []op
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) == 0 || strings.HasPrefix(fs[0], "#") {
			continue
		}
		require.Len(t, fs, 4, sc.Text())
		id, err1 := strconv.ParseUint(fs[1], 10, 64)
		n, err2 := strconv.ParseUint(fs[2], 10, 64)
		s, err3 := strconv.ParseUint(fs[3], 0, 64)
		require.NoError(t, err1)
		require.NoError(t, err2)
		require.NoError(t, err3)
		ops = append(ops, op{fs[0] == "m", id, n, device.Stream(s)})
	}
	require.NoError(t, sc.Err())
	c, err := ParseConf("device:sim,sim_capacity:4GiB")
	require.NoError(t, err)
	sd := sim.New(sim.Config{Capacity: c.SimCapacity})
	d := onSim(sd)
	p := openPool(t, d, c.Options)
	ptrs := map[uint64]uintptr{}
	for _, o := range ops[:len(ops)-1] {
		if o.malloc {
			ptrs[o.id], _ = p.AllocOn(o.bytes, o.s) // one fails, out of memory, as it did
			continue
		}
		require.NoError(t, p.FreeSizedOn(ptrs[o.id], o.bytes, o.s))
		delete(ptrs, o.id)
	}
	last := ops[len(ops)-1]
	ptr, err := p.AllocOn(last.bytes, last.s)
	require.NoError(t, err)
	checkStep(t, p, d)
	require.NoError(t, p.FreeOn(ptr, last.s))
	for id, ptr := range ptrs {
		require.NoError(t, p.FreeOn(ptr, 0), "block %d", id)
	}
}

// A request whose growth succeeded but whose search then failed (the
// free top's released pages, which the growth counted, refused by a full
// device) leaves the pool no more memory than before, with or without
// OnOutOfMemory (Pool.allocMiss); without it, the peak of reserved memory
// is as it was too. (At 971a2ea the growth stayed: 10 MiB reserved
// became 100.)
func TestAFailedRequestKeepsNoGrowth(t *testing.T) {
	for _, hook := range []bool{false, true} {
		t.Run(fmt.Sprintf("hook=%v", hook), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: 256 * miB})
			d := onSim(sd)
			o := Options{Backend: BackendVMM}
			if hook {
				o.OnOutOfMemory = func(uint64) {}
			}
			p := openPool(t, d, o)
			a := releasedTop(t, p)
			before := p.Stats()
			failCreatesButOne(sd)
			_, err := p.Alloc(100 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			sd.ClearFaults()
			checkStep(t, p, d)
			after := p.Stats()
			require.LessOrEqual(t, after.Reserved, before.Reserved)
			if !hook {
				require.Equal(t, before.ReservedPeak, after.ReservedPeak)
			}
			require.NoError(t, p.Free(a))
		})
	}
}

// What OnOutOfMemory's hook makes the pool map, while it runs without the
// pool's lock, is not the failed request's: the request releases none of
// it (allocMiss takes its baseline again after the hook).
func TestAFailedRequestKeepsWhatItsHookMapped(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 256 * miB})
	d := onSim(sd)
	var p *Pool
	var once sync.Once
	p = openPool(t, d, Options{OnOutOfMemory: func(uint64) {
		once.Do(func() {
			if warm, err := p.Alloc(32 * miB); err == nil { // another user's growth, kept free for reuse
				_ = p.Free(warm)
			}
		})
	}})
	a, err := p.Alloc(150 * miB)
	require.NoError(t, err)
	before := p.Stats()
	_, err = p.Alloc(200 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	after := p.Stats()
	require.Equal(t, before.Releases, after.Releases, "the failed request released the hook's memory")
	require.Greater(t, after.Reserved, before.Reserved, "the hook's growth stays")
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
}

// A hook that releases the request's own growth (a Trim) and then maps
// memory of its own: the failed request releases none of the hook's
// memory. (A baseline moved by the net change across the hook took the
// two as no change, and the request released the hook's 20 MiB.)
func TestAFailedRequestKeepsWhatItsHookMappedAfterATrim(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 256 * miB})
	d := onSim(sd)
	var p *Pool
	var hookEnd Stats
	var hookErr error
	calls := 0
	p = openPool(t, d, Options{Backend: BackendVMM, OnOutOfMemory: func(uint64) {
		calls++
		if calls > 1 {
			return
		}
		sd.ClearFaults()
		if _, hookErr = p.Trim(); hookErr != nil {
			return
		}
		var w uintptr
		if w, hookErr = p.Alloc(20 * miB); hookErr != nil { // the hook's warm memory, kept for reuse
			return
		}
		hookErr = p.Free(w)
		hookEnd = p.Stats()
		sd.FailRate(device.CallMemCreate, 1, device.ErrOutOfMemory)
	}})
	a := releasedTop(t, p)
	failCreatesButOne(sd)
	_, err := p.Alloc(100 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	sd.ClearFaults()
	require.NoError(t, hookErr)
	after := p.Stats()
	require.Equal(t, hookEnd.Releases, after.Releases, "the failed request released the hook's memory")
	require.GreaterOrEqual(t, after.Reserved, hookEnd.Reserved)
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
}

// releasedTop allocates 10 MiB, which it returns, and a block above it
// that it frees, then trims the pool: the heap's free top lies on
// released pages.
func releasedTop(t *testing.T, p *Pool) uintptr {
	t.Helper()
	a, err := p.Alloc(10 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(10 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(b))
	_, err = p.Trim()
	require.NoError(t, err)
	p.mu.Lock()
	tail := p.vmm.unbackedTail()
	p.mu.Unlock()
	require.NotZero(t, tail)
	return a
}

// failCreatesButOne makes every cuMemCreate but the next refuse: a growth
// maps, and the released pages under the block grown for find no memory.
func failCreatesButOne(sd *sim.Device) {
	for i := uint64(2); i < 200; i++ {
		sd.FailNth(device.CallMemCreate, i, device.ErrOutOfMemory)
	}
}
