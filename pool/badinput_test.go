package pool_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"reflect"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
	"github.com/gpumem/tlsf/tlsf"
)

// The bad-input matrix: every way of calling the public API wrongly, on
// every backend with caches on and off. Each case asserts the exact
// sentinel and that nothing changed: Check passes, the statistics are
// those before the call (apart from the counters of device calls,
// out-of-memory events and retries), the device holds what Reserved says,
// and every live block still holds the pattern written into it.

// configs are the backends and cache settings every case runs on.
var configs = []struct {
	backend  pool.Backend
	cacheOff bool
}{
	{pool.BackendVMM, false}, {pool.BackendVMM, true},
	{pool.BackendChunks, false}, {pool.BackendChunks, true},
	{pool.BackendPassthrough, false}, {pool.BackendPassthrough, true},
}

func configName(be pool.Backend, cacheOff bool) string {
	if cacheOff {
		return be.String() + "/caches-off"
	}
	return be.String() + "/caches-on"
}

// block is a live allocation of a fixture, filled with pat.
type block struct {
	ptr  uintptr
	size uint64
	pat  uint32
}

// fixture is a pool on a simulated GPU with shadow memory, holding a few
// live blocks of assorted sizes and one freed pointer.
type fixture struct {
	t       testing.TB
	sd      *sim.Device
	p       *pool.Pool
	backend pool.Backend
	live    []block
	freed   uintptr // freed once
	stream  device.Stream
	other   *pool.Pool // a second pool on the same device and process
	foreign uintptr    // live in other
}

func newFixture(t testing.TB, be pool.Backend, cacheOff bool, opts pool.Options) *fixture {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: 1 << 30, Shadow: true, Seed: 7})
	opts.Backend = be
	opts.Cache.Disable = cacheOff
	if opts.IdleRelease == 0 {
		opts.IdleRelease = -1 // the statistics change only with the test's own calls
	}
	p, err := pool.New(sd, opts)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	s, err := sd.StreamCreate()
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{t: t, sd: sd, p: p, backend: be, stream: s}
	if f.other, err = pool.New(sd, pool.Options{Backend: be}); err != nil {
		t.Fatal(err)
	}
	if f.foreign, err = f.other.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = f.other.Close() })
	for i, size := range []uint64{1, 256, 4096, 1<<20 + 1, 3 << 20, 12345} {
		ptr, err := p.Alloc(size)
		if err != nil {
			t.Fatalf("Alloc(%d): %v", size, err)
		}
		f.add(block{ptr: ptr, size: size, pat: 0xb10c0000 + uint32(i)})
	}
	ptr, pitch, err := p.AllocPitch(1000, 7)
	if err != nil {
		t.Fatalf("AllocPitch: %v", err)
	}
	f.add(block{ptr: ptr, size: pitch * 7, pat: 0x717c0000})
	// The pointer freed once: a 4 KiB block between live ones.
	f.freed = f.live[2].ptr
	if err := p.Free(f.freed); err != nil {
		t.Fatal(err)
	}
	f.live = append(f.live[:2], f.live[3:]...)
	f.check("fixture")
	return f
}

func (f *fixture) add(b block) {
	if err := f.sd.MemsetD32(b.ptr, b.pat, b.size/4); err != nil {
		f.t.Fatalf("filling [%#x +%d): %v", b.ptr, b.size, err)
	}
	f.live = append(f.live, b)
}

// deviceBytes is what the Sim holds for the pool: the requested bytes of
// its linear allocations for a passthrough pool, else what Mapped counts
// (chunks and unreleased VMM handles).
func deviceBytes(sd *sim.Device, be pool.Backend) uint64 {
	if be == pool.BackendPassthrough {
		return sd.Stats().LinearBytes
	}
	return sd.Mapped()
}

// check verifies the invariants and samples the live blocks' contents
// (checkAll reads them whole).
func (f *fixture) check(when string) {
	t := f.t
	t.Helper()
	if err := f.p.Check(); err != nil {
		t.Fatalf("%s: Check: %v", when, err)
	}
	if err := f.sd.Check(); err != nil {
		t.Fatalf("%s: Sim Check: %v", when, err)
	}
	if v := f.sd.Violations(); len(v) > 0 {
		t.Fatalf("%s: Sim violations: %q", when, v)
	}
	if r, d := f.p.Stats().Reserved+f.other.Stats().Reserved, deviceBytes(f.sd, f.backend); r != d {
		t.Fatalf("%s: Reserved %d by both pools, the device holds %d for them", when, r, d)
	}
	for _, b := range f.live {
		expectSampled(t, f.sd, b)
	}
}

func (f *fixture) checkAll(when string) {
	f.t.Helper()
	f.check(when)
	for _, b := range f.live {
		expectPattern(f.t, f.sd, when, b)
	}
}

// expectPattern checks that block b holds its pattern throughout.
func expectPattern(t testing.TB, sd *sim.Device, when string, b block) {
	t.Helper()
	n := b.size / 4 * 4
	got := make([]byte, n)
	if err := sd.MemcpyDtoH(got, b.ptr); err != nil {
		t.Fatalf("%s: reading [%#x +%d): %v", when, b.ptr, b.size, err)
	}
	want := bytes.Repeat(binary.LittleEndian.AppendUint32(nil, b.pat), int(n/4))
	if i := firstDiff(got, want); i >= 0 {
		t.Fatalf("%s: block [%#x +%d) clobbered at +%d", when, b.ptr, b.size, i)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// comparable strips the statistics a failed call may change.
func comparable(s pool.Stats) pool.Stats {
	s.DeviceCalls, s.DeviceCallsByPath = device.Counts{}, pool.PathCounts{}
	s.OutOfMemory, s.Retries = 0, 0
	return s
}

// expect runs call, which must fail with want and change nothing.
func (f *fixture) expect(name string, want error, call func() error) {
	t := f.t
	t.Helper()
	before := f.p.Stats()
	err := call()
	if !errors.Is(err, want) {
		t.Fatalf("%s: got %v, want %v", name, err, want)
	}
	if after := f.p.Stats(); comparable(after) != comparable(before) {
		t.Fatalf("%s failed with %v but changed the statistics:\nbefore %+v\nafter  %+v", name, err, before, after)
	}
	f.check(name)
}

// badCall is one case of the matrix: a call on a fixture and the sentinel
// it must fail with.
type badCall struct {
	name string
	want error
	call func(f *fixture) error
}

func allocCase(size uint64, want error) badCall {
	return badCall{fmt.Sprintf("Alloc(%d)", size), want, func(f *fixture) error {
		_, err := f.p.Alloc(size)
		return err
	}}
}

func allocOnCase(size uint64, want error) badCall {
	return badCall{fmt.Sprintf("AllocOn(%d, a stream)", size), want, func(f *fixture) error {
		_, err := f.p.AllocOn(size, f.stream)
		return err
	}}
}

func pitchCase(w, h uint64, want error) badCall {
	return badCall{fmt.Sprintf("AllocPitch(%d, %d)", w, h), want, func(f *fixture) error {
		_, _, err := f.p.AllocPitch(w, h)
		return err
	}}
}

func freeCase(name string, want error, ptr func(f *fixture) uintptr) badCall {
	return badCall{name, want, func(f *fixture) error { return f.p.Free(ptr(f)) }}
}

// misuseCases: sizes no pool can serve, pitches that are empty or
// overflow, and frees of pointers that are not live allocations' starts.
var misuseCases = []badCall{
	allocCase(0, pool.ErrInvalidSize),
	allocCase(math.MaxUint64, pool.ErrTooLarge),
	allocCase(math.MaxUint64-254, pool.ErrTooLarge), // 2^64−255: rounding up to 256 bytes overflows
	allocCase(1<<63, pool.ErrTooLarge),
	allocCase(tlsf.MaxSize+256, pool.ErrTooLarge), // one granule above the largest block
	allocCase(tlsf.MaxSize+1, pool.ErrTooLarge),
	allocOnCase(0, pool.ErrInvalidSize),
	allocOnCase(math.MaxUint64, pool.ErrTooLarge),
	allocOnCase(tlsf.MaxSize+256, pool.ErrTooLarge),

	pitchCase(0, 16, pool.ErrInvalidSize),
	pitchCase(16, 0, pool.ErrInvalidSize),
	pitchCase(0, 0, pool.ErrInvalidSize),
	pitchCase(1<<32, 1<<32, pool.ErrTooLarge),      // 2^64: overflows
	pitchCase(1<<63, 2, pool.ErrTooLarge),          // overflows
	pitchCase(1, math.MaxUint64, pool.ErrTooLarge), // overflows
	pitchCase(tlsf.MaxSize-1, 2, pool.ErrTooLarge), // above MaxSize, no overflow
	pitchCase(tlsf.MaxSize+1, 1, pool.ErrTooLarge),
	pitchCase(math.MaxUint64, 1, pool.ErrTooLarge),

	freeCase("double free", pool.ErrDoubleFree, func(f *fixture) uintptr { return f.freed }),
	{"double free on another stream", pool.ErrDoubleFree, func(f *fixture) error { return f.p.FreeOn(f.freed, f.stream) }},
	freeCase("interior pointer, one granule in", pool.ErrUnknownPointer, func(f *fixture) uintptr { return f.live[3].ptr + 256 }),
	freeCase("interior pointer, one byte in", pool.ErrUnknownPointer, func(f *fixture) uintptr { return f.live[3].ptr + 1 }),
	freeCase("interior pointer of a pitch allocation", pool.ErrUnknownPointer, func(f *fixture) uintptr { return f.live[len(f.live)-1].ptr + 1024 }),
	freeCase("interior pointer of the smallest block", pool.ErrUnknownPointer, func(f *fixture) uintptr { return f.live[0].ptr + 4 }),
	freeCase("one", pool.ErrUnknownPointer, func(*fixture) uintptr { return 1 }),
	freeCase("the top of the address space", pool.ErrUnknownPointer, func(*fixture) uintptr { return ^uintptr(0) &^ 255 }),
	freeCase("2^64−1", pool.ErrUnknownPointer, func(*fixture) uintptr { return ^uintptr(0) }),
	freeCase("misaligned, next to a live block", pool.ErrUnknownPointer, func(f *fixture) uintptr { return f.live[1].ptr + 3 }),
	freeCase("another pool's pointer on the same device", pool.ErrUnknownPointer, func(f *fixture) uintptr { return f.foreign }),
}

func TestBadInputChangesNothing(t *testing.T) {
	for _, cfg := range configs {
		t.Run(configName(cfg.backend, cfg.cacheOff), func(t *testing.T) {
			f := newFixture(t, cfg.backend, cfg.cacheOff, pool.Options{})
			for _, c := range misuseCases {
				t.Run(c.name, func(t *testing.T) {
					f.t = t
					f.expect(c.name, c.want, func() error { return c.call(f) })
				})
			}
			f.t = t
			f.checkAll("after every case")
		})
	}
}

// A pointer the pool never returned that lies in its free space is
// ErrUnknownPointer. A pooled backend's index cannot tell free space that
// held a block from free space that never did, so there the error matches
// ErrDoubleFree as well.
func TestFreeOfANeverReturnedPointerInFreeSpace(t *testing.T) {
	for _, cfg := range configs {
		t.Run(configName(cfg.backend, cfg.cacheOff), func(t *testing.T) {
			f := newFixture(t, cfg.backend, cfg.cacheOff, pool.Options{})
			last := f.live[len(f.live)-2] // the 3 MiB block
			ptr := last.ptr + uintptr(last.size) + 1<<20
			f.expect("free in free space", pool.ErrUnknownPointer, func() error { return f.p.Free(ptr) })
		})
	}
}

// Every operation after Close fails with ErrClosed and changes nothing;
// Close has returned all memory.
func TestEveryOperationAfterCloseIsErrClosed(t *testing.T) {
	for _, cfg := range configs {
		t.Run(configName(cfg.backend, cfg.cacheOff), func(t *testing.T) {
			f := newFixture(t, cfg.backend, cfg.cacheOff, pool.Options{})
			if err := f.p.Close(); err != nil {
				t.Fatal(err)
			}
			if err := f.other.Close(); err != nil {
				t.Fatal(err)
			}
			live := f.live[1].ptr
			calls := []badCall{
				allocCase(4096, pool.ErrClosed),
				allocCase(2<<20, pool.ErrClosed),
				allocOnCase(4096, pool.ErrClosed),
				pitchCase(100, 10, pool.ErrClosed),
				freeCase("Free of a pointer live at Close", pool.ErrClosed, func(*fixture) uintptr { return live }),
				{"FreeOn of a pointer live at Close", pool.ErrClosed, func(f *fixture) error { return f.p.FreeOn(live, f.stream) }},
				freeCase("Free of a foreign pointer", pool.ErrClosed, func(*fixture) uintptr { return 1 }),
				{"Trim", pool.ErrClosed, func(f *fixture) error { _, err := f.p.Trim(); return err }},
				{"Check", pool.ErrClosed, func(f *fixture) error { return f.p.Check() }},
				{"Close", pool.ErrClosed, func(f *fixture) error { return f.p.Close() }},
			}
			for _, c := range calls {
				before := f.p.Stats()
				if err := c.call(f); !errors.Is(err, c.want) {
					t.Fatalf("%s after Close: got %v, want %v", c.name, err, c.want)
				}
				if after := f.p.Stats(); comparable(after) != comparable(before) {
					t.Fatalf("%s after Close changed the statistics:\nbefore %+v\nafter  %+v", c.name, before, after)
				}
				if m := f.sd.Mapped(); m != 0 {
					t.Fatalf("%s after Close: %d bytes mapped", c.name, m)
				}
			}
			if st := f.sd.Stats(); st.Handles != 0 || st.LinearAllocs != 0 || st.Reservations != 0 {
				t.Fatalf("after Close the device still holds %+v", st)
			}
		})
	}
}

// badOptions are Options that New must refuse with ErrBadOptions.
func badOptions() []struct {
	name string
	opts pool.Options
} {
	type namedOpts = struct {
		name string
		opts pool.Options
	}
	var out []namedOpts
	fractions := []struct {
		name string
		set  func(*pool.Options, float64)
	}{
		{"InitialFraction", func(o *pool.Options, v float64) { o.InitialFraction = v }},
		{"GrowFraction", func(o *pool.Options, v float64) { o.GrowFraction = v }},
		{"MaxFraction", func(o *pool.Options, v float64) { o.MaxFraction = v }},
		{"ReleaseFraction", func(o *pool.Options, v float64) { o.ReleaseFraction = v }},
		{"FreeFloorFraction", func(o *pool.Options, v float64) { o.FreeFloorFraction = v }},
		{"Cache.MaxFraction", func(o *pool.Options, v float64) { o.Cache.MaxFraction = v }},
	}
	for _, fr := range fractions {
		for _, v := range []float64{-0.25, -math.SmallestNonzeroFloat64, math.NaN(), math.Inf(1), math.Inf(-1), 1.5, math.Nextafter(1, 2)} {
			var o pool.Options
			fr.set(&o, v)
			out = append(out, namedOpts{fmt.Sprintf("%s=%v", fr.name, v), o})
		}
	}
	return append(out,
		namedOpts{"InitialFraction above MaxFraction", pool.Options{InitialFraction: 0.6, MaxFraction: 0.5}},
		namedOpts{"SLLog2 one above the maximum", pool.Options{SLLog2: tlsf.MaxSLLog2 + 1}},
		namedOpts{"SLLog2 64", pool.Options{SLLog2: 64}},
		namedOpts{"VirtualSize above MaxSize", pool.Options{VirtualSize: tlsf.MaxSize + 1}},
	)
}

func TestOptionsOutOfRangeAreRefused(t *testing.T) {
	for _, cfg := range configs {
		t.Run(configName(cfg.backend, cfg.cacheOff), func(t *testing.T) {
			for _, c := range badOptions() {
				o := c.opts
				o.Backend, o.Cache.Disable = cfg.backend, cfg.cacheOff
				expectRefused(t, c.name, o, pool.ErrBadOptions)
			}
			expectRefused(t, "Cache.Eager with Cache.Disable", pool.Options{Backend: cfg.backend, Cache: pool.CacheOptions{Eager: true, Disable: true}}, pool.ErrBadOptions)
			for _, be := range []pool.Backend{-1, pool.BackendPassthrough + 1, 100} {
				expectRefused(t, fmt.Sprintf("Backend %d", int(be)), pool.Options{Backend: be, Cache: pool.CacheOptions{Disable: cfg.cacheOff}}, pool.ErrBadOptions)
			}
			if _, err := pool.New(nil, pool.Options{Backend: cfg.backend}); !errors.Is(err, pool.ErrBadOptions) {
				t.Fatalf("New(nil device): %v", err)
			}
			// A nil *sim.Device in the interface: refused, not a panic at
			// its first method call.
			if _, err := pool.New((*sim.Device)(nil), pool.Options{Backend: cfg.backend}); !errors.Is(err, pool.ErrBadOptions) {
				t.Fatalf("New(nil *sim.Device): %v", err)
			}
			// A MaxBytes cap below the initial reserve: 1 MiB against a
			// quarter of 1 GiB. A passthrough pool reserves nothing at New,
			// so for it the cap is merely small.
			o := pool.Options{Backend: cfg.backend, Cache: pool.CacheOptions{Disable: cfg.cacheOff}, InitialFraction: 0.25, MaxBytes: 1 << 20}
			if cfg.backend == pool.BackendPassthrough {
				sd := sim.New(sim.Config{Capacity: 1 << 30})
				p, err := pool.New(sd, o)
				if err != nil {
					t.Fatalf("passthrough with an initial fraction and a small cap: %v", err)
				}
				if st := p.Stats(); st.Reserved != 0 {
					t.Fatalf("passthrough reserved %d at New", st.Reserved)
				}
				if err := p.Close(); err != nil {
					t.Fatal(err)
				}
			} else {
				expectRefused(t, "MaxBytes below the initial reserve", o, pool.ErrBadOptions)
			}
		})
	}
}

// expectRefused checks that New fails with want and leaves nothing on the
// device.
func expectRefused(t *testing.T, name string, o pool.Options, want error) {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: 1 << 30})
	p, err := pool.New(sd, o)
	if !errors.Is(err, want) {
		if p != nil {
			_ = p.Close()
		}
		t.Fatalf("New with %s: got %v, want %v", name, err, want)
	}
	if st := sd.Stats(); st.Used != 0 || st.Reservations != 0 || st.Events != 0 {
		t.Fatalf("New with %s failed but left %+v", name, st)
	}
}

// A device whose memory doubled wraps 2^64 gets the largest default
// address range, tlsf.MaxSize, not one of the wrapped size: here more than
// the simulated process's window holds, so New fails naming it and leaves
// nothing behind.
func TestTheDefaultVirtualRangeOfAHugeDeviceIsAtMostMaxSize(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 1 << 63})
	_, err := pool.New(sd, pool.Options{})
	if !errors.Is(err, device.ErrOutOfMemory) {
		t.Fatalf("New: got %v, want device.ErrOutOfMemory", err)
	}
	if want := fmt.Sprintf("reserving %d bytes of address space", uint64(tlsf.MaxSize)); !bytes.Contains([]byte(err.Error()), []byte(want)) {
		t.Fatalf("New: %v does not say %q", err, want)
	}
	if st := sd.Stats(); st.Used != 0 || st.Reservations != 0 {
		t.Fatalf("New failed but left %+v", st)
	}
}

// Zero selects a knob's default, or turns it off, as Options documents:
// a pool with the zero value of a field behaves exactly as one with the
// documented default spelled out, through the same workload.
func TestZeroOptionsMeanTheDefaults(t *testing.T) {
	const capacity = 1 << 30
	// other, where set, is a value the workload tells apart from the
	// default: proof that the comparison can fail.
	cases := []struct {
		name        string
		dflt, other pool.Options
		calls       bool // device calls may differ (a cap asks cuMemGetInfo)
	}{
		{"GrowFraction 0 is 1/4096", pool.Options{GrowFraction: 1.0 / 4096}, pool.Options{GrowFraction: 1.0 / 64}, false},
		{"MaxFraction 0 is 1 (no cap)", pool.Options{MaxFraction: 1}, pool.Options{}, false},
		{"ReleaseFraction 0 is off", pool.Options{}, pool.Options{ReleaseFraction: 0.03}, false},
		{"Cache.MaxFraction 0 is 1/16", pool.Options{Cache: pool.CacheOptions{MaxFraction: 1.0 / 16}}, pool.Options{}, false},
		{"Cache.MaxSize 0 is 4 KiB", pool.Options{Cache: pool.CacheOptions{MaxSize: 4 << 10}}, pool.Options{Cache: pool.CacheOptions{MaxSize: 1024}}, false},
		{"GoodFit off is best fit", pool.Options{}, pool.Options{GoodFit: true}, false},
		{"SLLog2 0 is 6", pool.Options{SLLog2: 6}, pool.Options{SLLog2: 3}, false},
		{"VirtualSize 0 is twice the device's memory", pool.Options{VirtualSize: 2 * capacity}, pool.Options{}, false},
		{"MaxBytes 0 is no cap", pool.Options{MaxBytes: math.MaxUint64}, pool.Options{}, true},
	}
	zero := pool.Options{}
	for _, cfg := range configs {
		t.Run(configName(cfg.backend, cfg.cacheOff), func(t *testing.T) {
			if cfg.cacheOff {
				// Without caches a workload is deterministic: compare it all.
				for _, c := range cases {
					a := workload(t, cfg.backend, cfg.cacheOff, capacity, zero)
					b := workload(t, cfg.backend, cfg.cacheOff, capacity, c.dflt)
					if c.calls {
						a.DeviceCalls, b.DeviceCalls = device.Counts{}, device.Counts{}
						a.DeviceCallsByPath, b.DeviceCallsByPath = pool.PathCounts{}, pool.PathCounts{}
					}
					if a != b {
						t.Fatalf("%s: zero gives %+v\ndefault gives %+v", c.name, a, b)
					}
					// Without caches, best fit rounds blocks to 256 bytes
					// whatever SLLog2 is, and a passthrough pool counts size
					// classes only with GoodFit.
					sensitive := !reflect.DeepEqual(c.other, pool.Options{}) && !c.other.Cache.Disable && c.other.Cache.MaxSize == 0 &&
						c.other.SLLog2 == 0 && (cfg.backend != pool.BackendPassthrough || c.other.GoodFit)
					if sensitive && workload(t, cfg.backend, cfg.cacheOff, capacity, c.other) == a {
						t.Fatalf("%s: the workload cannot tell %+v from the default", c.name, c.other)
					}
				}
			} else {
				// With caches, which P a goroutine runs on shapes the
				// caches; the first refill does not depend on it: a 4 KiB
				// request brings a batch of 16 blocks (64 KiB) under both.
				for _, c := range cases {
					a := firstRefill(t, cfg.backend, capacity, zero)
					b := firstRefill(t, cfg.backend, capacity, c.dflt)
					if c.calls {
						a.DeviceCalls, b.DeviceCalls = device.Counts{}, device.Counts{}
						a.DeviceCallsByPath, b.DeviceCallsByPath = pool.PathCounts{}, pool.PathCounts{}
					}
					if a != b || a.CachedBlocks != 15 && cfg.backend != pool.BackendPassthrough {
						t.Fatalf("%s: zero gives %+v\ndefault gives %+v", c.name, a, b)
					}
				}
			}
			// InitialFraction 0 reserves nothing at New; FreeFloorFraction 0
			// never releases however low the device runs (IdleRelease, off
			// here, has idle_test.go).
			sd := sim.New(sim.Config{Capacity: capacity})
			p, err := pool.New(sd, pool.Options{Backend: cfg.backend, Cache: pool.CacheOptions{Disable: cfg.cacheOff}, IdleRelease: -1})
			if err != nil {
				t.Fatal(err)
			}
			if st := p.Stats(); st.Reserved != 0 || sd.Mapped() != 0 {
				t.Fatalf("InitialFraction 0 reserved %d bytes", st.Reserved)
			}
			ptr, err := p.Alloc(64 << 20)
			if err != nil {
				t.Fatal(err)
			}
			if err := p.Free(ptr); err != nil {
				t.Fatal(err)
			}
			held := p.Stats().Reserved
			free, _, _ := sd.MemGetInfo()
			if err := sd.Occupy(free - 16<<20); err != nil { // leave a passthrough pool room
				t.Fatal(err)
			}
			for range pool.ReleaseCheckInterval + 1 {
				ptr, err := p.Alloc(256)
				if err != nil {
					t.Fatal(err)
				}
				if err := p.Free(ptr); err != nil {
					t.Fatal(err)
				}
			}
			if st := p.Stats(); st.Reserved != held || st.Releases != 0 {
				t.Fatalf("FreeFloorFraction 0 released memory: reserved %d, was %d; %d releases", st.Reserved, held, st.Releases)
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// firstRefill returns the statistics after one 4 KiB allocation.
func firstRefill(t *testing.T, be pool.Backend, capacity uint64, o pool.Options) pool.Stats {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: capacity, Seed: 1})
	o.Backend = be
	o.Cache.Eager = true // the caches from the first request
	o.IdleRelease = -1   // the statistics change only with the test's own calls
	p, err := pool.New(sd, o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	defer p.Close()
	if _, err := p.Alloc(4096); err != nil {
		t.Fatal(err)
	}
	return p.Stats()
}

// workload runs a fixed sequence of allocations and frees on a new pool
// and returns its final statistics.
func workload(t *testing.T, be pool.Backend, cacheOff bool, capacity uint64, o pool.Options) pool.Stats {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: capacity, Seed: 1})
	o.Backend, o.Cache.Disable = be, cacheOff
	o.IdleRelease = -1 // the statistics change only with the test's own calls
	p, err := pool.New(sd, o)
	if err != nil {
		t.Fatalf("New(%+v): %v", o, err)
	}
	var live []uintptr
	x := uint64(12345)
	for i := range 400 {
		x = x*6364136223846793005 + 1442695040888963407
		if len(live) > 0 && x>>60 < 6 {
			k := int(x>>32) % len(live)
			if err := p.Free(live[k]); err != nil {
				t.Fatal(err)
			}
			live = append(live[:k], live[k+1:]...)
			continue
		}
		size := 1 + (x>>20)%(uint64(1)<<(8+i%17))
		ptr, err := p.Alloc(size)
		if err != nil {
			t.Fatalf("Alloc(%d): %v", size, err)
		}
		live = append(live, ptr)
	}
	// Leave a quarter of the blocks, scattered, and ask for larger ones:
	// the pool must map more while much of what it holds is unused.
	for k := len(live) - 1; k >= 0; k-- {
		if k%4 != 0 {
			if err := p.Free(live[k]); err != nil {
				t.Fatal(err)
			}
		}
	}
	for range 20 {
		if _, err := p.Alloc(3 << 20); err != nil {
			t.Fatalf("Alloc(3 MiB): %v", err)
		}
	}
	st := p.Stats()
	if _, err := p.Trim(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if sd.Mapped() != 0 {
		t.Fatalf("Close left %d bytes mapped", sd.Mapped())
	}
	return st
}

// Requests of exactly a size-class boundary that is also the heap's unit
// (2 MiB: a chunk, a VMM page), one granule either side, and one below
// the minimum block: each is served, counted at its block size (the
// request rounded to 256 bytes; with GoodFit, its class size), backed by
// the least whole units, and returned by Trim.
func TestRequestsAtChunkAndClassBoundaries(t *testing.T) {
	const unit = 2 << 20
	cases := []struct {
		size, class, reserved uint64 // class: with GoodFit; reserved: pooled backends
	}{
		{1, 256, unit},                        // below the minimum block
		{unit - 256, unit, unit},              // rounds up to the boundary
		{unit, unit, unit},                    // exactly a boundary: one unit
		{unit + 256, unit + 32<<10, 2 * unit}, // next class (64 lists: 32 KiB steps), two units
		{2 * unit, 2 * unit, 2 * unit},
		{2*unit + 256, 2*unit + 64<<10, 3 * unit},
	}
	for _, cfg := range configs {
		for _, goodFit := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/goodfit=%v", configName(cfg.backend, cfg.cacheOff), goodFit), func(t *testing.T) {
				for _, c := range cases {
					sd := sim.New(sim.Config{Capacity: 1 << 30, Shadow: true})
					// A growth fraction so small that each growth is the need.
					p, err := pool.New(sd, pool.Options{Backend: cfg.backend, GrowFraction: 1e-12, GoodFit: goodFit,
						Cache: pool.CacheOptions{Disable: cfg.cacheOff, MaxSize: 1}})
					if err != nil {
						t.Fatal(err)
					}
					ptr, err := p.Alloc(c.size)
					if err != nil {
						t.Fatalf("Alloc(%d): %v", c.size, err)
					}
					b := block{ptr: ptr, size: c.size, pat: 0xb0da0000}
					if err := sd.MemsetD32(b.ptr, b.pat, b.size/4); err != nil {
						t.Fatal(err)
					}
					st := p.Stats()
					want := c.reserved
					if cfg.backend == pool.BackendPassthrough {
						want = c.size
					}
					rounded := (c.size + 255) &^ 255
					if goodFit {
						rounded = c.class
					}
					if st.Allocated != rounded || st.Reserved != want {
						t.Fatalf("Alloc(%d): allocated %d, reserved %d; want %d and %d", c.size, st.Allocated, st.Reserved, rounded, want)
					}
					if err := p.Check(); err != nil {
						t.Fatal(err)
					}
					expectPattern(t, sd, "boundary", b)
					if err := p.Free(ptr); err != nil {
						t.Fatal(err)
					}
					if _, err := p.Trim(); err != nil {
						t.Fatal(err)
					}
					if st := p.Stats(); st.Reserved != 0 || sd.Mapped() != 0 {
						t.Fatalf("after freeing %d bytes and Trim: reserved %d, mapped %d", c.size, st.Reserved, sd.Mapped())
					}
					if err := p.Close(); err != nil {
						t.Fatal(err)
					}
				}
			})
		}
	}
}
