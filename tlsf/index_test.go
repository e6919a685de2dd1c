package tlsf

import (
	"errors"
	"math"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const (
	KiB = 1 << 10
	MiB = 1 << 20
	GiB = 1 << 30
)

// newIndex returns a default index with one region [base, base+size).
func newIndex(t *testing.T, base, size uint64) *Index {
	t.Helper()
	x, err := New(Config{})
	require.NoError(t, err)
	require.NoError(t, x.AddRegion(base, size))
	require.NoError(t, x.Check())
	return x
}

// snapshot is everything observable about an index, to assert that a
// failed operation changed nothing.
type snapshot struct {
	stats  Stats
	blocks []Block
}

func snap(x *Index) snapshot {
	s := snapshot{stats: x.Stats()}
	x.Walk(func(b Block) bool { s.blocks = append(s.blocks, b); return true })
	return s
}

func mustAlloc(t *testing.T, x *Index, size uint64) Block {
	t.Helper()
	b, err := x.Alloc(size)
	require.NoError(t, err)
	require.NoError(t, x.Check())
	return b
}

func mustFree(t *testing.T, x *Index, addr uint64) {
	t.Helper()
	_, err := x.Free(addr)
	require.NoError(t, err)
	require.NoError(t, x.Check())
}

func TestNewConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  Config
		ok   bool
	}{
		{"defaults", Config{}, true},
		{"granularity 1", Config{Granularity: 1}, true},
		{"2 MiB granularity, 64 lists", Config{Granularity: 2 * MiB, SLLog2: 6}, true},
		{"granularity not a power of two", Config{Granularity: 384}, false},
		{"granularity too large", Config{Granularity: 1 << 41}, false},
		{"too many lists", Config{SLLog2: 7}, false},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			x, err := New(c.cfg)
			if c.ok {
				require.NoError(t, err)
				require.NoError(t, x.Check())
			} else {
				require.ErrorIs(t, err, ErrBadConfig)
			}
		})
	}
}

func TestAllocSplitsAndFreeMerges(t *testing.T) {
	x := newIndex(t, 0x10000, 1*MiB)
	a := mustAlloc(t, x, 1000) // rounds to 1024
	assert.Equal(t, Block{Addr: 0x10000, Size: 1024, ID: a.ID}, a)
	b := mustAlloc(t, x, 4096)
	c := mustAlloc(t, x, 256)
	assert.Equal(t, a.Addr+a.Size, b.Addr, "split takes the block's start")
	assert.Equal(t, b.Addr+b.Size, c.Addr)
	st := x.Stats()
	assert.Equal(t, uint64(1024+4096+256), st.Allocated)
	assert.Equal(t, 3, st.AllocatedBlocks)
	assert.Equal(t, 1, st.FreeBlocks, "the remainder")

	mustFree(t, x, b.Addr) // between two allocated blocks: no merge
	assert.Equal(t, 2, x.Stats().FreeBlocks)
	mustFree(t, x, a.Addr) // merges with b's space above
	assert.Equal(t, 2, x.Stats().FreeBlocks)
	mustFree(t, x, c.Addr) // merges below and above: one block again
	st = x.Stats()
	assert.Equal(t, 1, st.FreeBlocks)
	assert.Equal(t, uint64(1*MiB), st.LargestFree)
	assert.Zero(t, st.Allocated)
}

// The TLSF bug class this index avoids: freeing a block and asking for the
// same size again must find it, even when it is the only free space.
func TestFreeThenAllocSameSizeSucceeds(t *testing.T) {
	for _, size := range []uint64{256, 8192 + 256, 100_000, 3*MiB + 12345, 1*GiB + 1} {
		x, err := New(Config{})
		require.NoError(t, err)
		r, err := x.RoundUp(size)
		require.NoError(t, err)
		require.NoError(t, x.AddRegion(0, r)) // exactly one block's worth
		b := mustAlloc(t, x, size)
		assert.Equal(t, r, b.Size)
		mustFree(t, x, b.Addr)
		b2 := mustAlloc(t, x, size)
		assert.Equal(t, b.Addr, b2.Addr)
		assert.Equal(t, b.Size, b2.Size)
	}
}

func TestAllocNoSpace(t *testing.T) {
	x := newIndex(t, 0, 64*KiB)
	mustAlloc(t, x, 40*KiB)
	before := snap(x)
	_, err := x.Alloc(40 * KiB)
	require.ErrorIs(t, err, ErrNoSpace)
	assert.Equal(t, before, snap(x))
	// Good fit: a request rounds up, so a 24 KiB hole serves 24 KiB.
	mustAlloc(t, x, 24*KiB)
}

func TestAllocAligned(t *testing.T) {
	x := newIndex(t, 0x100, 64*MiB) // base deliberately only 256-aligned
	for _, align := range []uint64{1, 256, 512, 4096, 64 * KiB, 2 * MiB} {
		b, err := x.AllocAligned(3000, align)
		require.NoError(t, err, "align %d", align)
		assert.Zero(t, b.Addr%max(align, 256), "align %d: addr %#x", align, b.Addr)
		assert.GreaterOrEqual(t, b.Size, uint64(3000))
		require.NoError(t, x.Check())
	}
	// The padding cut off in front stays usable.
	st := x.Stats()
	assert.Greater(t, st.FreeBlocks, 1)
}

func TestAllocAlignedErrors(t *testing.T) {
	x := newIndex(t, 0, 1*MiB)
	before := snap(x)
	for _, align := range []uint64{0, 3, 768, 1 << 49, math.MaxUint64} {
		_, err := x.AllocAligned(4096, align)
		require.ErrorIs(t, err, ErrBadAlignment, "align %d", align)
	}
	_, err := x.AllocAligned(4096, 2*MiB) // cannot fit the padding
	require.ErrorIs(t, err, ErrNoSpace)
	_, err = x.AllocAligned(0, 4096)
	require.ErrorIs(t, err, ErrInvalidSize)
	_, err = x.AllocAligned(MaxSize+1, 4096)
	require.ErrorIs(t, err, ErrTooLarge)
	assert.Equal(t, before, snap(x))
}

func TestSizeErrors(t *testing.T) {
	x := newIndex(t, 0, 1*MiB)
	before := snap(x)
	cases := []struct {
		size uint64
		want error
	}{
		{0, ErrInvalidSize},
		{math.MaxUint64, ErrTooLarge},
		{math.MaxUint64 - 255, ErrTooLarge},
		{1 << 63, ErrTooLarge},
		{MaxSize + 1, ErrTooLarge},
		{MaxSize + 256, ErrTooLarge},
		{MaxSize, ErrNoSpace}, // valid, but larger than the region
		{1*MiB + 1, ErrNoSpace},
	}
	for _, c := range cases {
		_, err := x.Alloc(c.size)
		require.ErrorIs(t, err, c.want, "size %d", c.size)
		_, err = x.RoundUp(c.size)
		if c.want == ErrNoSpace {
			require.NoError(t, err)
		} else {
			require.ErrorIs(t, err, c.want)
		}
	}
	assert.Equal(t, before, snap(x))
}

func TestMaxSizeBlock(t *testing.T) {
	x := newIndex(t, 1<<50, MaxSize)
	b := mustAlloc(t, x, MaxSize)
	assert.Equal(t, uint64(MaxSize), b.Size)
	mustFree(t, x, b.Addr)
}

func TestFreeErrors(t *testing.T) {
	x := newIndex(t, 0x100000, 1*MiB)
	a := mustAlloc(t, x, 4096)
	b := mustAlloc(t, x, 4096)
	mustAlloc(t, x, 4096)
	mustFree(t, x, b.Addr)
	before := snap(x)
	cases := []struct {
		name string
		addr uint64
		want error
	}{
		{"double free of a lone freed block", b.Addr, ErrDoubleFree},
		{"interior of an allocated block", a.Addr + 256, ErrUnknownAddress},
		{"misaligned interior", a.Addr + 1, ErrUnknownAddress},
		{"below every region", 0x1000, ErrUnknownAddress},
		{"above every region", 0x100000 + 1*MiB, ErrUnknownAddress},
		{"never allocated, in the free tail", 0x100000 + 512*KiB, ErrDoubleFree},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := x.Free(c.addr)
			require.ErrorIs(t, err, c.want)
			_, err = x.Lookup(c.addr)
			require.ErrorIs(t, err, c.want)
			assert.Equal(t, before, snap(x))
			require.NoError(t, x.Check())
		})
	}
	// A double free after the block merged with free neighbours.
	mustFree(t, x, a.Addr)
	_, err := x.Free(a.Addr)
	require.ErrorIs(t, err, ErrDoubleFree)
	_, err = x.Free(b.Addr)
	require.ErrorIs(t, err, ErrDoubleFree)
}

func TestIDs(t *testing.T) {
	x := newIndex(t, 0, 1*MiB)
	a := mustAlloc(t, x, 4096)
	b := mustAlloc(t, x, 4096)
	assert.NotEqual(t, a.ID, b.ID)
	assert.Less(t, a.ID, x.MaxID())
	assert.Less(t, b.ID, x.MaxID())
	got, err := x.Lookup(b.Addr)
	require.NoError(t, err)
	assert.Equal(t, b, got)
	freed, err := x.Free(b.Addr)
	require.NoError(t, err)
	assert.Equal(t, b, freed)
}

func TestRegions(t *testing.T) {
	x, err := New(Config{})
	require.NoError(t, err)
	require.NoError(t, x.AddRegion(1*MiB, 1*MiB))
	require.NoError(t, x.AddRegion(4*MiB, 1*MiB))
	require.NoError(t, x.AddRegion(2*MiB, 1*MiB)) // adjacent to the first
	require.NoError(t, x.Check())
	assert.Equal(t, []RegionInfo{{1 * MiB, 1 * MiB, 0}, {2 * MiB, 1 * MiB, 0}, {4 * MiB, 1 * MiB, 0}}, x.Regions())

	// Adjacent regions never merge: two 1 MiB regions cannot serve 2 MiB.
	_, err = x.Alloc(2 * MiB)
	require.ErrorIs(t, err, ErrNoSpace)
	assert.Equal(t, 3, x.Stats().FreeBlocks)

	// Grow the last region: its free top block grows.
	require.NoError(t, x.GrowRegion(4*MiB, 1*MiB))
	require.NoError(t, x.Check())
	b := mustAlloc(t, x, 2*MiB)
	assert.Equal(t, uint64(4*MiB), b.Addr)
	// Grow it again while its top is allocated: a new free block.
	require.NoError(t, x.GrowRegion(4*MiB, 256*KiB))
	require.NoError(t, x.Check())
	info, ok := x.RegionOf(4*MiB + 2*MiB + 1)
	require.True(t, ok)
	assert.Equal(t, RegionInfo{4 * MiB, 2*MiB + 256*KiB, 2 * MiB}, info)

	// A busy region stays; a free one goes.
	require.ErrorIs(t, x.RemoveRegion(4*MiB), ErrRegionBusy)
	require.NoError(t, x.RemoveRegion(2*MiB))
	require.NoError(t, x.Check())
	mustFree(t, x, b.Addr)
	require.NoError(t, x.RemoveRegion(4*MiB))
	require.NoError(t, x.Check())
	assert.Equal(t, []RegionInfo{{1 * MiB, 1 * MiB, 0}}, x.Regions())
	// The freed address range can hold a new region.
	require.NoError(t, x.AddRegion(2*MiB, 3*MiB))
	require.NoError(t, x.Check())
}

func TestRegionErrors(t *testing.T) {
	x, err := New(Config{})
	require.NoError(t, err)
	require.NoError(t, x.AddRegion(4*MiB, 4*MiB))
	require.NoError(t, x.AddRegion(16*MiB, 4*MiB))
	before := snap(x)
	add := []struct {
		name       string
		base, size uint64
		want       error
	}{
		{"zero size", 0, 0, ErrBadRegion},
		{"smaller than the minimum block", 0, 255, ErrBadRegion},
		{"misaligned base", 100, 4096, ErrBadRegion},
		{"misaligned size", 0, 4096 + 1, ErrBadRegion},
		{"above MaxSize", 0, MaxSize + 256, ErrBadRegion},
		{"wraps around 2^64", math.MaxUint64 - 4095, 8192, ErrBadRegion},
		{"overlaps from below", 3 * MiB, 2 * MiB, ErrRegionOverlap},
		{"inside", 5 * MiB, 1 * MiB, ErrRegionOverlap},
		{"covers", 0, 32 * MiB, ErrRegionOverlap},
		{"overlaps from above", 7 * MiB, 2 * MiB, ErrRegionOverlap},
		{"same base", 4 * MiB, 4 * MiB, ErrRegionOverlap},
	}
	for _, c := range add {
		require.ErrorIs(t, x.AddRegion(c.base, c.size), c.want, c.name)
	}
	require.ErrorIs(t, x.GrowRegion(5*MiB, 4096), ErrBadRegion, "no region starts there")
	require.ErrorIs(t, x.GrowRegion(4*MiB, 0), ErrBadRegion)
	require.ErrorIs(t, x.GrowRegion(4*MiB, 100), ErrBadRegion)
	require.ErrorIs(t, x.GrowRegion(4*MiB, 8*MiB+256), ErrRegionOverlap)
	require.ErrorIs(t, x.GrowRegion(16*MiB, MaxSize), ErrBadRegion)
	require.ErrorIs(t, x.RemoveRegion(5*MiB), ErrBadRegion)
	assert.Equal(t, before, snap(x))
	require.NoError(t, x.Check())
	// Growing exactly up to the next region is fine.
	require.NoError(t, x.GrowRegion(4*MiB, 8*MiB))
	require.NoError(t, x.Check())
}

// Regions and requests of exactly a size-class boundary, and one granule
// either side: a request fits a region of its own size exactly when the
// size is a class boundary (good fit rounds the rest up), and the region
// always serves the largest boundary it holds.
func TestClassBoundaryRegions(t *testing.T) {
	for k := uint(9); k <= 40; k++ {
		for _, size := range []uint64{1<<k - 256, 1 << k, 1<<k + 256} {
			x, err := New(Config{})
			require.NoError(t, err)
			require.NoError(t, x.AddRegion(1<<44, size))
			r, err := x.RoundUp(size)
			require.NoError(t, err)
			b, err := x.Alloc(size)
			if r > size {
				require.ErrorIs(t, err, ErrNoSpace, "region and request of %d bytes", size)
				fl, sl := x.insert(size)
				b, err = x.Alloc(x.classMin(fl, sl))
			}
			require.NoError(t, err, "region of %d bytes", size)
			require.NoError(t, x.Check())
			if b.Size == size {
				_, err = x.Alloc(256)
				require.ErrorIs(t, err, ErrNoSpace)
			}
			mustFree(t, x, b.Addr)
			assert.Equal(t, size, x.LargestFree())
		}
	}
}

func TestWalkStops(t *testing.T) {
	x := newIndex(t, 0, 1*MiB)
	mustAlloc(t, x, 4096)
	mustAlloc(t, x, 4096)
	n := 0
	x.Walk(func(Block) bool { n++; return false })
	assert.Equal(t, 1, n)
}

// Check catches corruption (a sample of the invariants).
func TestCheckDetectsCorruption(t *testing.T) {
	corrupt := []struct {
		name   string
		break_ func(x *Index)
	}{
		{"bitmap bit cleared", func(x *Index) { x.flBitmap = 0 }},
		{"size changed", func(x *Index) { x.blocks[x.reg.slots[0].first].size += 256 }},
		{"allocated count", func(x *Index) { x.allocated++ }},
		{"address table entry lost", func(x *Index) { x.live.Take(x.blocks[x.reg.slots[0].first].addr) }},
		{"free block marked allocated", func(x *Index) { x.blocks[x.reg.slots[0].last].prevFree = allocMark }},
	}
	for _, c := range corrupt {
		t.Run(c.name, func(t *testing.T) {
			x := newIndex(t, 0, 1*MiB)
			mustAlloc(t, x, 4096)
			c.break_(x)
			err := x.Check()
			require.Error(t, err)
			assert.True(t, errors.Is(err, ErrCorrupt))
		})
	}
}

func TestLast(t *testing.T) {
	x := newIndex(t, 1*MiB, 1*MiB)
	last, err := x.Last(1 * MiB)
	require.NoError(t, err)
	assert.Equal(t, Block{Addr: 1 * MiB, Size: 1 * MiB, Free: true, ID: last.ID}, last)
	b := mustAlloc(t, x, 1*MiB-16*KiB) // a class boundary: no rounding
	last, err = x.Last(1 * MiB)
	require.NoError(t, err)
	assert.True(t, last.Free)
	assert.Equal(t, uint64(16*KiB), last.Size)
	mustAlloc(t, x, 16*KiB)
	last, err = x.Last(1 * MiB)
	require.NoError(t, err)
	assert.False(t, last.Free)
	assert.NotEqual(t, b.Addr, last.Addr)
	_, err = x.Last(0)
	require.ErrorIs(t, err, ErrBadRegion)
}

// The top address of the address space is never a block start (blocks end
// at or below 2^64−1), and asking for it changes nothing.
func TestFreeOfTheTopAddress(t *testing.T) {
	x := newIndex(t, 0, 1*MiB)
	mustAlloc(t, x, 4096)
	before := snap(x)
	_, err := x.Free(math.MaxUint64)
	require.ErrorIs(t, err, ErrUnknownAddress)
	_, err = x.Lookup(math.MaxUint64)
	require.ErrorIs(t, err, ErrUnknownAddress)
	assert.Equal(t, before, snap(x))
}

// A tag is the caller's while its block is allocated: 0 from the
// allocation on (a recycled record's old tag is gone), through Detach and
// Attach, and nothing at all for a free block or an ID beyond MaxID,
// whose SetTag changes nothing. Tags never reach the free lists: blocks
// freed with one merge and are listed as any other.
func TestTags(t *testing.T) {
	x := newIndex(t, 0, 1*MiB)
	a := mustAlloc(t, x, 64*KiB)
	b := mustAlloc(t, x, 64*KiB)
	assert.Zero(t, x.Tag(a.ID))
	require.True(t, x.SetTag(a.ID, 7))
	require.True(t, x.SetTag(b.ID, math.MaxUint32))
	assert.Equal(t, uint32(7), x.Tag(a.ID))
	assert.Equal(t, uint32(math.MaxUint32), x.Tag(b.ID))
	require.NoError(t, x.Check())

	d, err := x.Detach(a.Addr)
	require.NoError(t, err)
	assert.Equal(t, uint32(7), x.Tag(d.ID))
	x.Attach(d)
	assert.Equal(t, uint32(7), x.Tag(a.ID))

	last, err := x.Last(0)
	require.NoError(t, err)
	require.True(t, last.Free)
	before := snap(x)
	assert.False(t, x.SetTag(last.ID, 9), "a free block has no tag")
	assert.Zero(t, x.Tag(last.ID))
	assert.False(t, x.SetTag(x.MaxID(), 9))
	assert.Zero(t, x.Tag(x.MaxID()))
	assert.Equal(t, before, snap(x))
	require.NoError(t, x.Check())

	_, err = x.Free(a.Addr)
	require.NoError(t, err)
	_, err = x.Free(b.Addr)
	require.NoError(t, err)
	require.NoError(t, x.Check())
	assert.Equal(t, 1, x.Stats().FreeBlocks, "freed tagged blocks merge into one")

	c := mustAlloc(t, x, 64*KiB) // a record a tagged block had
	assert.Zero(t, x.Tag(c.ID))
	require.True(t, x.SetTag(c.ID, 3))
	_, err = x.Free(c.Addr)
	require.NoError(t, err)
	e, err := x.AllocFit(64 * KiB) // best fit's path, as the pool's
	require.NoError(t, err)
	assert.Zero(t, x.Tag(e.ID))
	require.NoError(t, x.Check())
}
