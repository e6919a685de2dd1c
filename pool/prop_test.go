package pool

// A state-machine property test (pgregory.net/rapid): random calls, bad
// ones included, against a plain model of what the caller holds, a map
// of live pointers to their usable bytes. After every action the pool's
// and the Sim's invariant checks pass, the pool's statistics agree with
// the model, and no two live blocks overlap.

import (
	"errors"
	"maps"
	"slices"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/tlsf"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

func TestPoolAgainstAModel(t *testing.T) {
	configs := []struct {
		be   Backend
		off  bool
		auto bool // caches off until an Engage action, as contention would
	}{
		{BackendVMM, false, false}, {BackendVMM, true, false}, {BackendVMM, false, true},
		{BackendChunks, false, false}, {BackendChunks, true, false}, {BackendChunks, false, true},
		{BackendPassthrough, true, false},
	}
	for _, c := range configs {
		name := configName(c.be, c.off)
		if c.auto {
			name = c.be.String() + "/caches=auto"
		}
		t.Run(name, rapid.MakeCheck(func(rt *rapid.T) {
			m := newPoolModel(rt, c.be, c.off)
			actions := m.actions()
			if c.auto {
				m.p.mu.Lock()
				m.p.cache.serving.Store(0) // as New leaves a pool with Eager false
				m.p.mu.Unlock()
				actions["Engage"] = m.engage
			}
			rt.Repeat(actions)
		}))
	}
}

// engage turns the caches on, as contention for the pool's lock does
// (lockContended), between any two calls.
func (m *poolModel) engage(rt *rapid.T) {
	m.p.mu.Lock()
	m.p.cache.engage()
	m.p.mu.Unlock()
	require.True(rt, m.p.Stats().CachesOn)
}

type modelBlock struct {
	n     uint64 // usable bytes: the request, or pitch × height
	class uint64 // what Stats count: the block size of n (blockSizeOn)
}

type poolModel struct {
	sd       *sim.Device
	d        testDevice
	p        *Pool
	streams  []device.Stream // 0 and two created ones
	maxBytes uint64

	live  map[uintptr]modelBlock
	freed map[uintptr]bool // freed and not handed out since
}

func newPoolModel(rt *rapid.T, be Backend, cacheOff bool) *poolModel {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	ss := newStreams(rt, sd, 2)
	maxBytes := rapid.SampledFrom([]uint64{0, 24 * miB}).Draw(rt, "MaxBytes")
	o := Options{
		Backend:  be,
		MaxBytes: maxBytes,
		Cache:    CacheOptions{Disable: cacheOff, Eager: !cacheOff},
		// Growth in steps from a granule to a quarter of the device.
		GrowFraction: rapid.SampledFrom([]float64{0, 1.0 / 64, 0.25}).Draw(rt, "GrowFraction"),
		Wilderness:   rapid.Bool().Draw(rt, "Wilderness"),
	}
	return &poolModel{
		sd: sd, d: d, p: openPool(rt, d, o),
		streams:  []device.Stream{0, ss[0], ss[1]},
		maxBytes: maxBytes,
		live:     map[uintptr]modelBlock{},
		freed:    map[uintptr]bool{},
	}
}

func (m *poolModel) actions() map[string]func(*rapid.T) {
	return map[string]func(*rapid.T){
		"":            m.check,
		"Alloc":       m.alloc,
		"AllocPitch":  m.allocPitch,
		"Free":        m.free,
		"Trim":        m.trim,
		"FreeStale":   m.freeStale,
		"FreeInside":  m.freeInside,
		"FreeForeign": m.freeForeign,
		"BadSize":     m.badSize,
	}
}

var sizeGen = rapid.OneOf(
	rapid.Uint64Range(1, 4*kiB),
	rapid.Uint64Range(1, miB),
	rapid.Uint64Range(miB, 8*miB),
	rapid.SampledFrom([]uint64{256, 4 * kiB, miB, 2 * miB}),
)

// check runs after every action.
func (m *poolModel) check(rt *rapid.T) {
	checkStep(rt, m.p, m.d)
	s := m.p.Stats()
	var allocated uint64
	for _, b := range m.live {
		allocated += b.class
	}
	require.Equal(rt, allocated, s.Allocated, "Allocated vs the model")
	require.Equal(rt, int64(len(m.live)), s.Allocations, "Allocations vs the model")
	if m.maxBytes > 0 {
		require.LessOrEqual(rt, s.Reserved, m.maxBytes)
	}
}

// stream draws the stream of a call: 0 through Alloc or Free, or one of
// the three streams through AllocOn or FreeOn.
func (m *poolModel) stream(rt *rapid.T) (device.Stream, bool) {
	i := rapid.IntRange(-1, len(m.streams)-1).Draw(rt, "stream")
	if i < 0 {
		return 0, true
	}
	return m.streams[i], false
}

// took records a new block of n bytes that statistics count at class
// bytes, after checking it against the live ones.
func (m *poolModel) took(rt *rapid.T, ptr uintptr, n, align, class uint64) {
	require.Zero(rt, ptr%uintptr(align), "%#x not aligned to %d", ptr, align)
	require.NotContains(rt, m.live, ptr)
	for q, b := range m.live {
		if ptr < q+uintptr(b.n) && q < ptr+uintptr(n) {
			rt.Fatalf("new block [%#x, +%d) overlaps live block [%#x, +%d)", ptr, n, q, b.n)
		}
	}
	// Every byte the caller may use is device memory the process holds.
	for _, a := range []uintptr{ptr, ptr + uintptr(n) - 1} {
		_, _, ok := m.sd.Owner(a)
		require.True(rt, ok, "byte %#x of block [%#x, +%d) is not mapped", a, ptr, n)
	}
	m.live[ptr] = modelBlock{n: n, class: class}
	delete(m.freed, ptr)
}

// refusedOOM checks an out-of-memory error: allowed only under a cap,
// and changing nothing the caller holds.
func (m *poolModel) refusedOOM(rt *rapid.T, before Stats, err error) {
	require.ErrorIs(rt, err, ErrOutOfMemory)
	require.NotZero(rt, m.maxBytes, "out of memory with 1 GiB free: %v", err)
	require.Equal(rt, liveState(before), liveState(m.p.Stats()))
	require.Equal(rt, before.OutOfMemory+1, m.p.Stats().OutOfMemory)
}

func (m *poolModel) alloc(rt *rapid.T) {
	n := sizeGen.Draw(rt, "size")
	s, plain := m.stream(rt)
	before := m.p.Stats()
	var ptr uintptr
	var err error
	if plain {
		ptr, err = m.p.Alloc(n)
	} else {
		ptr, err = m.p.AllocOn(n, s)
	}
	if err != nil {
		m.refusedOOM(rt, before, err)
		return
	}
	m.took(rt, ptr, n, 256, blockSizeOn(m.p, n, s))
}

func (m *poolModel) allocPitch(rt *rapid.T) {
	w := rapid.Uint64Range(1, 20000).Draw(rt, "width")
	h := rapid.Uint64Range(1, 200).Draw(rt, "height")
	before := m.p.Stats()
	ptr, pitch, err := m.p.AllocPitch(w, h)
	if err != nil {
		m.refusedOOM(rt, before, err)
		return
	}
	require.Equal(rt, (w+511)/512*512, pitch)
	m.took(rt, ptr, pitch*h, 512, sizeClass(pitch*h)) // aligned: good fit
}

func (m *poolModel) pick(rt *rapid.T, set []uintptr, label string) uintptr {
	if len(set) == 0 {
		rt.Skip("nothing to pick")
	}
	slices.Sort(set)
	return rapid.SampledFrom(set).Draw(rt, label)
}

func (m *poolModel) free(rt *rapid.T) {
	ptr := m.pick(rt, slices.Collect(maps.Keys(m.live)), "live")
	s, plain := m.stream(rt)
	if plain {
		require.NoError(rt, m.p.Free(ptr))
	} else {
		require.NoError(rt, m.p.FreeOn(ptr, s))
	}
	delete(m.live, ptr)
	m.freed[ptr] = true
	if rapid.Bool().Draw(rt, "free twice") {
		before := m.p.Stats()
		require.ErrorIs(rt, m.p.FreeOn(ptr, s), ErrDoubleFree, "freeing %#x again at once", ptr)
		require.Equal(rt, before, m.p.Stats(), "a refused free changes nothing, device calls included")
	}
}

func (m *poolModel) trim(rt *rapid.T) {
	before := m.p.Stats()
	n, err := m.p.Trim()
	require.NoError(rt, err)
	after := m.p.Stats()
	require.Equal(rt, before.Reserved-after.Reserved, n)
	require.Zero(rt, after.Cached)
	require.Zero(rt, after.Pending)
	require.Equal(rt, liveState(before), liveState(after))
}

// badFree frees ptr, which the caller does not own, and requires one of
// the sentinels and no change at all.
func (m *poolModel) badFree(rt *rapid.T, ptr uintptr, want ...error) {
	s, _ := m.stream(rt)
	before := m.p.Stats()
	err := m.p.FreeOn(ptr, s)
	require.Error(rt, err, "freeing %#x", ptr)
	if !slices.ContainsFunc(want, func(w error) bool { return errors.Is(err, w) }) {
		rt.Fatalf("freeing %#x: %v, want one of %v", ptr, err, want)
	}
	require.Equal(rt, before, m.p.Stats(), "a refused free changes nothing, device calls included")
}

// insideLive reports whether ptr lies inside (not at the start of) a
// block the caller holds.
func (m *poolModel) insideLive(ptr uintptr) bool {
	for q, b := range m.live {
		if ptr > q && ptr < q+uintptr(b.n) {
			return true
		}
	}
	return false
}

// freeStale frees a pointer freed earlier: a double free, or, once its
// memory was returned to the driver (a chunk) or lies inside another block
// the pool holds (pending, cached), an unknown pointer.
func (m *poolModel) freeStale(rt *rapid.T) {
	ptr := m.pick(rt, slices.Collect(maps.Keys(m.freed)), "freed")
	if m.insideLive(ptr) {
		m.badFree(rt, ptr, ErrUnknownPointer)
		return
	}
	m.badFree(rt, ptr, ErrDoubleFree, ErrUnknownPointer)
}

func (m *poolModel) freeInside(rt *rapid.T) {
	var big []uintptr
	for q, b := range m.live {
		if b.n > 1 {
			big = append(big, q)
		}
	}
	q := m.pick(rt, big, "live")
	off := rapid.Uint64Range(1, m.live[q].n-1).Draw(rt, "offset")
	m.badFree(rt, q+uintptr(off), ErrUnknownPointer)
}

func (m *poolModel) freeForeign(rt *rapid.T) {
	ptr := rapid.SampledFrom([]uintptr{
		8, 256, 0x1000, 0x7f0000000000 - 0x10000000, // below the Sim's window
		^uintptr(0), ^uintptr(0) - 255, 1 << 63,
	}).Draw(rt, "foreign")
	m.badFree(rt, ptr, ErrUnknownPointer)
}

func (m *poolModel) badSize(rt *rapid.T) {
	type call struct {
		name string
		do   func() error
		want error
	}
	calls := []call{
		{"Alloc(0)", func() error { _, err := m.p.Alloc(0); return err }, ErrInvalidSize},
		{"AllocOn(0, s)", func() error { _, err := m.p.AllocOn(0, m.streams[1]); return err }, ErrInvalidSize},
		{"AllocPitch(0, 1)", func() error { _, _, err := m.p.AllocPitch(0, 1); return err }, ErrInvalidSize},
		{"AllocPitch(1, 0)", func() error { _, _, err := m.p.AllocPitch(1, 0); return err }, ErrInvalidSize},
		{"Alloc(MaxSize+1)", func() error { _, err := m.p.Alloc(tlsf.MaxSize + 1); return err }, ErrTooLarge},
		{"AllocOn(2^64-1, s)", func() error { _, err := m.p.AllocOn(^uint64(0), m.streams[2]); return err }, ErrTooLarge},
		{"AllocPitch(2^40, 2^40)", func() error { _, _, err := m.p.AllocPitch(1<<40, 1<<40); return err }, ErrTooLarge},
		{"AllocPitch(2^64-1, 2)", func() error { _, _, err := m.p.AllocPitch(^uint64(0), 2); return err }, ErrTooLarge},
	}
	c := rapid.SampledFrom(calls).Draw(rt, "call")
	before := m.p.Stats()
	err := c.do()
	require.ErrorIs(rt, err, c.want, c.name)
	require.Equal(rt, before, m.p.Stats(), "%s changes nothing, device calls included", c.name)
}
