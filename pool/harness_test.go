package pool

// The harness every test of this package uses: devices to run on (the
// simulated GPU, or a real one in gpu_test.go), pools that close and check
// for leaks when the test ends, the invariant checks run after every step,
// and block contents written and read back through the device.

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/tlsf"
	"github.com/stretchr/testify/require"
)

// Byte sizes, so that table rows read as sizes.
const (
	kiB uint64 = 1 << 10
	miB uint64 = 1 << 20
	giB uint64 = 1 << 30
)

// pooledBackends have an index and a heap; allBackends add passthrough.
var (
	pooledBackends = []Backend{BackendVMM, BackendChunks}
	allBackends    = []Backend{BackendVMM, BackendChunks, BackendPassthrough}
)

// testDevice is what a test body runs on: any device.Device, plus the
// simulated GPU behind it when there is one (nil on a real GPU), for the
// checks only a simulation can make (memory held, violations, holds).
type testDevice struct {
	device.Device
	sd *sim.Device
}

// deviceFactory gives each test a device.
type deviceFactory func(t *testing.T) testDevice

// simDevices makes a fresh simulated GPU per test.
func simDevices(cfg sim.Config) deviceFactory {
	return func(*testing.T) testDevice { return onSim(sim.New(cfg)) }
}

func onSim(sd *sim.Device) testDevice { return testDevice{Device: sd, sd: sd} }

// tester is what the helpers need of a test: *testing.T and *rapid.T
// both have it.
type tester interface {
	require.TestingT
	Helper()
	Cleanup(func())
}

// openPool makes a pool on d and, when the test ends, closes it (unless
// the test did) and checks that it returned every byte to the device and
// that the device saw no misuse. One pool per Sim process: the leak check
// looks at the whole process. IdleRelease left 0 is off here, so that
// a test's own calls make every change it checks, however slowly it
// runs; idle_test.go sets it.
func openPool(t tester, d testDevice, o Options) *Pool {
	t.Helper()
	if o.IdleRelease == 0 {
		o.IdleRelease = -1
	}
	p, err := New(d.Device, o)
	require.NoError(t, err)
	t.Cleanup(func() {
		if err := p.Close(); err != nil && !errors.Is(err, ErrClosed) {
			t.Errorf("Close: %v", err)
		}
		if d.sd != nil {
			if n := d.sd.Mapped(); n != 0 {
				t.Errorf("%d bytes of device memory still held after Close", n)
			}
			if err := d.sd.Check(); err != nil {
				t.Errorf("sim.Check after Close: %v", err)
			}
			if v := d.sd.Violations(); len(v) > 0 {
				t.Errorf("device misuse: %q", v)
			}
		}
	})
	return p
}

// checkStep runs every invariant check that applies: the pool's own, and
// on a simulated GPU the Sim's, no violations, and Stats().Reserved equal
// to what the process holds on the device.
func checkStep(t tester, p *Pool, d testDevice) {
	t.Helper()
	require.NoError(t, p.Check())
	if d.sd == nil {
		return
	}
	require.NoError(t, d.sd.Check())
	require.Empty(t, d.sd.Violations())
	requireReservedIsHeld(t, p, d.sd)
}

// requireReservedIsHeld: Stats().Reserved is exactly the device memory the
// pool's process holds. A passthrough pool's are its requested sizes (the
// Sim charges linear allocations in 512-byte units).
func requireReservedIsHeld(t tester, p *Pool, sd *sim.Device) {
	t.Helper()
	res := p.Stats().Reserved
	if p.Backend() == BackendPassthrough {
		require.Equal(t, sd.Stats().LinearBytes, res, "Reserved vs the driver allocations held")
		return
	}
	require.Equal(t, sd.Mapped(), res, "Reserved vs the device memory held")
}

// refIndex sizes blocks as the pool's index does (256-byte granularity, 64
// second-level lists), independently of any pool.
var refIndex = func() *tlsf.Index {
	x, err := tlsf.New(tlsf.Config{Granularity: 256, SLLog2: 6})
	if err != nil {
		panic(err)
	}
	return x
}()

// sizeClass is the size class of a request of n bytes: the block size
// the caches, good fit (Options.GoodFit) and aligned requests give it.
func sizeClass(n uint64) uint64 {
	r, err := refIndex.RoundUp(n)
	if err != nil {
		panic(err)
	}
	return r
}

// freeAny frees one block of live, a map of live pointers to the bytes
// counted for them, drops it from live and returns its bytes.
func freeAny(t require.TestingT, p *Pool, live map[uintptr]uint64) uint64 {
	for ptr, n := range live {
		require.NoError(t, p.Free(ptr))
		delete(live, ptr)
		return n
	}
	return 0
}

// blockSizeOf is the block size pool p gives an n-byte request on the
// default stream: its size class where the caches serve it (caches on, n
// at most Cache.MaxSize) or with GoodFit, else n rounded up to 256 bytes
// (best fit).
func blockSizeOf(p *Pool, n uint64) uint64 { return blockSizeOn(p, n, 0) }

// blockSizeOn is blockSizeOf for a request on stream s: the caches serve
// the default stream only.
func blockSizeOn(p *Pool, n uint64, s device.Stream) uint64 {
	if p.opts.GoodFit || s == 0 && !p.opts.Cache.Disable && n <= p.opts.Cache.MaxSize {
		return sizeClass(n)
	}
	return roundUp(n, 256)
}

// liveState is what an error must leave as it was, even one that runs the
// out-of-memory path (which may flush caches, reclaim pending frees and
// release unused memory on the way).
func liveState(s Stats) Stats {
	return Stats{
		Backend:   s.Backend,
		Allocated: s.Allocated, AllocatedPeak: s.AllocatedPeak,
		Allocations: s.Allocations, AllocationsPeak: s.AllocationsPeak,
		Allocs: s.Allocs, Frees: s.Frees,
	}
}

// withoutCounters drops what errors.go allows any error to change: the
// counters of device calls, out-of-memory events and retries.
func withoutCounters(s Stats) Stats {
	s.DeviceCalls, s.DeviceCallsByPath = device.Counts{}, PathCounts{}
	s.OutOfMemory, s.Retries = 0, 0
	return s
}

// words is the number of 32-bit words that cover n bytes.
func wordCount(n uint64) uint64 { return (n + 3) / 4 }

// pattern is n bytes of word v repeated, little-endian, as the device
// stores it.
func wordPattern(n uint64, v uint32) []byte {
	b := make([]byte, n)
	if n < 4 {
		var w [4]byte
		binary.LittleEndian.PutUint32(w[:], v)
		copy(b, w[:])
		return b
	}
	binary.LittleEndian.PutUint32(b, v)
	for k := uint64(4); k < n; k *= 2 {
		copy(b[k:], b[:k])
	}
	return b
}

// fill writes word v over the n bytes at ptr (rounded up to whole words).
func fillBlock(t tester, dev device.Device, ptr uintptr, n uint64, v uint32) {
	t.Helper()
	require.NoError(t, dev.MemsetD32(ptr, v, wordCount(n)), "memset %#x +%d", ptr, n)
}

// readBuffers keeps the buffers expectFilled reads into: blocks are read
// back thousands of times, some of them MiBs long.
var readBuffers = sync.Pool{New: func() any { return new([]byte) }}

// expectFilled reads the n bytes at ptr (rounded up to whole words) back
// and requires every word to be v.
func expectFilled(t tester, dev device.Device, ptr uintptr, n uint64, v uint32) {
	t.Helper()
	bp := readBuffers.Get().(*[]byte)
	defer readBuffers.Put(bp)
	m := 4 * wordCount(n)
	if uint64(cap(*bp)) < m {
		*bp = make([]byte, m)
	}
	got := (*bp)[:m]
	require.NoError(t, dev.MemcpyDtoH(got, ptr), "read %#x +%d", ptr, n)
	// Every word is v: the first is, and each equals the one before.
	if binary.LittleEndian.Uint32(got) == v && bytes.Equal(got[4:], got[:m-4]) {
		return
	}
	for i := uint64(0); i < m; i += 4 {
		if w := binary.LittleEndian.Uint32(got[i:]); w != v {
			require.Failf(t, "block contents clobbered", "block %#x +%d: word at offset %d is %#08x, want %#08x", ptr, n, i, w, v)
		}
	}
}

// requireDisjoint requires [ptr, ptr+n) to overlap no live block.
func requireDisjoint(t tester, live map[uintptr]uint64, ptr uintptr, n uint64) {
	t.Helper()
	for q, m := range live {
		if ptr < q+uintptr(m) && q < ptr+uintptr(n) {
			require.Failf(t, "overlapping blocks", "new block [%#x, +%d) overlaps live block [%#x, +%d)", ptr, n, q, m)
		}
	}
}

// newStreams creates n streams on dev and destroys them when the test ends.
func newStreams(t tester, dev device.Device, n int) []device.Stream {
	t.Helper()
	out := make([]device.Stream, n)
	for i := range out {
		s, err := dev.StreamCreate()
		require.NoError(t, err)
		out[i] = s
		t.Cleanup(func() {
			if err := dev.StreamDestroy(s); err != nil {
				t.Errorf("destroying stream %d: %v", i, err)
			}
		})
	}
	return out
}

func configName(be Backend, cacheOff bool) string {
	return fmt.Sprintf("%v/caches=%v", be, map[bool]string{false: "on", true: "off"}[cacheOff])
}
