package tlsf

import (
	"errors"
	"sort"
	"testing"

	"github.com/gpumem/tlsf/internal/bestfit"
	"pgregory.net/rapid"
)

// model mirrors an Index into the plain reference: every placement the
// index makes is taken from an address-ordered free list, which must have
// had that range free (so no two live blocks overlap), and after every
// action the model's coalesced free list must equal the index's free
// blocks exactly. Every live block carries a tag (Index.SetTag), which
// must read back unchanged through every other block's split and merge.
type model struct {
	x    *Index
	ref  *bestfit.Allocator
	reqs map[uint64]uint64 // live block → requested size
	regs map[uint64]uint64 // region base → size
	tags map[uint64]uint32 // live block → its tag
}

func newModel(t *rapid.T) *model {
	cfg := Config{
		Granularity: rapid.SampledFrom([]uint64{256, 512, 4096}).Draw(t, "granularity"),
		SLLog2:      rapid.UintRange(1, MaxSLLog2).Draw(t, "slLog2"),
		Wilderness:  rapid.Bool().Draw(t, "wilderness"),
	}
	x, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &model{x: x, ref: bestfit.New(cfg.Granularity), reqs: map[uint64]uint64{}, regs: map[uint64]uint64{}, tags: map[uint64]uint32{}}
}

// drawSize favours small sizes and class boundaries ± a little.
func (m *model) drawSize(t *rapid.T) uint64 {
	return rapid.OneOf(
		rapid.Uint64Range(1, 64*KiB),
		rapid.Uint64Range(1, 4*MiB),
		rapid.Custom(func(t *rapid.T) uint64 {
			k := rapid.UintRange(8, 22).Draw(t, "k")
			d := rapid.Int64Range(-512, 512).Draw(t, "d")
			return uint64(max(int64(1)<<k+d, 1))
		}),
	).Draw(t, "size")
}

func (m *model) liveAddrs() []uint64 {
	var out []uint64
	for a := range m.reqs {
		out = append(out, a)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

func (m *model) afterAlloc(t *rapid.T, b Block, size, align uint64) {
	if b.Size < size {
		t.Fatalf("block %+v smaller than request %d", b, size)
	}
	if b.Addr%max(align, m.x.gran) != 0 {
		t.Fatalf("block %+v not aligned to %d", b, align)
	}
	if !m.ref.Take(b.Addr, b.Size) {
		t.Fatalf("block %+v overlaps a live block or lies outside the regions", b)
	}
	m.reqs[b.Addr] = size
	if tag := m.x.Tag(b.ID); tag != 0 {
		t.Fatalf("new block %+v has tag %d", b, tag)
	}
	// Small tags look like record IDs and links, as the pool's states do.
	tag := rapid.OneOf(rapid.Uint32Range(0, 3), rapid.Uint32()).Draw(t, "tag")
	if !m.x.SetTag(b.ID, tag) {
		t.Fatalf("SetTag of live block %+v failed", b)
	}
	m.tags[b.Addr] = tag
}

func (m *model) fitsSomewhere(size uint64) bool {
	return m.ref.Largest() >= size
}

func (m *model) check(t *rapid.T) {
	if err := m.x.Check(); err != nil {
		t.Fatal(err)
	}
	var free []bestfit.Span
	var live int
	m.x.Walk(func(b Block) bool {
		if b.Free {
			free = append(free, bestfit.Span{Addr: b.Addr, Size: b.Size})
			if m.x.Tag(b.ID) != 0 || m.x.SetTag(b.ID, 1) {
				t.Fatalf("free block %+v has a tag", b)
			}
		} else {
			live++
			if got := m.x.Tag(b.ID); got != m.tags[b.Addr] {
				t.Fatalf("block %+v: tag %d, set %d", b, got, m.tags[b.Addr])
			}
		}
		return true
	})
	want := m.ref.FreeSpans()
	if len(free) != len(want) {
		t.Fatalf("index has %d free blocks, model %d", len(free), len(want))
	}
	for i := range free {
		if free[i].Addr != want[i].Addr || free[i].Size != want[i].Size {
			t.Fatalf("free block %d: index [%#x +%d), model [%#x +%d)", i, free[i].Addr, free[i].Size, want[i].Addr, want[i].Size)
		}
	}
	st := m.x.Stats()
	if st.Free != m.ref.FreeBytes() || live != len(m.reqs) || st.LargestFree != m.ref.Largest() {
		t.Fatalf("stats %+v; model free %d, live %d, largest %d", st, m.ref.FreeBytes(), len(m.reqs), m.ref.Largest())
	}
}

func TestIndexAgainstModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := newModel(t)
		g := m.x.gran
		// Regions live in a small space (64 slots of 1 MiB) so that
		// overlaps, adjacency and growth collisions happen often.
		drawRange := func(t *rapid.T) (uint64, uint64) {
			base := rapid.Uint64Range(0, 63).Draw(t, "slot")*MiB + rapid.Uint64Range(0, 3).Draw(t, "off")*g
			size := rapid.Uint64Range(1, 12*MiB/g).Draw(t, "granules") * g
			return base, size
		}
		overlaps := func(base, size uint64) bool {
			for b, s := range m.regs {
				if base < b+s && b < base+size {
					return true
				}
			}
			return false
		}
		t.Repeat(map[string]func(*rapid.T){
			"": m.check,
			"add region": func(t *rapid.T) {
				base, size := drawRange(t)
				err := m.x.AddRegion(base, size)
				if overlaps(base, size) {
					if !errors.Is(err, ErrRegionOverlap) {
						t.Fatalf("overlapping region [%#x +%d): %v", base, size, err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				m.regs[base] = size
				m.ref.AddRegion(base, size)
			},
			"grow region": func(t *rapid.T) {
				if len(m.regs) == 0 {
					t.Skip("no region")
				}
				bases := make([]uint64, 0, len(m.regs))
				for b := range m.regs {
					bases = append(bases, b)
				}
				sort.Slice(bases, func(i, j int) bool { return bases[i] < bases[j] })
				base := rapid.SampledFrom(bases).Draw(t, "base")
				extra := rapid.Uint64Range(1, 2*MiB/g).Draw(t, "extra") * g
				err := m.x.GrowRegion(base, extra)
				end := base + m.regs[base]
				if overlaps(end, extra) {
					if !errors.Is(err, ErrRegionOverlap) {
						t.Fatalf("growth into a neighbour: %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				m.regs[base] += extra
				m.ref.GrowRegion(base, extra)
			},
			"remove region": func(t *rapid.T) {
				if len(m.regs) == 0 {
					t.Skip("no region")
				}
				var base uint64
				for b := range m.regs {
					base = max(base, b)
				}
				err := m.x.RemoveRegion(base)
				busy := false
				for a := range m.reqs {
					if a >= base && a < base+m.regs[base] {
						busy = true
					}
				}
				if busy {
					if !errors.Is(err, ErrRegionBusy) {
						t.Fatalf("busy region removed: %v", err)
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				delete(m.regs, base)
				m.ref.RemoveRegion(base)
			},
			"alloc": func(t *rapid.T) {
				size := m.drawSize(t)
				r := m.x.roundUp(size)
				b, err := m.x.Alloc(size)
				if errors.Is(err, ErrNoSpace) {
					if m.fitsSomewhere(r) {
						t.Fatalf("alloc %d (rounded %d) failed with a free block of %d", size, r, m.ref.Largest())
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if b.Size != r {
					t.Fatalf("alloc %d: block of %d, want the rounded %d", size, b.Size, r)
				}
				m.afterAlloc(t, b, size, 1)
			},
			"set wilderness": func(t *rapid.T) {
				on := rapid.Bool().Draw(t, "on")
				m.x.SetWilderness(on)
				if m.x.Wilderness() != on {
					t.Fatalf("SetWilderness(%v) left it %v", on, !on)
				}
			},
			"alloc fit": func(t *rapid.T) {
				size := m.drawSize(t)
				r := (size + g - 1) / g * g
				b, err := m.x.AllocFit(size)
				if errors.Is(err, ErrNoSpace) {
					// Only when no free block holds r: blocks of r's own
					// list past the first FitScan too.
					if m.fitsSomewhere(r) {
						t.Fatalf("alloc fit %d failed with a free block of %d", size, m.ref.Largest())
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				if b.Size != r {
					t.Fatalf("alloc fit %d: block of %d, want %d", size, b.Size, r)
				}
				m.afterAlloc(t, b, size, 1)
			},
			"alloc aligned": func(t *rapid.T) {
				size := m.drawSize(t)
				align := uint64(1) << rapid.UintRange(0, 22).Draw(t, "alignLog2")
				b, err := m.x.AllocAligned(size, align)
				if errors.Is(err, ErrNoSpace) {
					if align <= g && m.fitsSomewhere(m.x.roundUp(size)) {
						t.Fatalf("aligned alloc failed with room")
					}
					return
				}
				if err != nil {
					t.Fatal(err)
				}
				m.afterAlloc(t, b, size, align)
			},
			"free": func(t *rapid.T) {
				addrs := m.liveAddrs()
				if len(addrs) == 0 {
					t.Skip("nothing live")
				}
				a := rapid.SampledFrom(addrs).Draw(t, "addr")
				freed, err := m.x.Free(a)
				if err != nil {
					t.Fatal(err)
				}
				want, _ := m.ref.Free(a)
				if freed.Size != want || freed.Addr != a {
					t.Fatalf("free %#x returned %+v, block was %d bytes", a, freed, want)
				}
				delete(m.reqs, a)
				delete(m.tags, a)
			},
			"bad free": func(t *rapid.T) {
				a := rapid.Uint64Range(0, 80*MiB).Draw(t, "addr")
				if _, ok := m.reqs[a]; ok {
					t.Skip("a live block")
				}
				before := snap(m.x)
				_, err := m.x.Free(a)
				if !errors.Is(err, ErrDoubleFree) && !errors.Is(err, ErrUnknownAddress) {
					t.Fatalf("free of %#x: %v", a, err)
				}
				if after := snap(m.x); after.stats != before.stats || len(after.blocks) != len(before.blocks) {
					t.Fatalf("a failed free changed the index")
				}
			},
		})
	})
}
