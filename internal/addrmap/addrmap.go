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
	slots []slot
	mask  uint64 // len(slots) - 1; the length is a power of two
	shift uint   // 64 - log2(len(slots))
	gran  uint   // log2 of the key granularity
	n     int
}

// minLog2: 256 slots to start (4 KiB).
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
	m.slots = make([]slot, 1<<log2)
	for i := range m.slots {
		m.slots[i].key = empty
	}
	m.mask = 1<<log2 - 1
	m.shift = 64 - log2
	m.n = 0
}

const empty = ^uint64(0)

// slot keeps a key beside its value: one cache line holds both.
type slot struct {
	key, val uint64 // key is empty in a free slot
}

func (m *Map) home(key uint64) uint64 {
	return ((key >> (m.gran & 63)) * 0x9E3779B97F4A7C15) >> (m.shift & 63)
}

// Len returns the number of entries.
func (m *Map) Len() int { return m.n }

// Get returns the value stored for key.
func (m *Map) Get(key uint64) (uint64, bool) {
	if key == empty {
		return 0, false // it would match the first free slot
	}
	for i := m.home(key); ; i = (i + 1) & m.mask {
		switch m.slots[i].key {
		case key:
			return m.slots[i].val, true
		case empty:
			return 0, false
		}
	}
}

// Put stores val for key, which must not be present and must not be the
// reserved key 2^64−1.
func (m *Map) Put(key, val uint64) {
	if m.n+1 > m.maxLoad() {
		m.grow()
	}
	slots, mask := m.slots, m.mask
	i := m.home(key)
	for slots[i].key != empty {
		i = (i + 1) & mask
	}
	slots[i] = slot{key, val}
	m.n++
}

// Take removes key and returns the value that was stored for it.
func (m *Map) Take(key uint64) (uint64, bool) {
	if key == empty {
		return 0, false // it would match, and remove, the first free slot
	}
	slots, mask := m.slots, m.mask
	i := m.home(key)
	for {
		k := slots[i].key
		if k == key {
			break
		}
		if k == empty {
			return 0, false
		}
		i = (i + 1) & mask
	}
	val := slots[i].val
	// Backward shift: pull later entries of the cluster into the hole when
	// the hole lies between their home slot and where they sit.
	gran, shift := m.gran&63, m.shift&63
	for j := (i + 1) & mask; ; j = (j + 1) & mask {
		k := slots[j].key
		if k == empty {
			break
		}
		home := ((k >> gran) * 0x9E3779B97F4A7C15) >> shift
		if (j-home)&mask >= (j-i)&mask {
			slots[i] = slots[j]
			i = j
		}
	}
	slots[i].key = empty
	m.n--
	return val, true
}

// sparseLog2: a table of fewer than 2^sparseLog2 slots keeps its load
// factor at most 1/8 (up to 32,768 entries, in 2^18 slots: 4 MiB), a
// larger one at most 1/2 (32,769 to 262,144 entries in 2^19 slots, 8 MiB;
// then 2 to 4 slots per entry). A sparse table's
// probe loops (the search, and deletion's backward shift to the end of
// the run) almost always stop at their first slot, so their branches
// predict; at a load of 1/2 they run a varying few slots more (probe
// distances up to 15 on mobilenet). Measured through the pool on the
// simulated H200 (BenchmarkPoolReplay's median of 20 replays, two runs
// each alternating, pinned to one core of the 2-core AMD EPYC development
// VM, 2026-12-04), warm replays took, at most 1/2, 1/4 and 1/8:
// mobilenet 50.0, 41.4 and 38.0 ns per operation, llama-bf16 49.7, 45.1
// and 42.3, resnet50 45.0, 38.1 and 35.9, bert 43.9, 39.1 and 37.3, lstm
// 39.6, 38.3 and 38.3. The price is memory: 8 to 16 slots of 16 bytes
// per entry instead of 2 to 4 in a sparse table, and at most 8 MiB where
// the old bound took 2 MiB, at 32,769 entries.
const sparseLog2 = 19

// maxLoad is the most entries m holds before it grows.
func (m *Map) maxLoad() int {
	if len(m.slots) < 1<<sparseLog2 {
		return len(m.slots) / 8
	}
	return len(m.slots) / 2
}

func (m *Map) grow() {
	old := m.slots
	m.alloc(64 - m.shift + 1)
	for _, sl := range old {
		if sl.key != empty {
			m.Put(sl.key, sl.val)
		}
	}
}

// All calls fn for every entry, in no particular order, until fn returns
// false. fn must not change the map.
func (m *Map) All(fn func(key, val uint64) bool) {
	for _, sl := range m.slots {
		if sl.key != empty && !fn(sl.key, sl.val) {
			return
		}
	}
}
