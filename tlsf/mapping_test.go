package tlsf

import (
	"errors"
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func defaultMapping(t *testing.T) *Index {
	x, err := New(Config{})
	require.NoError(t, err)
	return x
}

// With the defaults (G = 256, 32 lists) small sizes end at 8 KiB, and the
// power of two [2^k, 2^(k+1)) has classes 2^(k-5) wide.
func TestMappingInsertExamples(t *testing.T) {
	x := defaultMapping(t)
	cases := []struct {
		size   uint64
		fl, sl uint
	}{
		{256, 0, 1},
		{512, 0, 2},
		{8192 - 256, 0, 31},
		{8192, 1, 0},
		{8192 + 256, 1, 1},
		{16384 - 256, 1, 31},
		{16384, 2, 0},
		{16384 + 256, 2, 0}, // classes of 512 bytes from here
		{16384 + 512, 2, 1},
		{1 << 20, 8, 0},
		{3 << 19, 8, 16},
		{1 << 30, 18, 0},
		{MaxSize, 36, 0},
	}
	for _, c := range cases {
		fl, sl := x.insert(c.size)
		assert.Equal(t, [2]uint{c.fl, c.sl}, [2]uint{fl, sl}, "insert(%d)", c.size)
	}
	assert.Equal(t, uint(37), x.numFL)
}

// At every class boundary 2^k and one granule either side, for k up to 46:
// insert puts a size in the class that contains it, and search (roundUp)
// yields the smallest class boundary at or above the size.
func TestMappingAtClassBoundaries(t *testing.T) {
	for _, slLog2 := range []uint{1, 5, 6} {
		x, err := New(Config{SLLog2: slLog2})
		require.NoError(t, err)
		for k := uint(8); k <= 46; k++ {
			for _, size := range []uint64{1<<k - 256, 1 << k, 1<<k + 256} {
				if size == 0 {
					continue
				}
				t.Run(fmt.Sprintf("sl%d/2^%d%+d", slLog2, k, int64(size)-int64(1)<<k), func(t *testing.T) {
					fl, sl := x.insert(size)
					require.Less(t, fl, x.numFL)
					require.Less(t, sl, uint(1)<<slLog2)
					lo := x.classMin(fl, sl)
					assert.LessOrEqual(t, lo, size, "class lower bound")
					hi := nextClassMin(x, fl, sl)
					assert.Less(t, size, hi, "next class lower bound")

					r := x.roundUp(size)
					assert.GreaterOrEqual(t, r, size)
					rfl, rsl := x.insert(r)
					assert.Equal(t, r, x.classMin(rfl, rsl), "roundUp gives a class boundary")
					if r > size {
						// No boundary lies in [size, r): size's own class starts below it.
						assert.Less(t, lo, size)
						assert.Equal(t, hi, r)
					}
					// Rounding wastes less than one class width: 1/2^sl of the size.
					assert.Less(t, r-size, max(size>>slLog2, 256))
				})
			}
		}
	}
}

func nextClassMin(x *Index, fl, sl uint) uint64 {
	if sl+1 < 1<<x.slLog2 {
		return x.classMin(fl, sl+1)
	}
	return x.classMin(fl+1, 0)
}

// The small classes meet the first power-of-two classes without a gap.
func TestMappingContinuity(t *testing.T) {
	x := defaultMapping(t)
	prevFL, prevSL := x.insert(256)
	for size := uint64(512); size <= 1<<16; size += 256 {
		fl, sl := x.insert(size)
		idx, prev := fl<<5|sl, prevFL<<5|prevSL
		assert.True(t, idx == prev || idx == prev+1, "size %d jumps from (%d,%d) to (%d,%d)", size, prevFL, prevSL, fl, sl)
		prevFL, prevSL = fl, sl
	}
}

// Size classes number the lists in size order, and every size of a class
// rounds to the class's lower bound.
func TestSizeClass(t *testing.T) {
	x := defaultMapping(t)
	prev := -1
	for size := uint64(1); size <= 4<<20; size += 97 {
		c, r := x.SizeClass(size)
		assert.GreaterOrEqual(t, c, prev)
		prev = c
		r2, err := x.RoundUp(size)
		require.NoError(t, err)
		assert.Equal(t, r2, r)
		c2, r3 := x.SizeClass(r)
		assert.Equal(t, c, c2, "the rounded size is in the same class")
		assert.Equal(t, r, r3)
		assert.Equal(t, r, x.Classes().Size(c), "a class's size is its lower bound")
	}
	c, r := x.SizeClass(MaxSize)
	assert.Equal(t, uint64(MaxSize), r)
	assert.Equal(t, r, x.Classes().Size(c))
	for _, size := range []uint64{0, MaxSize + 1, 1<<64 - 1} {
		c, r := x.SizeClass(size)
		assert.Equal(t, -1, c, "size %d: no class", size)
		assert.Zero(t, r, "size %d", size)
	}
}

// MaxSize is a size-class boundary in every configuration, so no size of
// at most MaxSize rounds past it: ErrTooLarge means only a size above
// MaxSize.
func TestNoSizeUpToMaxSizeRoundsPastIt(t *testing.T) {
	configs := 0
	defer func() {
		if configs < 10 {
			t.Errorf("only %d configurations checked", configs)
		}
	}()
	for gl := uint(0); gl <= 30; gl += 6 {
		for sl := uint(1); sl <= MaxSLLog2; sl++ {
			x, err := New(Config{Granularity: 1 << gl, SLLog2: sl})
			if err != nil {
				continue
			}
			configs++
			for _, size := range []uint64{MaxSize, MaxSize - 1, MaxSize/2 + 1, 1} {
				r, err := x.RoundUp(size)
				if err != nil || r < size || r > MaxSize {
					t.Errorf("granularity 2^%d, SLLog2 %d: RoundUp(%d) = %d, %v", gl, sl, size, r, err)
				}
			}
			if _, err := x.RoundUp(MaxSize + 1); !errors.Is(err, ErrTooLarge) {
				t.Errorf("granularity 2^%d, SLLog2 %d: RoundUp(MaxSize+1): %v", gl, sl, err)
			}
		}
	}
}

// An address inside a free block that is not a multiple of the
// granularity is ErrUnknownAddress, not ErrDoubleFree.
func TestUnalignedAddressInFreeSpaceIsUnknown(t *testing.T) {
	x, err := New(Config{Granularity: 256, SLLog2: 4})
	if err != nil {
		t.Fatal(err)
	}
	if err := x.AddRegion(1<<20, 1<<20); err != nil {
		t.Fatal(err)
	}
	if _, err := x.Free(1<<20 + 4096); !errors.Is(err, ErrDoubleFree) {
		t.Errorf("aligned address in free space: %v, want ErrDoubleFree", err)
	}
	if _, err := x.Free(1<<20 + 4097); !errors.Is(err, ErrUnknownAddress) || errors.Is(err, ErrDoubleFree) {
		t.Errorf("unaligned address in free space: %v, want ErrUnknownAddress alone", err)
	}
}
