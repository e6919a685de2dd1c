package tlsf

import "math/bits"

// Size classes (TLSF paper §3.2; mapping_insert and mapping_search in
// mattconte/tlsf).
//
// With granularity G = 2^g and 2^s second-level lists per power of two:
//
//   - sizes below smallSize = 2^(g+s) are "small": first-level index 0 and
//     one list per multiple of G (sl = size/G), so small classes are exact;
//   - a size with its highest set bit t ≥ g+s has fl = t-(g+s)+1 and
//     sl = the s bits below bit t, so each power of two [2^t, 2^(t+1)) is cut
//     into 2^s classes of width 2^(t-s).
//
// Both halves meet at smallSize: the small lists step by G = 2^g and the
// first large power of two, t = g+s, steps by 2^(t-s) = G too.

// mapping is the part of an Index's configuration the size classes need.
//
// Shift counts below are masked with &63: they never exceed 63, and the
// mask spares the compiler the code Go needs for shifts of 64 or more.
type mapping struct {
	granLog2  uint   // g: log2 of the granularity
	slLog2    uint   // s: log2 of the second-level list count
	smallSize uint64 // 2^(g+s): the first size mapped by its highest bit
	granMask  uint64 // 2^g − 1
}

// insert returns the list a free block of size bytes belongs to
// (mapping insert). size must be a non-zero multiple of the granularity,
// at most MaxSize.
func (m *mapping) insert(size uint64) (fl, sl uint) {
	if size < m.smallSize {
		return 0, uint(size >> (m.granLog2 & 63))
	}
	t := uint(bits.Len64(size)) - 1
	sl = uint(size>>((t-m.slLog2)&63)) ^ (1 << (m.slLog2 & 63))
	fl = t - (m.granLog2 + m.slLog2) + 1
	return fl, sl
}

// roundUp rounds a request of size bytes (1 ≤ size ≤ MaxSize) up to the
// lower bound of the next size class (mapping search): every block in the
// class insert(roundUp(size)) or above holds at least roundUp(size) bytes.
// The result is at most MaxSize, itself a class boundary.
func (m *mapping) roundUp(size uint64) uint64 {
	if size < m.smallSize {
		return (size + m.granMask) &^ m.granMask
	}
	t := uint(bits.Len64(size)) - 1
	mask := uint64(1)<<((t-m.slLog2)&63) - 1
	return (size + mask) &^ mask
}

// classMin returns the smallest size in list (fl, sl).
func (m *mapping) classMin(fl, sl uint) uint64 {
	if fl == 0 {
		return uint64(sl) << m.granLog2
	}
	t := fl + m.granLog2 + m.slLog2 - 1
	return uint64(1)<<t | uint64(sl)<<(t-m.slLog2)
}

// SizeClass returns the size class of a request of size bytes (1 to
// MaxSize): the index of the list mapping search starts from, counting
// lists from 0 in size order, and the block size such a request gets;
// for a size outside 1 to MaxSize, -1 and 0. It reads only the index's
// configuration, so it is safe to call concurrently with any other
// method.
func (x *Index) SizeClass(size uint64) (class int, rounded uint64) {
	return x.Classes().SizeClass(size)
}

// Classes is an index's size classes, detached from the index: a small
// value, safe to copy and to use from any goroutine. Callers on hot
// paths keep their own copy rather than reading the index's, whose
// neighbouring fields the index writes.
type Classes struct{ m mapping }

// Classes returns the index's size classes.
func (x *Index) Classes() Classes { return Classes{x.mapping} }

// SizeClass is Index.SizeClass.
func (c Classes) SizeClass(size uint64) (class int, rounded uint64) {
	if size-1 >= MaxSize { // size == 0 wraps around
		return -1, 0
	}
	rounded = c.m.roundUp(size)
	fl, sl := c.m.insert(rounded)
	return int(fl<<(c.m.slLog2&63) | sl), rounded // dense: not listIndex
}

// Size returns the block size of size class class (a value SizeClass
// returns): the class's lower bound, in bytes.
func (c Classes) Size(class int) uint64 {
	s := c.m.slLog2 & 63
	return c.m.classMin(uint(class)>>s, uint(class)&(1<<s-1))
}
