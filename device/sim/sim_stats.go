package sim

// Introspection for tests: counters, simulated time, what the process
// holds, violations, and Check, the invariant checker.

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gpumem/tlsf/device"
)

// Counts returns how many calls of each kind this process made, failed
// and injected failures included.
func (s *Device) Counts() device.Counts {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return s.counts
}

// SimTime returns the total simulated driver time of this process's calls
// (see Latency), in ns.
func (s *Device) SimTime() time.Duration {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	var t time.Duration
	for _, d := range s.times {
		t += d
	}
	return t
}

// SimTimeByCall returns the simulated time of this process's calls per
// Call kind, in ns.
func (s *Device) SimTimeByCall() [device.NumCalls]time.Duration {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return s.times
}

// Used returns the capacity this process consumes, in bytes: linear
// allocations (each rounded up to 512 bytes) plus MemCreate handles whose
// memory is not yet freed (released handles still mapped included) plus
// what the async pool holds (sim_async.go). It is
// what this process takes from MemGetInfo's free.
func (s *Device) Used() uint64 {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return s.used
}

// Mapped returns the bytes of physical memory this process holds live:
// linear allocations (rounded up to 512 bytes) plus MemCreate handles not
// yet released, mapped or not, plus what the async pool holds. It falls short of Used by handles that are
// released but still mapped, which the driver frees at their last unmap.
func (s *Device) Mapped() uint64 {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	var n uint64
	for _, r := range s.regions {
		if r.ph != nil && !r.ph.async {
			n += r.ph.charge
		}
	}
	for _, ph := range s.handles {
		if !ph.released {
			n += ph.charge
		}
	}
	return n + s.apool.reserved
}

// LiveAllocations returns how many physical allocations this process holds:
// linear allocations (MemAllocAsync's included) plus MemCreate handles
// whose memory is not yet freed.
func (s *Device) LiveAllocations() int {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return s.linearCount() + len(s.handles)
}

func (s *Device) linearCount() int {
	n := 0
	for _, r := range s.regions {
		if r.ph != nil {
			n++
		}
	}
	return n
}

// Stats is a snapshot of what one process holds. Byte counts are bytes.
type Stats struct {
	Used            uint64 // as Used
	LinearAllocs    int    // live linear allocations (MemAlloc, MemAllocPitch)
	LinearBytes     uint64 // their requested sizes
	LinearCharged   uint64 // their capacity, each rounded up to 512 bytes
	AsyncAllocs     int    // live MemAllocAsync allocations
	AsyncBytes      uint64 // their requested sizes
	AsyncReserved   uint64 // capacity the async pool holds
	Handles         int    // MemCreate handles whose memory is not freed
	HandleBytes     uint64 // their sizes
	ReleasedMapped  int    // of those, released but still mapped
	Reservations    int    // live AddressReserve ranges
	ReservedBytes   uint64 // their sizes
	Mappings        int    // live MemMap mappings (a handle mapped twice counts twice)
	MappedBytes     uint64 // their sizes
	AccessibleBytes uint64 // mapped bytes with MemSetAccess granted
	Streams         int    // live streams, the default stream excluded
	Events          int    // live events
	HeldStreams     int    // streams held (HoldStream)
	QueuedWork      int    // items queued behind holds or waits
	Violations      int    // len(Violations())
	GPUUsed         uint64 // capacity used on the GPU by every process, Occupy and the contexts
	GPUOccupied     uint64 // of that, taken by Occupy
}

// Stats returns a snapshot of what this process holds.
func (s *Device) Stats() Stats {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	st := Stats{
		Used:          s.used,
		Handles:       len(s.handles),
		Events:        len(s.events),
		Violations:    len(s.violations),
		GPUUsed:       s.g.used,
		GPUOccupied:   s.g.occupied,
		AsyncReserved: s.apool.reserved,
	}
	for _, r := range s.regions {
		if r.ph != nil && r.ph.async {
			st.AsyncAllocs++
			st.AsyncBytes += r.ph.size
			continue
		}
		if r.ph != nil {
			st.LinearAllocs++
			st.LinearBytes += r.ph.size
			st.LinearCharged += r.ph.charge
			continue
		}
		st.Reservations++
		st.ReservedBytes += r.size
		for _, m := range r.maps {
			st.Mappings++
			st.MappedBytes += m.size
			if m.access {
				st.AccessibleBytes += m.size
			}
		}
	}
	for _, ph := range s.handles {
		st.HandleBytes += ph.size
		if ph.released {
			st.ReleasedMapped++
		}
	}
	for h, str := range s.streams {
		if h != 0 && !str.destroyed {
			st.Streams++
		}
		if str.held {
			st.HeldStreams++
		}
	}
	for _, str := range s.live {
		st.QueuedWork += len(str.queue)
	}
	return st
}

// Owner returns the driver allocation or mapping that covers ptr in this
// process: a linear allocation (start and requested size) or a VMM mapping
// (start and handle size), whether or not access was granted. ok is false
// for addresses outside both, reserved-but-unmapped ones included.
func (s *Device) Owner(ptr uintptr) (start uintptr, size uint64, ok bool) {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	r, _ := s.regionAt(ptr)
	switch {
	case r == nil:
		return 0, 0, false
	case r.ph != nil:
		if uint64(ptr-r.start) < r.ph.size {
			return r.start, r.ph.size, true
		}
		return 0, 0, false
	}
	if m, _ := r.mappingAt(ptr); m != nil {
		return m.start, m.size, true
	}
	return 0, 0, false
}

// Reservation returns the AddressReserve range that contains ptr in this
// process, if any.
func (s *Device) Reservation(ptr uintptr) (start uintptr, size uint64, ok bool) {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if r, _ := s.regionAt(ptr); r != nil && r.ph == nil {
		return r.start, r.size, true
	}
	return 0, 0, false
}

// Violations returns, oldest first, the misuses Sim has seen in this
// process that the driver would not have refused: memory freed or unmapped
// while held work still writes it, and races with held work (see
// HoldStream). A pool test asserts it is empty.
func (s *Device) Violations() []string {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return slices.Clone(s.violations)
}

// ClearViolations forgets the violations recorded so far.
func (s *Device) ClearViolations() {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	s.violations = nil
}

// Check verifies the Sim's internal invariants for this process and the
// GPU's capacity accounting, and returns an error describing every broken
// one (nil if none). Tests call it after every step.
func (s *Device) Check() error {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }

	// The GPU: capacity in use is every process's plus Occupy's plus the
	// contexts'.
	var sum uint64
	for _, p := range s.g.procs {
		sum += p.used
	}
	if sum+s.g.occupied+s.g.contexts != s.g.used {
		fail("GPU used %d, want processes %d + occupied %d + contexts %d", s.g.used, sum, s.g.occupied, s.g.contexts)
	}
	if s.g.used > s.g.capacity {
		fail("GPU used %d exceeds capacity %d", s.g.used, s.g.capacity)
	}

	// Regions and free ranges tile the window exactly.
	var tiles []simRange
	for _, f := range s.va.free {
		if f.lo >= f.hi {
			fail("empty free range %#x", f.lo)
		}
		tiles = append(tiles, f)
	}
	for i := 1; i < len(s.va.free); i++ {
		if s.va.free[i-1].hi >= s.va.free[i].lo {
			fail("free ranges %#x and %#x overlap, touch or are unsorted", s.va.free[i-1].lo, s.va.free[i].lo)
		}
	}
	var used, asyncLive uint64
	var asyncN int
	refs := map[*simPhys]int{}
	for i, r := range s.regions {
		tiles = append(tiles, simRange{r.start, r.end()})
		if i > 0 && s.regions[i-1].end() > r.start {
			fail("regions at %#x and %#x overlap or are unsorted", s.regions[i-1].start, r.start)
		}
		if r.ph != nil {
			want, _ := roundUp64(r.ph.size, simLinearAlign)
			if r.start%simLinearAlign != 0 || r.ph.charge != want || r.size != want || r.ph.freed {
				fail("linear allocation at %#x: size %d, charge %d, region %d, freed %v", r.start, r.ph.size, r.ph.charge, r.size, r.ph.freed)
			}
			if r.ph.async {
				asyncLive += r.ph.charge
				asyncN++
			} else {
				used += r.ph.charge
			}
			if err := r.ph.mem.check(r.ph.size); err != nil {
				fail("contents at %#x: %v", r.start, err)
			}
			continue
		}
		if uint64(r.start)%s.cfg.Granularity != 0 || r.size%s.cfg.Granularity != 0 {
			fail("reservation [%#x, +%d) not granular", r.start, r.size)
		}
		for j, m := range r.maps {
			if m.start < r.start || m.start+uintptr(m.size) > r.end() || m.gone {
				fail("mapping at %#x outside its reservation or gone", m.start)
			}
			if j > 0 && r.maps[j-1].start+uintptr(r.maps[j-1].size) > m.start {
				fail("mappings at %#x and %#x overlap or are unsorted", r.maps[j-1].start, m.start)
			}
			if s.handles[m.ph.handle] != m.ph || m.size != m.ph.size {
				fail("mapping at %#x: handle %#x not live or size %d != %d", m.start, uint64(m.ph.handle), m.size, m.ph.size)
			}
			refs[m.ph]++
		}
	}
	slices.SortFunc(tiles, func(a, b simRange) int {
		if a.lo < b.lo {
			return -1
		}
		if a.lo > b.lo {
			return 1
		}
		return 0
	})
	at := s.va.lo
	for _, t := range tiles {
		if t.lo != at {
			fail("address space not tiled at %#x (next range at %#x)", at, t.lo)
			break
		}
		at = t.hi
	}
	if at != s.va.hi && len(errs) == 0 {
		fail("address space tiled to %#x, window ends at %#x", at, s.va.hi)
	}

	// Handles: reference counts and capacity.
	for h, ph := range s.handles {
		if ph.handle != h || ph.freed || ph.maps != refs[ph] || ph.released && ph.maps == 0 {
			fail("handle %#x: maps %d (counted %d), released %v, freed %v", uint64(h), ph.maps, refs[ph], ph.released, ph.freed)
		}
		used += ph.charge
		if err := ph.mem.check(ph.size); err != nil {
			fail("contents of handle %#x: %v", uint64(h), err)
		}
	}
	// The async pool: granules that cover its live allocations.
	if p := &s.apool; asyncLive != p.live || asyncN != p.allocs || p.live > p.reserved || p.reserved%s.cfg.Granularity != 0 ||
		p.reservedHigh < p.reserved || p.liveHigh < p.live {
		fail("async pool: live %d in %d (regions say %d in %d), reserved %d, highs %d/%d",
			p.live, p.allocs, asyncLive, asyncN, p.reserved, p.reservedHigh, p.liveHigh)
	}
	used += s.apool.reserved
	if used != s.used {
		fail("process used %d, allocations add up to %d", s.used, used)
	}

	// Streams: nothing runnable is left queued; live streams are in order.
	for i, st := range s.live {
		if i > 0 && s.live[i-1].idx >= st.idx {
			fail("live streams out of creation order")
		}
		if !st.held && len(st.queue) > 0 && st.queue[0].ready() {
			fail("stream %#x has runnable work queued", uintptr(st.h))
		}
		if st.destroyed && len(st.queue) == 0 {
			fail("destroyed stream %#x with no work not retired", uintptr(st.h))
		}
	}
	return errors.Join(errs...)
}
