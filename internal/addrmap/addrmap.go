// Package addrmap maps addresses to uint64 values: an open-addressing hash
// table with linear probing and backward-shift deletion (no tombstones, so
// probe sequences never degrade), for the allocator's hot paths.
//
// Why not a Go map: the index does a lookup and a delete on every free and
// an insert on every allocation, and the Go map's generic hashing costs
// several times this table's multiply-and-shift. Keys are multiples of a
// granularity (2^shift bytes), so their low bits carry nothing and are
// shifted out before hashing (Fibonacci hashing: multiply by 2^64/φ and
// keep the top bits).
//
// A Map is not safe for concurrent use.
package addrmap

// Map maps uint64 keys (addresses) to uint64 values. The key 2^64−1 is
// reserved: it marks empty slots (no block can start there).
type Map struct {
	keys  []uint64 // empty where ^0
	vals  []uint64
	mask  uint64 // len(keys) - 1; the length is a power of two
	shift uint   // 64 - log2(len(keys))
	gran  uint   // log2 of the key granularity
	n     int
}

// minLog2: 256 slots to start (4.25 KiB).
const minLog2 = 8

// New returns an empty map for keys that are multiples of 2^granLog2.
func New(granLog2 uint) *Map {
	m := &Map{}
	m.Init(granLog2)
	return m
}

// Init makes m an empty map, for use as a value field.
func (m *Map) Init(granLog2 uint) {
	m.gran = granLog2
	m.alloc(minLog2)
}

func (m *Map) alloc(log2 uint) {
	m.keys = make([]uint64, 1<<log2)
	m.vals = make([]uint64, 1<<log2)
	for i := range m.keys {
		m.keys[i] = empty
	}
	m.mask = 1<<log2 - 1
	m.shift = 64 - log2
	m.n = 0
}

const empty = ^uint64(0)

func (m *Map) home(key uint64) uint64 {
	return ((key >> m.gran) * 0x9E3779B97F4A7C15) >> m.shift
}

// Len returns the number of entries.
func (m *Map) Len() int { return m.n }

// Get returns the value stored for key.
func (m *Map) Get(key uint64) (uint64, bool) {
	for i := m.home(key); ; i = (i + 1) & m.mask {
		switch m.keys[i] {
		case key:
			return m.vals[i], true
		case empty:
			return 0, false
		}
	}
}

// Put stores val for key, which must not be present.
func (m *Map) Put(key, val uint64) {
	// Keep the load factor at most 1/2: short probe sequences.
	if 2*(m.n+1) > len(m.keys) {
		m.grow()
	}
	i := m.home(key)
	for m.keys[i] != empty {
		i = (i + 1) & m.mask
	}
	m.keys[i], m.vals[i] = key, val
	m.n++
}

// Take removes key and returns the value that was stored for it.
func (m *Map) Take(key uint64) (uint64, bool) {
	i := m.home(key)
	for m.keys[i] != key {
		if m.keys[i] == empty {
			return 0, false
		}
		i = (i + 1) & m.mask
	}
	val := m.vals[i]
	// Backward shift: pull later entries of the cluster into the hole when
	// the hole lies between their home slot and where they sit.
	for j := (i + 1) & m.mask; m.keys[j] != empty; j = (j + 1) & m.mask {
		if (j-m.home(m.keys[j]))&m.mask >= (j-i)&m.mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.keys[i] = empty
	m.n--
	return val, true
}

func (m *Map) grow() {
	keys, vals := m.keys, m.vals
	m.alloc(64 - m.shift + 1)
	for i, k := range keys {
		if k != empty {
			m.Put(k, vals[i])
		}
	}
}

// All calls fn for every entry, in no particular order, until fn returns
// false. fn must not change the map.
func (m *Map) All(fn func(key, val uint64) bool) {
	for i, k := range m.keys {
		if k != empty && !fn(k, m.vals[i]) {
			return
		}
	}
}
