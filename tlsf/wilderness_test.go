package tlsf

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// topAndHole makes an index over [0, 64 MiB) whose free blocks are a hole
// of hole bytes at the bottom, behind an allocated guard, and the top of
// the region, top bytes; it returns the index and the hole's address.
func topAndHole(t *testing.T, wild bool, hole, top uint64) (*Index, uint64) {
	t.Helper()
	x, err := New(Config{SLLog2: 6, Wilderness: wild})
	require.NoError(t, err)
	require.NoError(t, x.AddRegion(0, 64*MiB))
	h, err := x.AllocFit(hole)
	require.NoError(t, err)
	_, err = x.AllocFit(64*MiB - hole - top) // the guard, up to the top
	require.NoError(t, err)
	_, err = x.Free(h.Addr)
	require.NoError(t, err)
	require.NoError(t, x.Check())
	return x, h.Addr
}

func TestWildernessIsTakenLast(t *testing.T) {
	// Best fit takes the tighter top; with Wilderness the hole, though
	// larger, and the top stays whole.
	x, _ := topAndHole(t, false, 8*MiB, 4*MiB)
	b, err := x.AllocFit(3 * MiB)
	require.NoError(t, err)
	require.Equal(t, uint64(60*MiB), b.Addr, "without Wilderness: the top, the tighter block")

	for _, alloc := range []func(*Index, uint64) (Block, error){(*Index).Alloc, (*Index).AllocFit, func(x *Index, n uint64) (Block, error) { return x.AllocAligned(n, 64*KiB) }} {
		x, hole := topAndHole(t, true, 8*MiB, 4*MiB)
		b, err := alloc(x, 3*MiB)
		require.NoError(t, err)
		require.Equal(t, hole, b.Addr, "with Wilderness: the hole")
		require.NoError(t, x.Check())
		last, err := x.Last(0)
		require.NoError(t, err)
		require.True(t, last.Free)
		require.Equal(t, uint64(4*MiB), last.Size, "the top untouched")

		// 5 MiB are left of the hole, 4 MiB at the top: more fits neither;
		// 5 MiB takes the hole, then 4 MiB the top.
		_, err = alloc(x, 5*MiB+1)
		require.ErrorIs(t, err, ErrNoSpace)
		b, err = x.AllocFit(5 * MiB)
		require.NoError(t, err)
		require.Equal(t, hole+3*MiB, b.Addr)
		b, err = x.AllocFit(4 * MiB)
		require.NoError(t, err)
		require.Equal(t, uint64(60*MiB), b.Addr)
		require.NoError(t, x.Check())
	}
}

func TestWildernessGrowsAndReportsItsSize(t *testing.T) {
	x, _ := topAndHole(t, true, 2*MiB, 4*MiB)
	require.Equal(t, uint64(4*MiB), x.LargestFree())
	require.Equal(t, uint64(4*MiB), x.LargestFit())
	require.Equal(t, uint64(4*MiB), x.LargestAlloc(), "4 MiB is a class boundary")

	// A growth extends the free top, which stays the wilderness.
	require.NoError(t, x.GrowRegion(0, 3*MiB))
	require.NoError(t, x.Check())
	require.Equal(t, uint64(7*MiB), x.LargestFree())
	require.Equal(t, uint64(7*MiB), x.LargestFit())
	la := x.LargestAlloc()
	require.LessOrEqual(t, la, uint64(7*MiB))
	require.Greater(t, la, uint64(6*MiB+768*KiB), "the class boundary below 7 MiB (64 lists: 64 KiB steps)")
	_, err := x.Alloc(la)
	require.NoError(t, err)
	require.NoError(t, x.Check())

	// A freed block next to the top merges into it.
	y, _ := topAndHole(t, true, 2*MiB, 4*MiB)
	b, err := y.AllocFit(4 * MiB)
	require.NoError(t, err)
	c, err := y.AllocFit(MiB) // from the hole
	require.NoError(t, err)
	require.Less(t, c.Addr, b.Addr)
	_, err = y.Free(b.Addr)
	require.NoError(t, err)
	require.NoError(t, y.Check())
	last, _ := y.Last(0)
	require.Equal(t, uint64(4*MiB), last.Size)
	require.True(t, last.Free)
}

func TestWildernessOfSeveralRegions(t *testing.T) {
	x, err := New(Config{Wilderness: true})
	require.NoError(t, err)
	require.NoError(t, x.AddRegion(0, MiB))
	require.NoError(t, x.AddRegion(16*MiB, 4*MiB))
	require.NoError(t, x.AddRegion(32*MiB, 2*MiB))
	require.NoError(t, x.Check())
	// Each region is one free block, its top: the first that holds the
	// request serves it.
	b, err := x.AllocFit(3 * MiB)
	require.NoError(t, err)
	require.Equal(t, uint64(16*MiB), b.Addr)
	b, err = x.Alloc(2 * MiB)
	require.NoError(t, err)
	require.Equal(t, uint64(32*MiB), b.Addr)
	_, err = x.Alloc(2 * MiB)
	require.ErrorIs(t, err, ErrNoSpace)
	require.NoError(t, x.Check())
	_, err = x.Free(b.Addr)
	require.NoError(t, err)
	require.NoError(t, x.RemoveRegion(32*MiB))
	require.NoError(t, x.Check())
	require.Equal(t, uint64(MiB), x.LargestFree())
}

// SetWilderness moves each region's free top to the list it belongs in
// from then on, both ways; Check holds throughout.
func TestSetWildernessMovesTheTops(t *testing.T) {
	x, hole := topAndHole(t, false, 8*MiB, 4*MiB)
	require.False(t, x.Wilderness())
	x.SetWilderness(true)
	require.True(t, x.Wilderness())
	require.NoError(t, x.Check())
	b, err := x.AllocFit(3 * MiB)
	require.NoError(t, err)
	require.Equal(t, hole, b.Addr, "the hole: the top is kept")
	_, err = x.Free(b.Addr)
	require.NoError(t, err)
	x.SetWilderness(false)
	require.NoError(t, x.Check())
	b, err = x.AllocFit(3 * MiB)
	require.NoError(t, err)
	require.Equal(t, uint64(60*MiB), b.Addr, "best fit: the tighter top")
	x.SetWilderness(false) // no change
	require.NoError(t, x.Check())
}
