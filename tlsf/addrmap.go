package tlsf

// addrMap maps the start address of every allocated block to its record:
// an open-addressing hash table with linear probing and backward-shift
// deletion (no tombstones, so probe sequences never degrade).
//
// Why not a Go map: a free does one lookup and one delete, an allocation
// one insert, and the Go map's generic hashing costs several times this
// table's multiply-and-shift on the index's hot path. Keys are multiples of
// the granularity, so their low bits carry nothing and are shifted out
// before hashing (Fibonacci hashing: multiply by 2^64/φ, keep the top bits).
type addrMap struct {
	keys     []uint64
	vals     []uint32 // record index + 1; 0 marks an empty slot
	mask     uint64   // len(keys) - 1; the length is a power of two
	shift    uint     // 64 - log2(len(keys))
	granLog2 uint
	n        int // occupied slots
}

// minAddrMapLog2: 1024 slots (12 KiB) to start.
const minAddrMapLog2 = 10

func (m *addrMap) init(granLog2 uint) {
	m.granLog2 = granLog2
	m.alloc(minAddrMapLog2)
}

func (m *addrMap) alloc(log2 uint) {
	m.keys = make([]uint64, 1<<log2)
	m.vals = make([]uint32, 1<<log2)
	m.mask = 1<<log2 - 1
	m.shift = 64 - log2
	m.n = 0
}

func (m *addrMap) slot(key uint64) uint64 {
	return ((key >> m.granLog2) * 0x9E3779B97F4A7C15) >> m.shift
}

// get returns the record index stored for key.
func (m *addrMap) get(key uint64) (uint32, bool) {
	for i := m.slot(key); ; i = (i + 1) & m.mask {
		v := m.vals[i]
		if v == 0 {
			return 0, false
		}
		if m.keys[i] == key {
			return v - 1, true
		}
	}
}

// put stores rec for key, which must not be present.
func (m *addrMap) put(key uint64, rec uint32) {
	// Keep the load factor at most 1/2: short probe sequences.
	if 2*(m.n+1) > len(m.keys) {
		m.grow()
	}
	i := m.slot(key)
	for m.vals[i] != 0 {
		i = (i + 1) & m.mask
	}
	m.keys[i] = key
	m.vals[i] = rec + 1
	m.n++
}

// del removes key and reports whether it was present.
func (m *addrMap) del(key uint64) bool {
	_, ok := m.take(key)
	return ok
}

// take removes key and returns the record index stored for it.
func (m *addrMap) take(key uint64) (uint32, bool) {
	i := m.slot(key)
	var v uint32
	for {
		v = m.vals[i]
		if v == 0 {
			return 0, false
		}
		if m.keys[i] == key {
			break
		}
		i = (i + 1) & m.mask
	}
	// Backward shift: pull later entries of the cluster into the hole when
	// the hole lies between their home slot and where they sit.
	for j := (i + 1) & m.mask; m.vals[j] != 0; j = (j + 1) & m.mask {
		home := m.slot(m.keys[j])
		if (j-home)&m.mask >= (j-i)&m.mask {
			m.keys[i], m.vals[i] = m.keys[j], m.vals[j]
			i = j
		}
	}
	m.vals[i] = 0
	m.n--
	return v - 1, true
}

func (m *addrMap) grow() {
	keys, vals := m.keys, m.vals
	m.alloc(64 - m.shift + 1)
	for i, v := range vals {
		if v != 0 {
			m.put(keys[i], v-1)
		}
	}
}

// each calls fn for every entry, in no particular order.
func (m *addrMap) each(fn func(key uint64, rec uint32)) {
	for i, v := range m.vals {
		if v != 0 {
			fn(m.keys[i], v-1)
		}
	}
}
