package sim

// Property tests: Sim against plain reference models.

import (
	"errors"
	"sort"
	"testing"

	"github.com/gpumem/tlsf/device"
	"pgregory.net/rapid"
)

// simNeed fails the property if err is not want (nil: success).
func simNeed(t *rapid.T, what string, err, want error) {
	t.Helper()
	if want == nil && err != nil || want != nil && !errors.Is(err, want) {
		t.Fatalf("%s: got error %v, want %v", what, err, want)
	}
}

func simRapidCheck(t *rapid.T, s *Device) {
	t.Helper()
	if err := s.Check(); err != nil {
		t.Fatal(err)
	}
}

// TestSimLinearProperty: random MemAlloc/MemFree keep capacity accounting
// exact, addresses lowest-first-fit and disjoint, and OOM exactly when the
// rounded size exceeds what is free.
func TestSimLinearProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const capacity = 4 << 20
		s := New(Config{Capacity: capacity})
		other := s.NewProcess()
		live := map[uintptr]uint64{} // start → requested size
		var otherUsed uint64
		charge := func(n uint64) uint64 { return (n + 511) &^ 511 }
		used := func() uint64 {
			var u uint64
			for _, n := range live {
				u += charge(n)
			}
			return u
		}
		// firstFit is where the lowest-first-fit allocator must put n bytes.
		firstFit := func(n uint64) uintptr {
			var starts []uintptr
			for p := range live {
				starts = append(starts, p)
			}
			sort.Slice(starts, func(i, j int) bool { return starts[i] < starts[j] })
			at := uintptr(simVATop)
			for _, p := range starts {
				if uint64(p-at) >= charge(n) {
					return at
				}
				at = p + uintptr(charge(live[p]))
			}
			return at
		}
		t.Repeat(map[string]func(*rapid.T){
			"alloc": func(t *rapid.T) {
				n := rapid.OneOf(rapid.Uint64Range(1, 1024), rapid.Uint64Range(1, capacity/2)).Draw(t, "size")
				p, err := s.MemAlloc(n)
				if charge(n) > capacity-used()-otherUsed {
					simNeed(t, "MemAlloc", err, device.ErrOutOfMemory)
					return
				}
				simNeed(t, "MemAlloc", err, nil)
				if want := firstFit(n); p != want {
					t.Fatalf("MemAlloc(%d) = %#x, want first fit %#x", n, p, want)
				}
				live[p] = n
			},
			"free": func(t *rapid.T) {
				if len(live) == 0 {
					t.Skip("nothing live")
				}
				var ps []uintptr
				for p := range live {
					ps = append(ps, p)
				}
				sort.Slice(ps, func(i, j int) bool { return ps[i] < ps[j] })
				p := rapid.SampledFrom(ps).Draw(t, "ptr")
				simNeed(t, "MemFree", s.MemFree(p), nil)
				delete(live, p)
			},
			"free bogus": func(t *rapid.T) {
				p := uintptr(simVATop) + uintptr(rapid.Uint64Range(0, 8<<20).Draw(t, "offset"))
				_, ok := live[p]
				if ok {
					t.Skip("a real allocation")
				}
				simNeed(t, "MemFree", s.MemFree(p), device.ErrInvalidValue)
			},
			"other process": func(t *rapid.T) {
				n := rapid.Uint64Range(0, capacity/4).Draw(t, "bytes")
				if otherUsed > 0 {
					other.Vacate(otherUsed)
					otherUsed = 0
				}
				if err := other.Occupy(n); err == nil {
					otherUsed = n
				}
			},
			"": func(t *rapid.T) {
				simRapidCheck(t, s)
				if got, want := s.Used(), used(); got != want {
					t.Fatalf("Used = %d, want %d", got, want)
				}
				free, _, err := s.MemGetInfo()
				simNeed(t, "MemGetInfo", err, nil)
				if want := capacity - used() - otherUsed; free != want {
					t.Fatalf("free = %d, want %d", free, want)
				}
				if s.LiveAllocations() != len(live) {
					t.Fatalf("LiveAllocations = %d, want %d", s.LiveAllocations(), len(live))
				}
			},
		})
	})
}

// simModel is a reference model of one process's VMM state, byte by byte.
type simModel struct {
	g        uint64
	handles  map[device.MemHandle]*simModelHandle
	all      []device.MemHandle // every handle ever made, for drawing stale ones
	res      []*simModelRes
	capacity uint64
}

type simModelHandle struct {
	size     uint64
	released bool
	maps     int
	data     []byte
}

type simModelRes struct {
	start uintptr
	size  uint64
	maps  []*simModelMap // sorted by start
}

type simModelMap struct {
	start  uintptr
	h      device.MemHandle
	access bool
}

func (m *simModel) used() uint64 {
	var u uint64
	for _, h := range m.handles {
		u += h.size
	}
	return u
}

// at resolves one address to handle and offset, if mapped with access.
func (m *simModel) at(a uintptr) (*simModelHandle, uint64, bool) {
	for _, r := range m.res {
		if a < r.start || a >= r.start+uintptr(r.size) {
			continue
		}
		for _, mp := range r.maps {
			h := m.handles[mp.h]
			if a >= mp.start && a < mp.start+uintptr(h.size) {
				return h, uint64(a - mp.start), mp.access
			}
		}
	}
	return nil, 0, false
}

// run returns the index range of r's mappings tiling [p, p+n), or false.
func (m *simModel) run(r *simModelRes, p uintptr, n uint64) (int, int, bool) {
	for i, mp := range r.maps {
		if mp.start != p {
			continue
		}
		at, j := p, i
		for j < len(r.maps) && r.maps[j].start == at && at < p+uintptr(n) {
			at += uintptr(m.handles[r.maps[j].h].size)
			j++
		}
		return i, j, n > 0 && at == p+uintptr(n)
	}
	return 0, 0, false
}

func (m *simModel) release(hd device.MemHandle) {
	if h := m.handles[hd]; h.released && h.maps == 0 {
		delete(m.handles, hd)
	}
}

// TestSimVMMProperty: random reserve/create/map/set-access/memset/read/
// unmap/release/free sequences agree with a byte-level reference model in
// every outcome (success or sentinel), in capacity, and in contents.
func TestSimVMMProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const g = 4096
		const capacity = 24 * g
		s := New(Config{Capacity: capacity, Granularity: g, Shadow: true})
		m := &simModel{g: g, handles: map[device.MemHandle]*simModelHandle{}, capacity: capacity}

		drawRes := func(t *rapid.T) *simModelRes {
			if len(m.res) == 0 {
				t.Skip("no reservation")
			}
			return rapid.SampledFrom(m.res).Draw(t, "reservation")
		}
		// drawRange draws a granule-aligned range starting in r.
		drawRange := func(t *rapid.T, r *simModelRes) (uintptr, uint64) {
			k := r.size / g
			first := rapid.Uint64Range(0, k-1).Draw(t, "first granule")
			n := rapid.Uint64Range(0, k-first+1).Draw(t, "granules")
			return r.start + uintptr(first*g), n * g
		}
		// drawBytes draws a byte range around r, possibly spilling out.
		drawBytes := func(t *rapid.T, r *simModelRes, align uint64) (uintptr, uint64) {
			off := rapid.Uint64Range(0, (r.size+g)/align-1).Draw(t, "offset") * align
			n := rapid.Uint64Range(0, 2*g/align).Draw(t, "units") * align
			return r.start + uintptr(off), n
		}
		// reach reports whether every byte of [p, p+n) is mapped with access.
		reach := func(p uintptr, n uint64) bool {
			for a := p; a < p+uintptr(n); a++ {
				if _, _, ok := m.at(a); !ok {
					return false
				}
			}
			return true
		}

		t.Repeat(map[string]func(*rapid.T){
			"reserve": func(t *rapid.T) {
				n := rapid.Uint64Range(1, 6).Draw(t, "granules") * g
				align := rapid.SampledFrom([]uint64{0, g, 4 * g}).Draw(t, "align")
				p, err := s.AddressReserve(n, align)
				simNeed(t, "AddressReserve", err, nil)
				if p%uintptr(max(align, g)) != 0 {
					t.Fatalf("reservation %#x not aligned to %d", p, align)
				}
				m.res = append(m.res, &simModelRes{start: p, size: n})
			},
			"address free": func(t *rapid.T) {
				r := drawRes(t)
				err := s.AddressFree(r.start, r.size)
				if len(r.maps) > 0 {
					simNeed(t, "AddressFree", err, device.ErrInvalidValue)
					return
				}
				simNeed(t, "AddressFree", err, nil)
				i := 0
				for m.res[i] != r {
					i++
				}
				m.res = append(m.res[:i], m.res[i+1:]...)
			},
			"create": func(t *rapid.T) {
				n := rapid.Uint64Range(1, 4).Draw(t, "granules") * g
				h, err := s.MemCreate(n)
				if m.used()+n > capacity {
					simNeed(t, "MemCreate", err, device.ErrOutOfMemory)
					return
				}
				simNeed(t, "MemCreate", err, nil)
				m.handles[h] = &simModelHandle{size: n, data: simRef(n)}
				m.all = append(m.all, h)
			},
			"release": func(t *rapid.T) {
				if len(m.all) == 0 {
					t.Skip("no handle")
				}
				hd := rapid.SampledFrom(m.all).Draw(t, "handle")
				err := s.MemRelease(hd)
				h := m.handles[hd]
				if h == nil || h.released {
					simNeed(t, "MemRelease", err, device.ErrInvalidValue)
					return
				}
				simNeed(t, "MemRelease", err, nil)
				h.released = true
				m.release(hd)
			},
			"map": func(t *rapid.T) {
				if len(m.all) == 0 {
					t.Skip("no handle")
				}
				hd := rapid.SampledFrom(m.all).Draw(t, "handle")
				r := drawRes(t)
				p, _ := drawRange(t, r)
				h := m.handles[hd]
				var size uint64 = g
				if h != nil {
					size = h.size
				}
				err := s.MemMap(p, size, hd)
				ok := h != nil && !h.released && p+uintptr(size) <= r.start+uintptr(r.size)
				for _, mp := range r.maps {
					if ok && mp.start < p+uintptr(size) && p < mp.start+uintptr(m.handles[mp.h].size) {
						ok = false
					}
				}
				if !ok {
					simNeed(t, "MemMap", err, device.ErrInvalidValue)
					return
				}
				simNeed(t, "MemMap", err, nil)
				r.maps = append(r.maps, &simModelMap{start: p, h: hd})
				sort.Slice(r.maps, func(i, j int) bool { return r.maps[i].start < r.maps[j].start })
				h.maps++
			},
			"unmap": func(t *rapid.T) {
				r := drawRes(t)
				p, n := drawRange(t, r)
				err := s.MemUnmap(p, n)
				i, j, ok := m.run(r, p, n)
				if !ok {
					simNeed(t, "MemUnmap", err, device.ErrInvalidValue)
					return
				}
				simNeed(t, "MemUnmap", err, nil)
				gone := append([]*simModelMap(nil), r.maps[i:j]...)
				r.maps = append(r.maps[:i], r.maps[j:]...)
				for _, mp := range gone {
					m.handles[mp.h].maps--
					m.release(mp.h)
				}
			},
			"set access": func(t *rapid.T) {
				r := drawRes(t)
				p, n := drawRange(t, r)
				err := s.MemSetAccess(p, n)
				i, j, ok := m.run(r, p, n)
				if !ok {
					simNeed(t, "MemSetAccess", err, device.ErrInvalidValue)
					return
				}
				simNeed(t, "MemSetAccess", err, nil)
				for _, mp := range r.maps[i:j] {
					mp.access = true
				}
			},
			"memset": func(t *rapid.T) {
				r := drawRes(t)
				p, n := drawBytes(t, r, 4)
				v := rapid.Uint32().Draw(t, "value")
				err := s.MemsetD32(p, v, n/4)
				if !reach(p, n) {
					simNeed(t, "MemsetD32", err, device.ErrIllegalAddress)
					return
				}
				simNeed(t, "MemsetD32", err, nil)
				for a := p; a < p+uintptr(n); a++ {
					h, off, _ := m.at(a)
					h.data[off] = byte(v >> (8 * (off % 4)))
				}
			},
			"read": func(t *rapid.T) {
				r := drawRes(t)
				p, n := drawBytes(t, r, 1)
				got := make([]byte, n)
				err := s.MemcpyDtoH(got, p)
				if !reach(p, n) {
					simNeed(t, "MemcpyDtoH", err, device.ErrIllegalAddress)
					return
				}
				simNeed(t, "MemcpyDtoH", err, nil)
				for k := range got {
					h, off, _ := m.at(p + uintptr(k))
					if got[k] != h.data[off] {
						t.Fatalf("byte %#x = %#02x, want %#02x", p+uintptr(k), got[k], h.data[off])
					}
				}
			},
			"": func(t *rapid.T) {
				simRapidCheck(t, s)
				if got, want := s.Used(), m.used(); got != want {
					t.Fatalf("Used = %d, want %d", got, want)
				}
				if got := s.LiveAllocations(); got != len(m.handles) {
					t.Fatalf("LiveAllocations = %d, want %d", got, len(m.handles))
				}
				st := s.Stats()
				if st.Reservations != len(m.res) {
					t.Fatalf("Reservations = %d, want %d", st.Reservations, len(m.res))
				}
			},
		})
	})
}

// TestSimStreamProperty: random holds, async and sync memsets, records,
// waits, queries and synchronizations over three streams. Whenever Sim
// reports no race, every word must end up holding the value of the last
// write issued to it: happens-before, which Sim enforces, implies issue
// order for the writes it orders, so a run without races is one where
// issue order decides.
func TestSimStreamProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		const words = 16
		s := New(Config{Capacity: 1 << 20, Shadow: true})
		p, err := s.MemAlloc(4 * words)
		simNeed(t, "MemAlloc", err, nil)
		streams := []device.Stream{0}
		for range 2 {
			st, err := s.StreamCreate()
			simNeed(t, "StreamCreate", err, nil)
			streams = append(streams, st)
		}
		var events []device.Event
		for range 3 {
			e, err := s.EventCreate()
			simNeed(t, "EventCreate", err, nil)
			events = append(events, e)
		}
		want := make([]uint32, words)
		for i := range want {
			want[i] = Uninitialized
		}
		next := uint32(1)
		held := map[device.Stream]bool{}
		drawWords := func(t *rapid.T) (int, int) {
			lo := rapid.IntRange(0, words-1).Draw(t, "word")
			return lo, rapid.IntRange(1, words-lo).Draw(t, "count")
		}
		t.Repeat(map[string]func(*rapid.T){
			"hold": func(t *rapid.T) {
				st := rapid.SampledFrom(streams).Draw(t, "stream")
				simNeed(t, "HoldStream", s.HoldStream(st), nil)
				held[st] = true
			},
			"release": func(t *rapid.T) {
				st := rapid.SampledFrom(streams).Draw(t, "stream")
				simNeed(t, "ReleaseStream", s.ReleaseStream(st), nil)
				held[st] = false
			},
			"async memset": func(t *rapid.T) {
				st := rapid.SampledFrom(streams).Draw(t, "stream")
				lo, n := drawWords(t)
				simNeed(t, "MemsetD32Async", s.MemsetD32Async(p+uintptr(4*lo), next, uint64(n), st), nil)
				for i := lo; i < lo+n; i++ {
					want[i] = next
				}
				next++
			},
			"memset": func(t *rapid.T) {
				lo, n := drawWords(t)
				simNeed(t, "MemsetD32", s.MemsetD32(p+uintptr(4*lo), next, uint64(n)), nil)
				clear(held) // it waits for the default stream, and what that waits for
				for i := lo; i < lo+n; i++ {
					want[i] = next
				}
				next++
			},
			"record": func(t *rapid.T) {
				e := rapid.SampledFrom(events).Draw(t, "event")
				st := rapid.SampledFrom(streams).Draw(t, "stream")
				simNeed(t, "EventRecord", s.EventRecord(e, st), nil)
				if held[st] {
					if done, _ := s.EventQuery(e); done {
						t.Fatalf("event recorded on a held stream reports done")
					}
				}
			},
			"wait": func(t *rapid.T) {
				e := rapid.SampledFrom(events).Draw(t, "event")
				st := rapid.SampledFrom(streams).Draw(t, "stream")
				simNeed(t, "StreamWaitEvent", s.StreamWaitEvent(st, e), nil)
			},
			"query": func(t *rapid.T) {
				_, err := s.EventQuery(rapid.SampledFrom(events).Draw(t, "event"))
				simNeed(t, "EventQuery", err, nil)
			},
			"event sync": func(t *rapid.T) {
				e := rapid.SampledFrom(events).Draw(t, "event")
				simNeed(t, "EventSynchronize", s.EventSynchronize(e), nil)
				if done, _ := s.EventQuery(e); !done {
					t.Fatalf("event not done after EventSynchronize")
				}
				clear(held) // conservatively: some holds were lifted
			},
			"stream sync": func(t *rapid.T) {
				st := rapid.SampledFrom(streams).Draw(t, "stream")
				simNeed(t, "StreamSynchronize", s.StreamSynchronize(st), nil)
				clear(held)
			},
			"": func(t *rapid.T) { simRapidCheck(t, s) },
		})
		for _, st := range streams {
			simNeed(t, "ReleaseStream", s.ReleaseStream(st), nil)
		}
		for _, st := range streams {
			simNeed(t, "StreamSynchronize", s.StreamSynchronize(st), nil)
		}
		for _, e := range events {
			if done, _ := s.EventQuery(e); !done {
				t.Fatalf("event not done after everything was synchronized")
			}
		}
		if q := s.Stats().QueuedWork; q != 0 {
			t.Fatalf("%d items still queued", q)
		}
		if v := s.Violations(); len(v) > 0 {
			return // races: the final contents are not determined by issue order
		}
		buf := make([]byte, 4*words)
		simNeed(t, "MemcpyDtoH", s.MemcpyDtoH(buf, p), nil)
		for i := range want {
			got := uint32(buf[4*i]) | uint32(buf[4*i+1])<<8 | uint32(buf[4*i+2])<<16 | uint32(buf[4*i+3])<<24
			if got != want[i] {
				t.Fatalf("word %d = %d, want %d (the last write issued)", i, got, want[i])
			}
		}
	})
}
