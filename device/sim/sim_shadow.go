package sim

// Memory contents (Config.Shadow) and the calls that touch them:
// cuMemsetD32, cuMemsetD32Async, cuMemcpyDtoH.
//
// The only writes a Device can make are 32-bit fills at 4-byte aligned
// addresses, and every physical allocation starts 4-byte aligned (512 for
// linear memory, the granularity for handles). So the contents of one
// physical allocation are an interval map: sorted, disjoint segments of
// byte offsets, each filled with one 32-bit word, with offsets that are
// multiples of 4. Byte x of a segment filled with v is byte x%4 of v,
// little-endian. Bytes in no segment were never written and read as
// Uninitialized. A fill replaces what it covers, trims what it
// touches, and merges with equal neighbours, so a pool's many-GiB blocks
// cost a few segments.

import (
	"encoding/binary"
	"fmt"
	"slices"
	"sort"

	"github.com/gpumem/tlsf/device"
)

// simSeg is bytes [lo, hi) filled with word v.
type simSeg struct {
	lo, hi uint64
	v      uint32
}

// simShadow is the contents of one physical allocation.
type simShadow struct {
	segs []simSeg // sorted by lo, disjoint, non-empty, equal neighbours merged
}

// fill sets bytes [lo, hi) to word v; lo and hi are multiples of 4.
func (m *simShadow) fill(lo, hi uint64, v uint32) {
	if lo >= hi {
		return
	}
	// Segments [i, j) overlap [lo, hi); a and b widen that by one
	// neighbour each side so merges need no special case.
	i := sort.Search(len(m.segs), func(k int) bool { return m.segs[k].hi > lo })
	j := i + sort.Search(len(m.segs)-i, func(k int) bool { return m.segs[i+k].lo >= hi })
	a, b := max(i-1, 0), min(j+1, len(m.segs))
	var repl []simSeg
	add := func(sg simSeg) {
		if sg.lo >= sg.hi {
			return
		}
		if n := len(repl); n > 0 && repl[n-1].hi == sg.lo && repl[n-1].v == sg.v {
			repl[n-1].hi = sg.hi
			return
		}
		repl = append(repl, sg)
	}
	if a < i {
		add(m.segs[a])
	}
	if i < j {
		add(simSeg{m.segs[i].lo, min(m.segs[i].hi, lo), m.segs[i].v})
	}
	add(simSeg{lo, hi, v})
	if i < j {
		add(simSeg{max(m.segs[j-1].lo, hi), m.segs[j-1].hi, m.segs[j-1].v})
	}
	if j < b {
		add(m.segs[j])
	}
	m.segs = slices.Replace(m.segs, a, b, repl...)
}

// read copies bytes [off, off+len(dst)) into dst.
func (m *simShadow) read(dst []byte, off uint64) {
	end := off + uint64(len(dst))
	at := off
	i := sort.Search(len(m.segs), func(k int) bool { return m.segs[k].hi > off })
	for ; i < len(m.segs) && m.segs[i].lo < end && at < end; i++ {
		sg := m.segs[i]
		if sg.lo > at {
			simPattern(dst[at-off:sg.lo-off], at, Uninitialized)
			at = sg.lo
		}
		hi := min(sg.hi, end)
		simPattern(dst[at-off:hi-off], at, sg.v)
		at = hi
	}
	simPattern(dst[at-off:], at, Uninitialized)
}

// check verifies the representation's invariants for an allocation of
// size bytes.
func (m *simShadow) check(size uint64) error {
	for k, sg := range m.segs {
		switch {
		case sg.lo >= sg.hi || sg.hi > size:
			return fmt.Errorf("segment %d [%d, %d) empty or beyond %d bytes", k, sg.lo, sg.hi, size)
		case sg.lo%4 != 0 || sg.hi%4 != 0 && sg.hi != size:
			return fmt.Errorf("segment %d [%d, %d) not 4-byte aligned", k, sg.lo, sg.hi)
		case k > 0 && m.segs[k-1].hi > sg.lo:
			return fmt.Errorf("segments %d and %d overlap", k-1, k)
		case k > 0 && m.segs[k-1].hi == sg.lo && m.segs[k-1].v == sg.v:
			return fmt.Errorf("segments %d and %d touch with equal words: not merged", k-1, k)
		}
	}
	return nil
}

// simPattern fills dst with word v as memory at byte offset off (from a
// 4-byte aligned base) holds it.
func simPattern(dst []byte, off uint64, v uint32) {
	if len(dst) == 0 {
		return
	}
	var w [4]byte
	binary.LittleEndian.PutUint32(w[:], v)
	// Rotate so that dst[0] gets byte off%4; then the period-4 pattern
	// doubles by copying.
	r := off % 4
	n := copy(dst, append(w[r:], w[:r]...))
	for n < len(dst) {
		n += copy(dst[n:], dst[:n])
	}
}

// write fills the live spans with word v, if contents are kept.
func (s *Device) write(spans []simSpan, v uint32) {
	if !s.cfg.Shadow {
		return
	}
	for i := range spans {
		if sp := &spans[i]; sp.live() {
			sp.ph.mem.fill(sp.off, sp.off+sp.n, v)
		}
	}
}

// memsetSpans validates a memset of n words at ptr for call c.
func (s *Device) memsetSpans(c device.Call, ptr uintptr, n uint64) ([]simSpan, uint64, error) {
	if ptr%4 != 0 {
		return nil, 0, simErr(c, device.ErrInvalidValue, "%#x is not 4-byte aligned", ptr)
	}
	if n > (1<<64-1)/4 {
		return nil, 0, simErr(c, device.ErrInvalidValue, "%d words overflow", n)
	}
	spans, err := s.resolve(c, ptr, 4*n)
	return spans, 4 * n, err
}

// syncDefault waits for the work issued on the default stream, as host-
// synchronous calls on the legacy default stream do; it lifts a hold on
// the default stream if there is work to wait for.
func (s *Device) syncDefault() {
	def := s.streams[0]
	s.complete(def, func() bool { return len(def.queue) == 0 })
	s.host.join(def.clock)
}

// MemsetD32 sets n 32-bit words at ptr to value (cuMemsetD32_v2),
// synchronously: it first waits for work on the default stream. With
// Shadow the words are stored. Touching bytes that queued work on a held
// stream will write records a race (Violations). Errors: ptr not 4-byte
// aligned, or 4n overflowing, is ErrInvalidValue; any byte of
// [ptr, ptr+4n) not allocated, not mapped, or mapped without access is
// ErrIllegalAddress. n = 0 does nothing.
func (s *Device) MemsetD32(ptr uintptr, value uint32, n uint64) error {
	const c = device.CallMemsetD32
	return s.do(c, func() (uint64, error) {
		spans, bytes, err := s.memsetSpans(c, ptr, n)
		if err != nil {
			return 0, err
		}
		s.syncDefault()
		s.hostRace(c, spans, "wrote")
		s.write(spans, value)
		return bytes, nil
	})
}

// MemsetD32Async issues a memset of n words at ptr to value on stream h
// (cuMemsetD32Async). It runs at once unless h is held or waits for an
// event's work; then it is queued, and its words land when it runs. The
// addresses are checked when it is issued; if the memory is freed or
// unmapped before it runs, that is a violation and the write is dropped.
// Errors: as MemsetD32, and an unknown or destroyed stream is
// ErrInvalidValue.
func (s *Device) MemsetD32Async(ptr uintptr, value uint32, n uint64, h device.Stream) error {
	const c = device.CallMemsetD32Async
	return s.do(c, func() (uint64, error) {
		st, err := s.stream(c, h)
		if err != nil {
			return 0, err
		}
		spans, bytes, err := s.memsetSpans(c, ptr, n)
		if err != nil || n == 0 {
			return 0, err
		}
		s.enqueue(st, &simItem{kind: simItemMemset, ptr: ptr, value: value, words: n, spans: spans})
		return bytes, nil
	})
}

// MemcpyDtoH copies len(dst) bytes at device address src into dst
// (cuMemcpyDtoH_v2), after waiting for work on the default stream. Without
// Shadow every byte reads as Uninitialized. Reading bytes that queued
// work on a held stream will write records a race (Violations). Errors:
// any byte of [src, src+len(dst)) not allocated, not mapped, or mapped
// without access is ErrIllegalAddress, and dst is left unchanged.
func (s *Device) MemcpyDtoH(dst []byte, src uintptr) error {
	const c = device.CallMemcpyDtoH
	return s.do(c, func() (uint64, error) {
		spans, err := s.resolve(c, src, uint64(len(dst)))
		if err != nil {
			return 0, err
		}
		s.syncDefault()
		s.hostRace(c, spans, "read")
		at := 0
		for _, sp := range spans {
			part := dst[at : at+int(sp.n)]
			if s.cfg.Shadow {
				sp.ph.mem.read(part, sp.off)
			} else {
				simPattern(part, sp.off, Uninitialized)
			}
			at += int(sp.n)
		}
		return uint64(len(dst)), nil
	})
}
