package addrmap

import (
	"testing"

	"pgregory.net/rapid"
)

// The map agrees with a Go map under random puts, takes and gets, across
// growth and backward-shift deletions.
func TestAgainstGoMap(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := New(8)
		ref := map[uint64]uint64{}
		// Keys from a small range collide often, exercising clusters.
		key := rapid.Custom(func(t *rapid.T) uint64 { return rapid.Uint64Range(0, 4095).Draw(t, "k") << 8 })
		t.Repeat(map[string]func(*rapid.T){
			"put": func(t *rapid.T) {
				k, v := key.Draw(t, "key"), rapid.Uint64().Draw(t, "val")
				if _, ok := ref[k]; ok {
					t.Skip("present")
				}
				m.Put(k, v)
				ref[k] = v
			},
			"take": func(t *rapid.T) {
				k := key.Draw(t, "key")
				v, ok := m.Take(k)
				rv, rok := ref[k]
				if ok != rok || v != rv {
					t.Fatalf("take %#x: %d %v, want %d %v", k, v, ok, rv, rok)
				}
				delete(ref, k)
			},
			"": func(t *rapid.T) {
				if m.Len() != len(ref) {
					t.Fatalf("len %d, want %d", m.Len(), len(ref))
				}
				for k, v := range ref {
					if got, ok := m.Get(k); !ok || got != v {
						t.Fatalf("get %#x: %d %v, want %d", k, got, ok, v)
					}
				}
				n := 0
				m.All(func(k, v uint64) bool { n++; return ref[k] == v })
				if n != len(ref) {
					t.Fatalf("All visited %d of %d", n, len(ref))
				}
			},
		})
	})
}

// The reserved key marks empty slots: looking it up finds nothing, and
// taking it removes nothing.
func TestReservedKeyIsNeverFound(t *testing.T) {
	m := New(8)
	m.Put(256, 1)
	if _, ok := m.Get(^uint64(0)); ok {
		t.Fatal("Get of the reserved key found an empty slot")
	}
	if _, ok := m.Take(^uint64(0)); ok {
		t.Fatal("Take of the reserved key took an empty slot")
	}
	if v, ok := m.Get(256); !ok || v != 1 || m.Len() != 1 {
		t.Fatal("the map changed")
	}
}

// A table that grows past sparseLog2 slots, where its load factor bound
// changes from 1/8 to 1/2, keeps every entry, and empties.
func TestGrowingPastTheSparseBound(t *testing.T) {
	m := New(8)
	const n = 1<<(sparseLog2-1) + 1000 // more than half of 2^sparseLog2 slots
	for i := range uint64(n) {
		m.Put(i<<8, i)
		if m.Len() > m.maxLoad() {
			t.Fatalf("%d entries in %d slots, above the bound %d", m.Len(), len(m.slots), m.maxLoad())
		}
		switch m.Len() {
		case 1 << (sparseLog2 - 4): // the most a sparse table holds: 1/8 of 2^(sparseLog2-1)
			if len(m.slots) != 1<<(sparseLog2-1) {
				t.Fatalf("%d entries in %d slots, want %d", m.Len(), len(m.slots), 1<<(sparseLog2-1))
			}
		case 1<<(sparseLog2-4) + 1, 1 << (sparseLog2 - 1): // then up to half of 2^sparseLog2
			if len(m.slots) != 1<<sparseLog2 {
				t.Fatalf("%d entries in %d slots, want %d", m.Len(), len(m.slots), 1<<sparseLog2)
			}
		}
	}
	if len(m.slots) < 1<<sparseLog2 || len(m.slots) > 1<<(sparseLog2+1) {
		t.Fatalf("%d slots for %d entries", len(m.slots), n)
	}
	for i := range uint64(n) {
		if v, ok := m.Take(i << 8); !ok || v != i {
			t.Fatalf("take %#x: %d %v", i<<8, v, ok)
		}
	}
	if m.Len() != 0 {
		t.Fatalf("%d entries left", m.Len())
	}
}
