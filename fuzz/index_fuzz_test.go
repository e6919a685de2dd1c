package fuzz

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"math/bits"
	"slices"
	"testing"

	"github.com/gpumem/tlsf/internal/bestfit"
	"github.com/gpumem/tlsf/tlsf"
)

// FuzzIndex runs a program of region and block operations on a TLSF index
// and on the plain reference allocator (internal/bestfit), the way
// tlsf/rapid_test.go does, and checks after every operation that:
//
//   - the index's Check passes;
//   - every placement the index makes lies in the reference's free space
//     (it is Taken from a bestfit free list), so no two live blocks
//     overlap and none lies outside the regions;
//   - the index's free blocks equal the reference's coalesced free list,
//     and its allocated blocks, IDs, statistics and regions agree;
//   - a block's size is its request rounded up to the size class, as
//     computed here from the documented classes;
//   - Alloc fails with ErrNoSpace exactly when no free block holds the
//     rounded size, and AllocAligned only when no free block holds the
//     rounded size plus the alignment slack;
//   - every bad input (a zero, huge or misaligned size; a bad alignment;
//     a double, interior or foreign free; an overlapping, misaligned,
//     wrapping or oversized region) fails with the documented sentinel and
//     changes nothing.
//
// Input: two configuration bytes (granularity 2^0 to 2^12 and SLLog2; with
// the top bit of the first, a raw and possibly invalid Config follows),
// then operations: an opcode byte (the constants below) and its arguments.
// Seeds are in testdata/fuzz/FuzzIndex.
func FuzzIndex(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		runIndex(t, in)
	})
}

// Index opcodes, one byte each, taken modulo numIndexOps.
const (
	opAddRegion = iota
	opAddOddRegion
	opGrowRegion
	opRemoveRegion
	opAlloc
	opAlloc2
	opAllocAligned
	opFree
	opFree2
	opBadFree
	opFreeTwice
	numIndexOps
)

// indexModel mirrors an Index into the reference allocator.
type indexModel struct {
	t      testing.TB
	x      *tlsf.Index
	ref    *bestfit.Allocator
	g      uint64 // granularity
	gLog2  uint
	slLog2 uint
	span   uint64            // bytes between region slots of the small space
	regs   map[uint64]uint64 // region base → size
	live   map[uint64]tlsf.Block
	freed  []uint64 // recently freed addresses, newest last
}

func runIndex(t testing.TB, in []byte) {
	r := &reader{b: in}
	cfgByte, slByte := r.u8(), r.u8()
	cfg := tlsf.Config{Granularity: 1 << (cfgByte % 13), SLLog2: 1 + uint(slByte)%tlsf.MaxSLLog2}
	if cfgByte&0x80 != 0 {
		// A raw configuration, valid or not.
		cfg = tlsf.Config{Granularity: r.u64() >> (r.u8() % 64), SLLog2: uint(slByte % 9)}
	}
	cfg.Wilderness = cfgByte&0x40 != 0
	x, err := tlsf.New(cfg)
	if want := configError(cfg); want != nil || err != nil {
		if !errors.Is(err, want) || want == nil {
			t.Fatalf("New(%+v): %v, want %v", cfg, err, want)
		}
		return
	}
	if cfg.Granularity == 0 {
		cfg.Granularity = tlsf.DefaultGranularity
	}
	if cfg.SLLog2 == 0 {
		cfg.SLLog2 = tlsf.DefaultSLLog2
	}
	if x.Granularity() != cfg.Granularity || x.SecondLevelLists() != 1<<cfg.SLLog2 {
		t.Fatalf("New(%+v): granularity %d, %d lists", cfg, x.Granularity(), x.SecondLevelLists())
	}
	g := cfg.Granularity
	m := &indexModel{
		t: t, x: x, ref: bestfit.New(g), g: g,
		gLog2: uint(bits.TrailingZeros64(g)), slLog2: cfg.SLLog2,
		span: 1024 * g, regs: map[uint64]uint64{}, live: map[uint64]tlsf.Block{},
	}
	m.check("new")
	for n := 0; n < maxOps && r.more(); n++ {
		op := int(r.u8()) % numIndexOps
		name := m.step(r, op)
		m.check(fmt.Sprintf("op %d: %s", n, name))
	}
	// Free everything: the regions must come back whole and removable.
	for _, a := range slices.Sorted(maps.Keys(m.live)) {
		m.free(a)
	}
	m.check("final frees")
	for _, b := range slices.Sorted(maps.Keys(m.regs)) {
		if err := m.x.RemoveRegion(b); err != nil {
			t.Fatalf("removing the free region at %#x: %v", b, err)
		}
		delete(m.regs, b)
		m.ref.RemoveRegion(b)
	}
	m.check("final removals")
	if st := m.x.Stats(); st != (tlsf.Stats{}) {
		t.Fatalf("empty index has stats %+v", st)
	}
}

// configError is the error New must return for cfg, from Config's
// documented ranges.
func configError(cfg tlsf.Config) error {
	g, s := cfg.Granularity, cfg.SLLog2
	if g == 0 {
		g = tlsf.DefaultGranularity
	}
	if s == 0 {
		s = tlsf.DefaultSLLog2
	}
	if bits.OnesCount64(g) != 1 || g > 1<<40 || s > tlsf.MaxSLLog2 || uint(bits.TrailingZeros64(g))+s > 47 {
		return tlsf.ErrBadConfig
	}
	return nil
}

// step decodes and runs one operation, returning its description.
func (m *indexModel) step(r *reader, op int) string {
	switch op {
	case opAddRegion:
		base := uint64(r.intn(32))*m.span + uint64(r.intn(4))*m.g
		size := (1 + uint64(r.intn(3072))) * m.g
		m.addRegion(base, size)
		return fmt.Sprintf("AddRegion(%#x, %d)", base, size)
	case opAddOddRegion:
		base, size := m.oddRegion(r)
		m.addRegion(base, size)
		return fmt.Sprintf("AddRegion(%#x, %d)", base, size)
	case opGrowRegion:
		base := m.someBase(r)
		extra := m.growth(r)
		m.growRegion(base, extra)
		return fmt.Sprintf("GrowRegion(%#x, %d)", base, extra)
	case opRemoveRegion:
		base := m.someBase(r)
		m.removeRegion(base)
		return fmt.Sprintf("RemoveRegion(%#x)", base)
	case opAlloc, opAlloc2:
		size := r.size(m.g, m.topLog2(r))
		m.alloc(size)
		return fmt.Sprintf("Alloc(%d)", size)
	case opAllocAligned:
		size := r.size(m.g, m.topLog2(r))
		align := m.alignment(r)
		m.allocAligned(size, align)
		return fmt.Sprintf("AllocAligned(%d, %d)", size, align)
	case opFree, opFree2:
		if len(m.live) == 0 {
			return "nothing to free"
		}
		addrs := slices.Sorted(maps.Keys(m.live))
		a := addrs[r.intn(len(addrs))]
		m.free(a)
		return fmt.Sprintf("Free(%#x)", a)
	case opBadFree:
		a := m.badAddress(r)
		if _, ok := m.live[a]; ok {
			return "bad free hit a live block"
		}
		m.badFree(a)
		return fmt.Sprintf("bad Free(%#x)", a)
	case opFreeTwice:
		if len(m.live) == 0 {
			return "nothing to free twice"
		}
		addrs := slices.Sorted(maps.Keys(m.live))
		a := addrs[r.intn(len(addrs))]
		m.free(a)
		m.check("first free")
		m.badFree(a)
		return fmt.Sprintf("Free(%#x) twice", a)
	}
	panic("unreachable")
}

// topLog2 is the log2 of the largest interesting request: about the
// small space's regions, or, rarely, MaxSize.
func (m *indexModel) topLog2(r *reader) uint {
	if r.u8() == 0xff {
		return 48
	}
	return m.gLog2 + 13
}

// oddRegion decodes a region that tests a boundary: a size of exactly a
// size class boundary or a granule either side of one, a huge region far
// above the small space, one that wraps around 2^64, or one that is
// empty, smaller than a granule or misaligned.
func (m *indexModel) oddRegion(r *reader) (base, size uint64) {
	g := m.g
	base = uint64(r.intn(32))*m.span + uint64(r.intn(4))*g
	switch r.u8() % 6 {
	case 0, 1:
		k := m.gLog2 + uint(r.intn(13))
		size = uint64(1)<<k + (uint64(r.intn(3))-1)*g // 2^k − g, 2^k, 2^k + g
		if size == 0 {
			size = g
		}
	case 2:
		base = 1<<56 + uint64(r.intn(4))<<49
		size = pick(r, uint64(tlsf.MaxSize), tlsf.MaxSize-g, tlsf.MaxSize+g, 1<<47, 1<<47+g)
	case 3:
		k := 1 + uint64(r.intn(4))
		base = -k * g // the top k granules below 2^64
		size = (k + uint64(r.intn(2))) * g
	case 4:
		size = pick(r, 0, g/2, g+1, g-1, 1)
	default:
		base += uint64(r.intn(int(min(g, 256))))
		size = (1 + uint64(r.intn(64))) * g
	}
	return base, size
}

// someBase returns a region's base, or now and then an address that is
// no region's base.
func (m *indexModel) someBase(r *reader) uint64 {
	bases := slices.Sorted(maps.Keys(m.regs))
	i := r.intn(len(bases) + 1)
	if i == len(bases) {
		return uint64(r.intn(32))*m.span + m.g*uint64(r.intn(2))
	}
	return bases[i]
}

// growth decodes the extra bytes of a GrowRegion.
func (m *indexModel) growth(r *reader) uint64 {
	g := m.g
	switch r.u8() % 8 {
	case 0:
		return pick(r, 0, g/2, g+1, tlsf.MaxSize, math.MaxUint64-g+1)
	case 1, 2:
		k := m.gLog2 + uint(r.intn(13))
		return uint64(1)<<k + (uint64(r.intn(3))-1)*g
	default:
		return (1 + uint64(r.intn(512))) * g
	}
}

// alignment decodes an alignment: mostly powers of two around the
// granularity, sometimes 0, a non-power of two, or one above MaxSize.
func (m *indexModel) alignment(r *reader) uint64 {
	switch r.u8() % 8 {
	case 0:
		return pick(r, 0, 3, 6, 1<<49, 1<<63, math.MaxUint64, uint64(tlsf.MaxSize)+1)
	default:
		return uint64(1) << (m.gLog2 - min(m.gLog2, 2) + uint(r.intn(16)))
	}
}

// roundUp is the size a request of size bytes receives, derived from the
// documented size classes: multiples of the granularity below
// 2^(gLog2+slLog2); above, each power of two [2^t, 2^(t+1)) cut into
// 2^slLog2 classes of width 2^(t−slLog2). A request gets the smallest class
// lower bound at or above it.
func (m *indexModel) roundUp(size uint64) uint64 {
	width := m.g
	if size >= 1<<(m.gLog2+m.slLog2) {
		width = uint64(1) << (uint(bits.Len64(size)) - 1 - m.slLog2)
	}
	return (size + width - 1) / width * width
}

func (m *indexModel) overlaps(base, size uint64) bool {
	for b, s := range m.regs {
		if base < b+s && b < base+size {
			return true
		}
	}
	return false
}

// regionError is what AddRegion(base, size) must return.
func (m *indexModel) regionError(base, size uint64) error {
	switch {
	case size == 0 || base%m.g != 0 || size%m.g != 0 || size > tlsf.MaxSize || base+size < base:
		return tlsf.ErrBadRegion
	case m.overlaps(base, size):
		return tlsf.ErrRegionOverlap
	}
	return nil
}

func (m *indexModel) addRegion(base, size uint64) {
	want := m.regionError(base, size)
	m.expect(fmt.Sprintf("AddRegion(%#x, %d)", base, size), want, func() error { return m.x.AddRegion(base, size) })
	if want == nil {
		m.regs[base] = size
		m.ref.AddRegion(base, size)
	}
}

func (m *indexModel) growRegion(base, extra uint64) {
	size, ok := m.regs[base]
	end := base + size
	var want error
	switch {
	case !ok || extra == 0 || extra%m.g != 0 || extra > tlsf.MaxSize || end+extra < end || size+extra > tlsf.MaxSize:
		want = tlsf.ErrBadRegion
	case m.overlaps(end, extra):
		want = tlsf.ErrRegionOverlap
	}
	m.expect(fmt.Sprintf("GrowRegion(%#x, %d)", base, extra), want, func() error { return m.x.GrowRegion(base, extra) })
	if want == nil {
		m.regs[base] += extra
		m.ref.GrowRegion(base, extra)
	}
}

func (m *indexModel) removeRegion(base uint64) {
	size, ok := m.regs[base]
	var want error
	if !ok {
		want = tlsf.ErrBadRegion
	} else {
		for a := range m.live {
			if a >= base && a-base < size {
				want = tlsf.ErrRegionBusy
			}
		}
	}
	m.expect(fmt.Sprintf("RemoveRegion(%#x)", base), want, func() error { return m.x.RemoveRegion(base) })
	if want == nil {
		delete(m.regs, base)
		m.ref.RemoveRegion(base)
	}
}

// sizeError is what Alloc(size) must return before looking for space.
func sizeError(size uint64) error {
	switch {
	case size == 0:
		return tlsf.ErrInvalidSize
	case size > tlsf.MaxSize:
		return tlsf.ErrTooLarge
	}
	return nil
}

func (m *indexModel) alloc(size uint64) {
	t := m.t
	if want := sizeError(size); want != nil {
		m.expect(fmt.Sprintf("Alloc(%d)", size), want, func() error { _, err := m.x.Alloc(size); return err })
		m.expect(fmt.Sprintf("RoundUp(%d)", size), want, func() error { _, err := m.x.RoundUp(size); return err })
		return
	}
	r := m.roundUp(size)
	if got, err := m.x.RoundUp(size); err != nil || got != r {
		t.Fatalf("RoundUp(%d) = %d, %v; the size classes give %d", size, got, err, r)
	}
	if r-size >= max(m.g, r>>m.slLog2) {
		t.Fatalf("request %d rounded to %d: more than a class width of waste", size, r)
	}
	if m.ref.Largest() < r {
		m.expect(fmt.Sprintf("Alloc(%d) with largest free %d", size, m.ref.Largest()), tlsf.ErrNoSpace,
			func() error { _, err := m.x.Alloc(size); return err })
		return
	}
	b, err := m.x.Alloc(size)
	if err != nil {
		t.Fatalf("Alloc(%d) (rounded %d) with a free block of %d: %v", size, r, m.ref.Largest(), err)
	}
	if b.Size != r {
		t.Fatalf("Alloc(%d): block of %d bytes, want the rounded %d", size, b.Size, r)
	}
	m.placed(b, m.g)
}

func (m *indexModel) allocAligned(size, align uint64) {
	t := m.t
	name := fmt.Sprintf("AllocAligned(%d, %d)", size, align)
	do := func() error { _, err := m.x.AllocAligned(size, align); return err }
	if align == 0 || align&(align-1) != 0 || align > tlsf.MaxSize {
		m.expect(name, tlsf.ErrBadAlignment, do)
		return
	}
	if want := sizeError(size); want != nil {
		m.expect(name, want, do)
		return
	}
	r := m.roundUp(size)
	// What the documented search asks for: enough to cut an aligned block
	// of r bytes from any block found.
	need := r
	if align > m.g {
		need = r + align - m.g
	}
	fits := need <= tlsf.MaxSize && m.ref.Largest() >= m.roundUp(need)
	before := snapIndex(m.x)
	b, err := m.x.AllocAligned(size, align)
	if errors.Is(err, tlsf.ErrNoSpace) {
		if fits {
			t.Fatalf("%s: ErrNoSpace with a free block of %d (needs %d)", name, m.ref.Largest(), m.roundUp(need))
		}
		if !equalSnapshots(before, snapIndex(m.x)) {
			t.Fatalf("%s failed but changed the index", name)
		}
		return
	}
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	if b.Size != r {
		t.Fatalf("%s: block of %d bytes, want the rounded %d", name, b.Size, r)
	}
	m.placed(b, max(align, m.g))
}

// placed checks and records a new block.
func (m *indexModel) placed(b tlsf.Block, align uint64) {
	t := m.t
	if b.Addr%align != 0 || b.Free {
		t.Fatalf("block %+v: not aligned to %d, or marked free", b, align)
	}
	if !m.ref.Take(b.Addr, b.Size) {
		t.Fatalf("block %+v overlaps a live block or lies outside every region", b)
	}
	for _, o := range m.live {
		if o.ID == b.ID {
			t.Fatalf("block %+v has the ID of live block %+v", b, o)
		}
	}
	m.live[b.Addr] = b
	m.forget(b.Addr)
}

func (m *indexModel) free(a uint64) {
	t := m.t
	want := m.live[a]
	got, err := m.x.Free(a)
	if err != nil {
		t.Fatalf("Free(%#x) of a live block: %v", a, err)
	}
	if got.Addr != a || got.Size != want.Size || got.ID != want.ID {
		t.Fatalf("Free(%#x) returned %+v, allocated %+v", a, got, want)
	}
	if size, ok := m.ref.Free(a); !ok || size != want.Size {
		t.Fatalf("reference: free of %#x: %d, %v", a, size, ok)
	}
	delete(m.live, a)
	m.freed = append(m.freed, a)
	if len(m.freed) > 16 {
		m.freed = m.freed[1:]
	}
}

func (m *indexModel) forget(a uint64) {
	m.freed = slices.DeleteFunc(m.freed, func(f uint64) bool { return f == a })
}

// badAddress decodes an address that is, most of the time, not a live
// block's start: a freed one, an interior one, or any address near the
// regions.
func (m *indexModel) badAddress(r *reader) uint64 {
	switch r.u8() % 5 {
	case 4:
		// Addresses no block can start at; 2^64−1 is also the key the
		// index's address table reserves for its empty slots.
		return pick(r, 0, math.MaxUint64, math.MaxUint64&^(m.g-1), 1<<63)
	case 0:
		if len(m.freed) > 0 {
			return m.freed[r.intn(len(m.freed))]
		}
	case 1:
		if len(m.live) > 0 {
			addrs := slices.Sorted(maps.Keys(m.live))
			b := m.live[addrs[r.intn(len(addrs))]]
			if b.Size > 1 {
				return b.Addr + 1 + r.u64()%(b.Size-1)
			}
		}
	case 2:
		if len(m.regs) > 0 {
			bases := slices.Sorted(maps.Keys(m.regs))
			b := bases[r.intn(len(bases))]
			return b + r.u64()%(m.regs[b]+2*m.g) - m.g
		}
	}
	return r.u64() >> (r.u8() % 64)
}

// badFree frees an address that is no live block's start and checks the
// documented classification: outside every region, misaligned, or inside
// an allocated block is ErrUnknownAddress; in free space is ErrDoubleFree.
func (m *indexModel) badFree(a uint64) {
	want := tlsf.ErrUnknownAddress
	inRegion := false
	for b, s := range m.regs {
		if a >= b && a-b < s {
			inRegion = true
		}
	}
	if inRegion && a%m.g == 0 {
		for _, sp := range m.ref.FreeSpans() {
			if a >= sp.Addr && a-sp.Addr < sp.Size {
				want = tlsf.ErrDoubleFree
			}
		}
	}
	m.expect(fmt.Sprintf("Free(%#x)", a), want, func() error { _, err := m.x.Free(a); return err })
	m.expect(fmt.Sprintf("Lookup(%#x)", a), want, func() error { _, err := m.x.Lookup(a); return err })
}

// indexSnapshot is everything observable about an index.
type indexSnapshot struct {
	stats   tlsf.Stats
	blocks  []tlsf.Block
	regions []tlsf.RegionInfo
	maxID   uint32
}

func snapIndex(x *tlsf.Index) indexSnapshot {
	s := indexSnapshot{stats: x.Stats(), regions: x.Regions(), maxID: x.MaxID()}
	x.Walk(func(b tlsf.Block) bool {
		if b.Free {
			b.ID = 0 // meaningless for free blocks
		}
		s.blocks = append(s.blocks, b)
		return true
	})
	return s
}

// expect runs f, which must return an error matching want (nil: succeed),
// and, when it fails, must change nothing.
func (m *indexModel) expect(name string, want error, f func() error) {
	t := m.t
	before := snapIndex(m.x)
	err := f()
	if want == nil {
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		return
	}
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", name, err, want)
	}
	if after := snapIndex(m.x); !equalSnapshots(before, after) {
		t.Fatalf("%s failed with %v but changed the index:\nbefore %+v\nafter  %+v", name, err, before, after)
	}
}

func equalSnapshots(a, b indexSnapshot) bool {
	return a.stats == b.stats && a.maxID == b.maxID && slices.Equal(a.blocks, b.blocks) && slices.Equal(a.regions, b.regions)
}

// check compares the index with the model.
func (m *indexModel) check(when string) {
	t := m.t
	if err := m.x.Check(); err != nil {
		t.Fatalf("%s: %v", when, err)
	}
	var free []bestfit.Span
	var allocated uint64
	nLive := 0
	ids := map[uint32]bool{}
	m.x.Walk(func(b tlsf.Block) bool {
		if b.Free {
			free = append(free, bestfit.Span{Addr: b.Addr, Size: b.Size})
			return true
		}
		nLive++
		allocated += b.Size
		if want, ok := m.live[b.Addr]; !ok || want != b {
			t.Fatalf("%s: index holds allocated block %+v, model %+v", when, b, want)
		}
		if ids[b.ID] || b.ID >= m.x.MaxID() {
			t.Fatalf("%s: block %+v: ID repeated or not below MaxID %d", when, b, m.x.MaxID())
		}
		ids[b.ID] = true
		return true
	})
	if nLive != len(m.live) {
		t.Fatalf("%s: index has %d allocated blocks, model %d", when, nLive, len(m.live))
	}
	want := m.ref.FreeSpans()
	if len(free) != len(want) {
		t.Fatalf("%s: index has %d free blocks, model %d:\nindex %v\nmodel %v", when, len(free), len(want), free, want)
	}
	for i := range free {
		if free[i].Addr != want[i].Addr || free[i].Size != want[i].Size {
			t.Fatalf("%s: free block %d: index [%#x +%d), model [%#x +%d)", when, i, free[i].Addr, free[i].Size, want[i].Addr, want[i].Size)
		}
	}
	var total uint64
	for _, s := range m.regs {
		total += s
	}
	st := m.x.Stats()
	wantStats := tlsf.Stats{
		Regions: len(m.regs), Total: total, Allocated: allocated, Free: total - allocated,
		AllocatedBlocks: nLive, FreeBlocks: len(free), LargestFree: m.ref.Largest(),
	}
	if st != wantStats {
		t.Fatalf("%s: stats %+v, model %+v", when, st, wantStats)
	}
	regions := m.x.Regions()
	if len(regions) != len(m.regs) {
		t.Fatalf("%s: %d regions, model %d", when, len(regions), len(m.regs))
	}
	for i, b := range slices.Sorted(maps.Keys(m.regs)) {
		var in uint64
		for a, blk := range m.live {
			if a >= b && a-b < m.regs[b] {
				in += blk.Size
			}
		}
		if w := (tlsf.RegionInfo{Base: b, Size: m.regs[b], Allocated: in}); regions[i] != w {
			t.Fatalf("%s: region %d is %+v, model %+v", when, i, regions[i], w)
		}
	}
	for a, b := range m.live {
		if got, err := m.x.Lookup(a); err != nil || got != b {
			t.Fatalf("%s: Lookup(%#x) = %+v, %v; want %+v", when, a, got, err, b)
		}
	}
}
