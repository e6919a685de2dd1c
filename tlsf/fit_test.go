package tlsf

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// holes makes an index whose free blocks have the given sizes, each
// between two allocated guards, and returns it.
func holes(t *testing.T, sizes ...uint64) *Index {
	t.Helper()
	x := newIndex(t, 0, GiB)
	var frees []uint64
	for _, s := range sizes {
		b, err := x.AllocFit(s)
		require.NoError(t, err)
		require.Equal(t, s, b.Size)
		frees = append(frees, b.Addr)
		_, err = x.Alloc(256) // guard
		require.NoError(t, err)
	}
	_, err := x.AllocFit(x.LargestFit()) // the rest of the region
	require.NoError(t, err)
	require.Zero(t, x.Stats().Free)
	for _, a := range frees {
		_, err := x.Free(a)
		require.NoError(t, err)
	}
	require.NoError(t, x.Check())
	return x
}

func TestAllocFitTakesTheBestBlockOfTheOwnList(t *testing.T) {
	// With 32 lists per power of two, [1 MiB, 1 MiB + 32 KiB) is one list.
	x := holes(t, MiB+16*KiB, MiB, MiB+8*KiB)
	b, err := x.AllocFit(MiB + 4*KiB)
	require.NoError(t, err)
	require.Equal(t, uint64(MiB+4*KiB), b.Size, "rounded to the granularity only")
	st := x.Stats()
	// The 1 MiB + 8 KiB hole was cut, leaving 4 KiB; the others intact.
	require.Equal(t, uint64(MiB+16*KiB+MiB+4*KiB), st.Free)
	require.NoError(t, x.Check())

	// Alloc rounds up to the next class and takes none of them.
	y := holes(t, MiB+16*KiB, MiB, MiB+8*KiB)
	_, err = y.Alloc(MiB + 4*KiB)
	require.ErrorIs(t, err, ErrNoSpace)
}

func TestAllocFitFallsBackToTheNextList(t *testing.T) {
	x := holes(t, 2*MiB, MiB)
	b, err := x.AllocFit(MiB + 4*KiB)
	require.NoError(t, err)
	require.Equal(t, uint64(MiB+4*KiB), b.Size)
	require.NoError(t, x.Check())
	_, err = x.AllocFit(2 * MiB)
	require.ErrorIs(t, err, ErrNoSpace)
	_, err = x.AllocFit(0)
	require.ErrorIs(t, err, ErrInvalidSize)
}

// A block that holds the request past the first FitScan of its own list,
// where no later list has a block, is taken: AllocFit fails only when no
// free block holds the request, and LargestFit sees that block.
func TestAllocFitTakesABlockPastTheScanRatherThanFail(t *testing.T) {
	sizes := []uint64{MiB + 16*KiB} // freed first: the list's last
	for range FitScan + 1 {
		sizes = append(sizes, MiB)
	}
	x := holes(t, sizes...)
	require.Equal(t, uint64(MiB+16*KiB), x.LargestFit())
	b, err := x.AllocFit(MiB + 8*KiB)
	require.NoError(t, err)
	require.Equal(t, uint64(MiB+8*KiB), b.Size)
	require.NoError(t, x.Check())
	_, err = x.AllocFit(MiB + 16*KiB)
	require.ErrorIs(t, err, ErrNoSpace, "no block holds it now")
	require.NoError(t, x.Check())
}

func TestLargestAllocAndLargestFitAreAccepted(t *testing.T) {
	x := holes(t, 3*MiB+96*KiB, MiB)
	la := x.LargestAlloc()
	require.Equal(t, uint64(3*MiB+64*KiB), la, "the class boundary below the largest block (64 KiB classes)")
	y := holes(t, 3*MiB+96*KiB, MiB)
	_, err := y.Alloc(la)
	require.NoError(t, err)
	y = holes(t, 3*MiB+96*KiB, MiB)
	_, err = y.Alloc(la + 1)
	require.ErrorIs(t, err, ErrNoSpace)

	lf := x.LargestFit()
	require.Equal(t, uint64(3*MiB+96*KiB), lf, "AllocFit takes the largest block whole")
	_, err = x.AllocFit(lf)
	require.NoError(t, err)
	require.NoError(t, x.Check())

	empty := newIndex(t, 0, MiB)
	_, err = empty.Alloc(MiB)
	require.NoError(t, err)
	require.Zero(t, empty.LargestAlloc())
	require.Zero(t, empty.LargestFit())
}
