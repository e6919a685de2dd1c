package pool

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// A growth extends the heap's free top: pages a move took from under it
// (recycle) are mapped again with the growth, which counted them
// (growAndSearch's tail), so the top lies on no released page after it.
func TestAGrowthBacksTheFreeTopsHoles(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 256 * miB})
	d := onSim(sd)
	p := openPool(t, d, Options{})
	a, err := p.Alloc(10 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(10 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(b)) // the heap's free top
	h := p.vmm
	var moved, tail, holes, tailAfter uint64
	func() {
		p.mu.Lock() // no require below until it is given back: Close takes it
		defer p.mu.Unlock()
		if moved, err = h.recycle(4 * miB); err != nil {
			return
		}
		tail = h.unbackedTail()
		err = h.grow(4*miB, 4*miB)
		p.noteMapping()
		holes, tailAfter = h.holes, h.unbackedTail()
	}()
	require.NoError(t, err)
	require.NotZero(t, moved)
	require.NotZero(t, tail, "the move took pages from under the free top")
	require.Zero(t, tailAfter, "the growth mapped them")
	require.Zero(t, holes)
	checkStep(t, p, d)
	c, err := p.Alloc(14 * miB)
	require.NoError(t, err)
	checkStep(t, p, d)
	require.NoError(t, p.Free(c))
	require.NoError(t, p.Free(a))
}

// The case the test above comes from, through the C ABI's defaults: the
// out-of-memory path moved pages from under the free top to serve a block
// it could not back (a full device), then grew the top for the request
// with them, leaving the top's own released pages unmapped; the request
// failed with the memory it needed mapped (its best fit, kept for last by
// the wilderness heuristic, lay on released pages the full device would
// not back), and the growth stayed reserved.
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

// A growth maps its own pages first, then the free top's released ones:
// where the device has too little memory, the first fails with nothing
// to undo, and a failed growth maps nothing either way. So a failed
// request leaves the pool no more memory, with or without OnOutOfMemory
// (whose hook keeps allocMiss from releasing what a growth left). (When
// the top was backed first, the pool with the hook kept its pages.)
func TestAFailedGrowthUnmapsTheFreeTopsPages(t *testing.T) {
	for _, hook := range []bool{false, true} {
		t.Run(fmt.Sprintf("hook=%v", hook), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: 256 * miB})
			d := onSim(sd)
			o := Options{Backend: BackendVMM}
			if hook {
				o.OnOutOfMemory = func(uint64) {}
			}
			p := openPool(t, d, o)
			a, err := p.Alloc(10 * miB)
			require.NoError(t, err)
			b, err := p.Alloc(10 * miB)
			require.NoError(t, err)
			require.NoError(t, p.Free(b))
			_, err = p.Trim() // the free top's pages released
			require.NoError(t, err)
			p.mu.Lock()
			tail := p.vmm.unbackedTail()
			p.mu.Unlock()
			require.NotZero(t, tail)
			before := p.Stats()
			// Every cuMemCreate but the first refuses: the top's pages
			// are backed, the growth's own mapping fails.
			for i := uint64(2); i < 200; i++ {
				sd.FailNth(device.CallMemCreate, i, device.ErrOutOfMemory)
			}
			_, err = p.Alloc(100 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			sd.ClearFaults()
			checkStep(t, p, d)
			after := p.Stats()
			require.LessOrEqual(t, after.Reserved, before.Reserved)
			require.Equal(t, before.ReservedPeak, after.ReservedPeak)
			require.NoError(t, p.Free(a))
		})
	}
}
