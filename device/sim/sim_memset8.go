package sim

// cuMemsetD8Async: byte fills on the word-based shadow memory.
//
// The shadow (sim_shadow.go) stores 32-bit words at 4-byte aligned
// offsets. A byte fill of [lo, hi) stores the whole words inside it as the
// byte repeated four times, and rewrites each partly covered word at
// either end from its current contents with the covered bytes replaced:
// at most two read-modify-writes per physical allocation touched.

import (
	"encoding/binary"

	"github.com/gpumem/tlsf/device"
)

var _ device.ByteSetter = (*Device)(nil)

// MemsetD8Async issues a fill of n bytes at ptr with value on stream h
// (cuMemsetD8Async); ptr may have any alignment. Like MemsetD32Async it
// runs at once unless h is held, and its bytes land when it runs. Errors:
// an unknown or destroyed stream is ErrInvalidValue; any byte of
// [ptr, ptr+n) not allocated, not mapped, or mapped without access is
// ErrIllegalAddress. n = 0 does nothing.
func (s *Device) MemsetD8Async(ptr uintptr, value byte, n uint64, h device.Stream) error {
	const c = device.CallMemsetD8Async
	return s.do(c, func() (uint64, error) {
		st, err := s.stream(c, h)
		if err != nil {
			return 0, err
		}
		if n == 0 {
			return 0, nil
		}
		spans, err := s.resolve(c, ptr, n)
		if err != nil {
			return 0, err
		}
		s.enqueue(st, &simItem{kind: simItemMemset, d8: true, ptr: ptr, value: uint32(value), words: n, spans: spans})
		return n, nil
	})
}

// writeBytes fills the live spans with byte b, if contents are kept.
func (s *Device) writeBytes(spans []simSpan, b byte) {
	if !s.cfg.Shadow {
		return
	}
	for i := range spans {
		if sp := &spans[i]; sp.live() {
			sp.ph.mem.fillBytes(sp.off, sp.off+sp.n, b, sp.ph.size)
		}
	}
}

// fillBytes sets bytes [lo, hi) of an allocation of size bytes to b.
func (m *simShadow) fillBytes(lo, hi uint64, b byte, size uint64) {
	if lo >= hi {
		return
	}
	word := uint32(b) * 0x01010101
	inLo, inHi := (lo+3)&^3, hi&^3
	if inLo < inHi {
		m.fill(inLo, inHi, word)
	}
	// The partly covered words: the one holding lo and the one holding
	// hi−1 (the same word when the fill lies inside one).
	edges := []uint64{lo &^ 3}
	if last := (hi - 1) &^ 3; last != edges[0] {
		edges = append(edges, last)
	}
	for _, w := range edges {
		if w >= inLo && w+4 <= inHi {
			continue // whole word, filled above
		}
		var cur [4]byte
		m.read(cur[:], w)
		for k := uint64(0); k < 4; k++ {
			if at := w + k; at >= lo && at < hi {
				cur[k] = b
			}
		}
		// A word past the end of an allocation whose size is not a
		// multiple of 4 is stored up to the end only.
		m.fill(w, min(w+4, size), binary.LittleEndian.Uint32(cur[:]))
	}
}

var _ device.ByteStorer = (*Device)(nil)

// StoreByte stores value at ptr as a kernel on stream h would: a
// one-byte MemsetD8Async, counted as one (cuMemsetD8Async). Errors: as
// MemsetD8Async.
func (s *Device) StoreByte(ptr uintptr, value byte, h device.Stream) error {
	return s.MemsetD8Async(ptr, value, 1, h)
}

// KeepsContents reports whether the device keeps what is written to its
// memory (Config.Shadow): without it every byte reads back as
// Uninitialized. The pool's guard mode needs it.
func (s *Device) KeepsContents() bool { return s.cfg.Shadow }
