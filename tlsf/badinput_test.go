package tlsf_test

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gpumem/tlsf/tlsf"
)

// The bad-input matrix of the index: every public call with arguments out
// of range must fail with the documented sentinel and change nothing:
// Check passes, and the statistics, blocks and regions are as before.

const (
	kib = 1 << 10
	mib = 1 << 20
)

// view is everything observable about an index.
type view struct {
	stats   tlsf.Stats
	blocks  []tlsf.Block
	regions []tlsf.RegionInfo
	maxID   uint32
}

func observe(x *tlsf.Index) view {
	v := view{stats: x.Stats(), regions: x.Regions(), maxID: x.MaxID()}
	x.Walk(func(b tlsf.Block) bool {
		if b.Free {
			b.ID = 0 // meaningless for free blocks
		}
		v.blocks = append(v.blocks, b)
		return true
	})
	return v
}

func (a view) equal(b view) bool {
	return a.stats == b.stats && a.maxID == b.maxID && slices.Equal(a.blocks, b.blocks) && slices.Equal(a.regions, b.regions)
}

// matrixIndex is an index of granularity gran with two regions, [1 MiB,
// 5 MiB) and [8 MiB, 9 MiB), holding allocated blocks, free blocks between
// them, and a block freed and merged with its neighbour.
type matrixIndex struct {
	x            *tlsf.Index
	gran         uint64
	live         []tlsf.Block
	freed        uint64 // freed, now inside a larger free block
	freeInMiddle uint64 // never allocated, in free space
}

func newMatrixIndex(t *testing.T, gran uint64) *matrixIndex {
	t.Helper()
	x, err := tlsf.New(tlsf.Config{Granularity: gran})
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(x.AddRegion(1*mib, 4*mib))
	must(x.AddRegion(8*mib, 1*mib))
	m := &matrixIndex{x: x, gran: gran}
	for _, size := range []uint64{1, 3 * gran, 64 * kib, 100 * kib, 1*mib + 1} {
		b, err := x.Alloc(size)
		must(err)
		m.live = append(m.live, b)
	}
	// Free the second and third: they merge into one free block.
	for _, b := range m.live[1:3] {
		_, err := x.Free(b.Addr)
		must(err)
	}
	m.freed = m.live[2].Addr
	m.freeInMiddle = m.live[1].Addr + gran
	m.live = append(m.live[:1], m.live[3:]...)
	must(x.Check())
	return m
}

// indexCase is a call on an index and the sentinel it must fail with.
type indexCase struct {
	name string
	want error
	call func(m *matrixIndex) error
}

func allocC(size uint64, want error) indexCase {
	return indexCase{fmt.Sprintf("Alloc(%d)", size), want, func(m *matrixIndex) error { _, err := m.x.Alloc(size); return err }}
}

func roundC(size uint64, want error) indexCase {
	return indexCase{fmt.Sprintf("RoundUp(%d)", size), want, func(m *matrixIndex) error { _, err := m.x.RoundUp(size); return err }}
}

func alignedC(size, align uint64, want error) indexCase {
	return indexCase{fmt.Sprintf("AllocAligned(%d, %d)", size, align), want, func(m *matrixIndex) error {
		_, err := m.x.AllocAligned(size, align)
		return err
	}}
}

func freeC(name string, want error, addr func(m *matrixIndex) uint64) indexCase {
	return indexCase{name, want, func(m *matrixIndex) error {
		a := addr(m)
		_, ferr := m.x.Free(a)
		_, lerr := m.x.Lookup(a)
		if !errors.Is(lerr, want) {
			return fmt.Errorf("Lookup disagrees with Free: %w", lerr)
		}
		return ferr
	}}
}

func addC(name string, base, size func(m *matrixIndex) uint64, want error) indexCase {
	return indexCase{name, want, func(m *matrixIndex) error { return m.x.AddRegion(base(m), size(m)) }}
}

func growC(name string, base, extra func(m *matrixIndex) uint64, want error) indexCase {
	return indexCase{name, want, func(m *matrixIndex) error { return m.x.GrowRegion(base(m), extra(m)) }}
}

func val(v uint64) func(*matrixIndex) uint64 { return func(*matrixIndex) uint64 { return v } }
func gran(k uint64) func(*matrixIndex) uint64 {
	return func(m *matrixIndex) uint64 { return k * m.gran }
}

var indexCases = []indexCase{
	allocC(0, tlsf.ErrInvalidSize),
	allocC(math.MaxUint64, tlsf.ErrTooLarge),
	allocC(math.MaxUint64-254, tlsf.ErrTooLarge), // 2^64−255: rounding up to 256 overflows
	allocC(1<<63, tlsf.ErrTooLarge),
	allocC(tlsf.MaxSize+256, tlsf.ErrTooLarge), // one granule (at 256 B) above MaxSize
	allocC(tlsf.MaxSize+1, tlsf.ErrTooLarge),
	allocC(tlsf.MaxSize, tlsf.ErrNoSpace), // valid, but no room: also changes nothing
	roundC(0, tlsf.ErrInvalidSize),
	roundC(math.MaxUint64, tlsf.ErrTooLarge),
	roundC(tlsf.MaxSize+256, tlsf.ErrTooLarge),

	alignedC(4096, 0, tlsf.ErrBadAlignment),
	alignedC(4096, 3, tlsf.ErrBadAlignment),
	alignedC(4096, 6, tlsf.ErrBadAlignment),
	alignedC(4096, 3<<12, tlsf.ErrBadAlignment),
	alignedC(4096, tlsf.MaxSize*2, tlsf.ErrBadAlignment), // a power of two above the maximum
	alignedC(4096, 1<<63, tlsf.ErrBadAlignment),
	alignedC(4096, math.MaxUint64, tlsf.ErrBadAlignment),
	alignedC(0, 0, tlsf.ErrBadAlignment), // the alignment is checked first
	alignedC(0, 4096, tlsf.ErrInvalidSize),
	alignedC(math.MaxUint64, 4096, tlsf.ErrTooLarge),
	alignedC(tlsf.MaxSize+256, 256, tlsf.ErrTooLarge),
	alignedC(4096, tlsf.MaxSize, tlsf.ErrNoSpace), // the largest alignment: valid, no room

	freeC("double free of a block merged with a neighbour", tlsf.ErrDoubleFree, func(m *matrixIndex) uint64 { return m.freed }),
	freeC("never allocated, in free space", tlsf.ErrDoubleFree, func(m *matrixIndex) uint64 { return m.freeInMiddle }),
	freeC("interior, one granule in", tlsf.ErrUnknownAddress, func(m *matrixIndex) uint64 { return m.live[2].Addr + m.gran }),
	freeC("interior, one byte in", tlsf.ErrUnknownAddress, func(m *matrixIndex) uint64 { return m.live[2].Addr + 1 }),
	freeC("misaligned, in free space", tlsf.ErrUnknownAddress, func(m *matrixIndex) uint64 { return m.freeInMiddle + 1 }),
	freeC("below every region", tlsf.ErrUnknownAddress, val(0)),
	freeC("between the regions", tlsf.ErrUnknownAddress, val(6*mib)),
	freeC("at the end of a region", tlsf.ErrUnknownAddress, val(5*mib)),
	freeC("above every region", tlsf.ErrUnknownAddress, val(9*mib)),
	freeC("the top of the address space", tlsf.ErrUnknownAddress, val(math.MaxUint64)),

	addC("zero bytes", val(16*mib), val(0), tlsf.ErrBadRegion),
	addC("half a granule: below the minimum block", val(16*mib), func(m *matrixIndex) uint64 { return m.gran / 2 }, tlsf.ErrBadRegion),
	addC("a granule less one byte", val(16*mib), func(m *matrixIndex) uint64 { return m.gran - 1 }, tlsf.ErrBadRegion),
	addC("a granule and one byte", val(16*mib), func(m *matrixIndex) uint64 { return m.gran + 1 }, tlsf.ErrBadRegion),
	addC("misaligned base", val(16*mib+128), gran(4), tlsf.ErrBadRegion),
	addC("one granule above MaxSize", val(1<<56), func(m *matrixIndex) uint64 { return tlsf.MaxSize + m.gran }, tlsf.ErrBadRegion),
	addC("wrapping around 2^64", func(m *matrixIndex) uint64 { return 0 - 2*m.gran }, gran(3), tlsf.ErrBadRegion),
	addC("ending exactly at 2^64", func(m *matrixIndex) uint64 { return 0 - 2*m.gran }, gran(2), tlsf.ErrBadRegion),
	addC("overlapping a region's start", val(0), val(1*mib+4096), tlsf.ErrRegionOverlap),
	addC("overlapping a region's end", val(5*mib-4096), val(1*mib), tlsf.ErrRegionOverlap),
	addC("inside a region", val(2*mib), val(4096), tlsf.ErrRegionOverlap),
	addC("covering both regions", val(0), val(16*mib), tlsf.ErrRegionOverlap),
	addC("the same base", val(8*mib), val(4096), tlsf.ErrRegionOverlap),

	growC("no region starts there", val(2*mib), gran(1), tlsf.ErrBadRegion),
	growC("by zero", val(1*mib), val(0), tlsf.ErrBadRegion),
	growC("by half a granule", val(1*mib), func(m *matrixIndex) uint64 { return m.gran / 2 }, tlsf.ErrBadRegion),
	growC("by a granule and one byte", val(1*mib), func(m *matrixIndex) uint64 { return m.gran + 1 }, tlsf.ErrBadRegion),
	growC("into the next region", val(1*mib), val(3*mib+4096), tlsf.ErrRegionOverlap),
	growC("beyond MaxSize", val(8*mib), val(tlsf.MaxSize), tlsf.ErrBadRegion),
	growC("around 2^64", val(8*mib), func(m *matrixIndex) uint64 { return math.MaxUint64 - 8*mib - m.gran + 1 }, tlsf.ErrBadRegion),

	{"RemoveRegion where no region starts", tlsf.ErrBadRegion, func(m *matrixIndex) error { return m.x.RemoveRegion(2 * mib) }},
	{"RemoveRegion of a busy region", tlsf.ErrRegionBusy, func(m *matrixIndex) error { return m.x.RemoveRegion(1 * mib) }},
	{"Last where no region starts", tlsf.ErrBadRegion, func(m *matrixIndex) error { _, err := m.x.Last(3 * mib); return err }},
}

func TestIndexBadInputChangesNothing(t *testing.T) {
	for _, g := range []uint64{256, 4096} {
		t.Run(fmt.Sprintf("granularity %d", g), func(t *testing.T) {
			m := newMatrixIndex(t, g)
			for _, c := range indexCases {
				t.Run(c.name, func(t *testing.T) {
					before := observe(m.x)
					err := c.call(m)
					if !errors.Is(err, c.want) {
						t.Fatalf("got %v, want %v", err, c.want)
					}
					if err := m.x.Check(); err != nil {
						t.Fatal(err)
					}
					if after := observe(m.x); !after.equal(before) {
						t.Fatalf("failed with %v but changed the index:\nbefore %+v\nafter  %+v", err, before, after)
					}
				})
			}
		})
	}
}

func TestIndexBadConfig(t *testing.T) {
	cases := []struct {
		name string
		cfg  tlsf.Config
		want error
	}{
		{"granularity 3", tlsf.Config{Granularity: 3}, tlsf.ErrBadConfig},
		{"granularity 2^41", tlsf.Config{Granularity: 1 << 41}, tlsf.ErrBadConfig},
		{"granularity 2^63", tlsf.Config{Granularity: 1 << 63}, tlsf.ErrBadConfig},
		{"granularity 2^64−1", tlsf.Config{Granularity: math.MaxUint64}, tlsf.ErrBadConfig},
		{"SLLog2 one above the maximum", tlsf.Config{SLLog2: tlsf.MaxSLLog2 + 1}, tlsf.ErrBadConfig},
		{"SLLog2 64", tlsf.Config{SLLog2: 64}, tlsf.ErrBadConfig},
		// Zero selects the defaults; the extremes are valid.
		{"zero config", tlsf.Config{}, nil},
		{"granularity 1", tlsf.Config{Granularity: 1, SLLog2: 1}, nil},
		{"granularity 2^40, 64 lists", tlsf.Config{Granularity: 1 << 40, SLLog2: tlsf.MaxSLLog2}, nil},
	}
	for _, c := range cases {
		x, err := tlsf.New(c.cfg)
		if !errors.Is(err, c.want) || (err == nil) != (x != nil) {
			t.Fatalf("New(%s): %v, %v; want %v", c.name, x, err, c.want)
		}
		if c.cfg == (tlsf.Config{}) && (x.Granularity() != tlsf.DefaultGranularity || x.SecondLevelLists() != 1<<tlsf.DefaultSLLog2) {
			t.Fatalf("the zero config gives granularity %d and %d lists", x.Granularity(), x.SecondLevelLists())
		}
	}
}

// Regions and growths of exactly a size-class boundary 2^k and one
// granule either side: added whole as one free block, grown into one free
// block when the top is free and into a new free block when it is not; a
// request of the region's own size fits exactly when the size is a class
// boundary.
func TestIndexClassBoundaryRegionsAndGrowth(t *testing.T) {
	for _, g := range []uint64{256, 4096} {
		for k := uint(12); k <= 40; k += 4 {
			for _, d := range []int64{-1, 0, 1} {
				size := uint64(int64(1)<<k + d*int64(g))
				if size < g {
					continue // 2^k − g is zero: TestIndexBadInputChangesNothing
				}
				name := fmt.Sprintf("granularity %d, 2^%d%+d granules", g, k, d)
				x, err := tlsf.New(tlsf.Config{Granularity: g})
				if err != nil {
					t.Fatal(err)
				}
				const base = 1 << 44
				if err := x.AddRegion(base, size); err != nil {
					t.Fatalf("%s: AddRegion: %v", name, err)
				}
				expectFree(t, name, x, []uint64{size})
				r, _ := x.RoundUp(size)
				b, err := x.Alloc(size)
				if (r == size) != (err == nil) || err != nil && !errors.Is(err, tlsf.ErrNoSpace) {
					t.Fatalf("%s: Alloc of the region's size (rounded %d): %v", name, r, err)
				}
				// Grow by the same odd size: the free top (or the new block
				// above the full region) takes it.
				if err := x.GrowRegion(base, size); err != nil {
					t.Fatalf("%s: GrowRegion: %v", name, err)
				}
				if err == nil {
					expectFree(t, name+" grown above a full region", x, []uint64{size})
					if _, err := x.Free(b.Addr); err != nil {
						t.Fatal(err)
					}
				}
				expectFree(t, name+" grown", x, []uint64{2 * size})
				if err := x.RemoveRegion(base); err != nil {
					t.Fatalf("%s: RemoveRegion: %v", name, err)
				}
				if err := x.Check(); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}

// expectFree checks the index's free blocks, in address order.
func expectFree(t *testing.T, name string, x *tlsf.Index, want []uint64) {
	t.Helper()
	if err := x.Check(); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	var got []uint64
	x.Walk(func(b tlsf.Block) bool {
		if b.Free {
			got = append(got, b.Size)
		}
		return true
	})
	if !slices.Equal(got, want) {
		t.Fatalf("%s: free blocks %v, want %v", name, got, want)
	}
	if x.LargestFree() != slices.Max(want) {
		t.Fatalf("%s: LargestFree %d, want %d", name, x.LargestFree(), slices.Max(want))
	}
}
