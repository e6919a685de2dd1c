package fuzz

import (
	"encoding/binary"
	"math"

	"github.com/gpumem/tlsf/tlsf"
)

// Operation sequences from bytes.
//
// The allocator targets (FuzzIndex, FuzzPool) read their input as a
// program: a header that configures the allocator, then one operation per
// opcode byte, each followed by the bytes of its arguments. A reader
// returns zeros past the end of the input, so every input decodes to some
// program, the empty one included, and the fuzzer's mutations (flipping,
// inserting or cutting bytes) map to small changes of the program: a
// different size, a different victim, one operation more or less.

// maxOps bounds the operations one input runs, so that a long input costs
// no more than a few milliseconds and the fuzzer keeps its pace.
const maxOps = 256

// reader decodes an input front to back.
type reader struct {
	b []byte
}

// more reports whether input is left for another operation.
func (r *reader) more() bool { return len(r.b) > 0 }

// u8 returns the next byte, or 0 past the end.
func (r *reader) u8() uint8 {
	if len(r.b) == 0 {
		return 0
	}
	v := r.b[0]
	r.b = r.b[1:]
	return v
}

// u16 returns the next two bytes, little-endian (zeros past the end).
func (r *reader) u16() uint16 {
	var w [2]byte
	r.b = r.b[copy(w[:], r.b):]
	return binary.LittleEndian.Uint16(w[:])
}

// u64 returns the next eight bytes, little-endian (zeros past the end).
func (r *reader) u64() uint64 {
	var w [8]byte
	r.b = r.b[copy(w[:], r.b):]
	return binary.LittleEndian.Uint64(w[:])
}

// intn returns a number in [0, n) from one byte (n ≤ 256) or two.
func (r *reader) intn(n int) int {
	if n <= 0 {
		return 0
	}
	if n <= 256 {
		return int(r.u8()) % n
	}
	return int(r.u16()) % n
}

// bool returns the low bit of the next byte.
func (r *reader) bool() bool { return r.u8()&1 == 1 }

// pick returns one of choices, chosen by the next byte.
func pick[T any](r *reader, choices ...T) T { return choices[r.intn(len(choices))] }

// hugeSizes are requests no allocator can serve: every one must fail
// with a too-large error, changing nothing. 2^64−255 is where naive
// rounding up to 256 bytes overflows to 0; MaxSize+256 is one granule
// past the largest block.
var hugeSizes = []uint64{
	math.MaxUint64,
	math.MaxUint64 - 254,
	1 << 63,
	tlsf.MaxSize + 256,
	tlsf.MaxSize + 1,
}

// size decodes a request size in bytes for an allocator of granularity
// gran whose interesting sizes reach about 2^topLog2 bytes. It favours
// what breaks allocators: sizes of a few granules, size-class boundaries
// 2^k and a few granules either side, and, rarely, 0 and hugeSizes.
func (r *reader) size(gran uint64, topLog2 uint) uint64 {
	switch r.u8() % 16 {
	case 0:
		if r.bool() {
			return 0
		}
		return pick(r, hugeSizes...)
	case 1, 2, 3:
		// A class boundary ± up to 4 granules, or ± a few bytes.
		k := uint(r.intn(int(topLog2) + 1))
		d := int64(r.u8()%9) - 4
		if r.bool() {
			d *= int64(gran)
		}
		return uint64(max(int64(1)<<k+d, 1))
	case 4, 5, 6, 7, 8:
		return 1 + uint64(r.u8())*gran/4 // up to 64 granules, mostly unaligned
	case 9:
		return 1 + uint64(r.u8()) // below one granule
	default:
		// Anything up to 2^topLog2, log-uniform.
		k := uint(r.intn(int(topLog2) + 1))
		return 1 + r.u64()%(uint64(1)<<k)
	}
}
