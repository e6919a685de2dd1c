//go:build cgo

package main

// Tests of the C ABI on simulated GPUs (TestMain configures device:sim).
// Every call goes through tlsf.c, as from a C program (calls.go), on an
// OS thread locked for the test, so the thread-local messages are the
// ones a C caller would see.

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"unicode/utf8"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/pool"
	"github.com/stretchr/testify/require"
)

const simCapacity = 4 << 30

func TestMain(m *testing.M) {
	runtime.LockOSThread()
	// idle_release:off: the pools live through every test, and the
	// statistics they compare change only with the tests' own calls.
	if rc := callConfigure(fmt.Sprintf("device:sim,sim_capacity:%d,idle_release:off", simCapacity), false); rc != 0 {
		fmt.Fprintln(os.Stderr, "tlsf_configure:", lastError())
		os.Exit(2)
	}
	os.Exit(m.Run())
}

// checkPools runs every pool's invariant check.
func checkPools(t *testing.T) {
	t.Helper()
	reg.each(func(dev int, p *pool.Pool) {
		require.NoError(t, p.Check(), "device %d", dev)
	})
}

// Many OS threads at once on two devices, each checking that its messages
// are its own and that a successful call clears them.
func TestManyThreads(t *testing.T) {
	const threads, rounds = 16, 300
	var wg sync.WaitGroup
	errs := make(chan error, threads)
	for id := range threads {
		wg.Add(1)
		go func() {
			defer wg.Done()
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			r := rand.New(rand.NewPCG(uint64(id), 1))
			dev := id % 2
			var live []uintptr
			var sizes []uint64
			for round := range rounds {
				if len(live) < 32 && r.IntN(3) > 0 {
					size := uint64(1 + r.IntN(4<<20))
					ptr := callMalloc(size, dev, 0)
					if ptr == 0 || lastError() != "" {
						errs <- fmt.Errorf("thread %d: tlsf_malloc(%d): %q", id, size, lastError())
						return
					}
					live = append(live, ptr)
					sizes = append(sizes, size)
				} else if len(live) > 0 {
					i := r.IntN(len(live))
					// The size is a hint: the request's, unknown, or wrong.
					hint := [3]uint64{sizes[i], 0, uint64(r.IntN(8 << 20))}[r.IntN(3)]
					callFree(live[i], hint, dev, 0)
					if msg := lastError(); msg != "" {
						errs <- fmt.Errorf("thread %d: tlsf_free: %q", id, msg)
						return
					}
					live = append(live[:i], live[i+1:]...)
					sizes = append(sizes[:i], sizes[i+1:]...)
				}
				if round%37 == 0 {
					bad := uintptr(0x11 + id)                     // unaligned: never a block, never another thread's
					callFree(bad, uint64(r.IntN(2))*4096, dev, 0) // with or without a size
					want := fmt.Sprintf("%#x", bad)
					runtime.Gosched() // let other threads fail and succeed meanwhile
					if msg := lastError(); !contains(msg, want) || !contains(msg, "unknown pointer") {
						errs <- fmt.Errorf("thread %d: bad free left %q, want %s", id, msg, want)
						return
					}
				}
			}
			for _, ptr := range live {
				callFree(ptr, 0, dev, 0)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	for dev := range 2 {
		s, _, rc := callGetStats(dev, statsSize, false)
		require.Zero(t, rc, lastError())
		require.Zero(t, s.Allocated, "device %d", dev)
		require.NotZero(t, s.NumAllocs)
		require.Equal(t, s.NumAllocs, s.NumFrees)
		// caches_on is the pool's Stats.CachesOn: whether these threads
		// contended for the lock enough to engage the caches (caches:auto)
		// depends on their interleaving.
		p, err := reg.lookup(dev)
		require.NoError(t, err)
		want := uint64(0)
		if p.Stats().CachesOn {
			want = 1
		}
		require.Equal(t, want, s.CachesOn, "device %d", dev)
	}
	checkPools(t)
}

func contains(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

// A message belongs to the thread that made it.
func TestMessagesArePerThread(t *testing.T) {
	aFailed, bChecked := make(chan struct{}), make(chan string)
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		callFree(0x21, 0, 0, 0)
		close(aFailed)
		<-bChecked
		bChecked <- lastError()
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	<-aFailed
	require.Empty(t, lastError(), "thread A's message seen on this thread")
	callFree(0x31, 0, 0, 0)
	bChecked <- ""
	require.Contains(t, <-bChecked, "0x21")
	require.Contains(t, lastError(), "0x31")
}

func TestBadInput(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	ok := callMalloc(1<<20, 0, 0)
	require.NotZero(t, ok, lastError())
	before, _, _ := callGetStats(0, statsSize, false)

	for _, tc := range []struct {
		name string
		call func() bool // true when the call reported failure
		want string      // in the message; "" for no message
	}{
		{"malloc of 0 bytes is NULL, no error", func() bool { return callMalloc(0, 0, 0) == 0 }, ""},
		{"malloc too large", func() bool { return callMalloc(1<<62, 0, 0) == 0 }, "too large"},
		{"malloc out of memory", func() bool { return callMalloc(simCapacity+(1<<30), 0, 0) == 0 }, "out of memory"},
		{"malloc on device -1", func() bool { return callMalloc(4096, -1, 0) == 0 }, "device ordinal -1"},
		{"malloc on device 64", func() bool { return callMalloc(4096, 64, 0) == 0 }, "device ordinal 64"},
		{"malloc on a sim device beyond the 4", func() bool { return callMalloc(4096, simDevices, 0) == 0 }, "device:sim has ordinals"},
		{"free of NULL does nothing", func() bool { callFree(0, 0, 0, 0); return true }, ""},
		{"free of an unknown pointer", func() bool { callFree(0x1000, 0, 0, 0); return true }, "unknown pointer"},
		{"free of an interior pointer", func() bool { callFree(ok+256, 0, 0, 0); return true }, "unknown pointer"},
		{"free on a bad device", func() bool { callFree(ok, 0, -5, 0); return true }, "device ordinal -5"},
		{"free on a device with no pool", func() bool { callFree(ok, 0, 3, 0); return true }, "device 3 has no pool"},
		{"configure with NULL", func() bool { return callConfigure("", true) == -1 }, "NULL"},
		{"configure after first use", func() bool { return callConfigure("backend:vmm", false) == -1 }, "exists already"},
		{"configure malformed", func() bool { return callConfigure("backend:vmm,colour:blue", false) == -1 }, `"colour"`},
		{"configure bad value", func() bool { return callConfigure("max_fraction:2", false) == -1 }, `"max_fraction"`},
		{"stats into NULL", func() bool { _, _, rc := callGetStats(0, statsSize, true); return rc == -1 }, "NULL"},
		{"stats with size below a size_t", func() bool { _, _, rc := callGetStats(0, 4, false); return rc == -1 }, "size"},
		{"stats on a bad device", func() bool { _, _, rc := callGetStats(-1, statsSize, false); return rc == -1 }, "device ordinal -1"},
		{"memory fraction NaN", func() bool { callSetMemoryFraction(math.NaN(), 0); return true }, "fraction"},
		{"memory fraction above 1", func() bool { callSetMemoryFraction(1.5, 0); return true }, "fraction"},
		{"memory fraction on a bad device", func() bool { callSetMemoryFraction(0.5, 99); return true }, "device ordinal 99"},
		{"record stream of a foreign pointer", func() bool { callRecordStream(0x1000, 0); return true }, "unknown pointer"},
		{"trim on a bad device", func() bool { return callTrim(-1) == 0 }, "device ordinal -1"},
		{"trim of a device with no pool", func() bool { return callTrim(3) == 0 }, ""},
	} {
		failed := tc.call()
		require.True(t, failed, tc.name)
		if tc.want == "" {
			require.Empty(t, lastError(), tc.name)
		} else {
			require.Contains(t, lastError(), tc.want, tc.name)
		}
		after, _, rc := callGetStats(0, statsSize, false)
		require.Zero(t, rc, tc.name)
		// Only the counters of failures and driver calls may move, and
		// what the out-of-memory path releases: caches and unused memory.
		require.Equal(t, withoutReleasable(before), withoutReleasable(after), tc.name)
		checkPools(t)
	}

	callFree(ok, 0, 0, 0)
	require.Empty(t, lastError())
	callFree(ok, 0, 0, 0)
	require.Contains(t, lastError(), "double free")
	checkPools(t)
}

// withoutReleasable clears the counters a failed call may move.
func withoutReleasable(s stats) stats {
	s.Active -= s.Cached
	s.Cached, s.Reserved, s.NumOOMs, s.DevCall = 0, 0, 0, 0
	s.Released, s.ByPath = 0, [numPaths]uint64{}
	return s
}

// tlsf_get_stats fills at most out->size bytes and says how many.
// A message longer than the thread's buffer is cut at the start of a
// UTF-8 character, so that C callers (and Python's decoding) get valid
// UTF-8.
func TestMessagesAreCutAtACharacter(t *testing.T) {
	for _, tc := range []struct {
		msg  string
		n    int
		want string
	}{
		{"abc", 5, "abc"},
		{"abc", 3, "abc"},
		{"abcd", 3, "abc"},
		{"ab×", 3, "ab"}, // × is two bytes
		{"ab×", 4, "ab×"},
		{"×", 1, ""},
	} {
		got := clip(tc.msg, tc.n)
		require.Equal(t, tc.want, got, "clip(%q, %d)", tc.msg, tc.n)
		require.True(t, utf8.ValidString(got))
	}
}

func TestStatsSize(t *testing.T) {
	s, buf, rc := callGetStats(0, 16, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, uint64(16), s.Size)
	require.Equal(t, uint64(0xdeadbeef), buf[2], "a byte written past size")
	s, buf, rc = callGetStats(0, 1<<20, false) // a newer caller's larger struct
	require.Zero(t, rc, lastError())
	require.Equal(t, uint64(statsSize), s.Size)
	require.Equal(t, uint64(0xdeadbeef), buf[statsSize/8])
	s, _, rc = callGetStats(noPoolDevice, statsSize, false) // no pool: zeros
	require.Zero(t, rc, lastError())
	require.Equal(t, stats{Size: statsSize}, s)
	// A caller built against the tlsf.h before released and
	// device_calls_by_path gets the fields it knows, and nothing past them.
	ptr := callMalloc(1<<20, 0, 0) // a pool with driver calls
	require.NotZero(t, ptr, lastError())
	defer callFree(ptr, 0, 0, 0)
	s, buf, rc = callGetStats(0, statsSizeBefore, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, statsSizeBefore, s.Size)
	require.NotZero(t, s.DevCall)
	require.Equal(t, uint64(0xdeadbeef), buf[statsSizeBefore/8], "released written for an older caller")
	// A size inside a field is rounded down to the fields wholly inside it.
	s, buf, rc = callGetStats(0, statsSizeBefore+4, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, statsSizeBefore, s.Size)
	require.Equal(t, uint64(0xdeadbeef), buf[statsSizeBefore/8], "half of released written")
	// A caller built against the tlsf.h before caches_on gets every field
	// up to device_calls_by_path, and caches_on left alone.
	s, buf, rc = callGetStats(0, statsSizeBeforeCachesOn, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, statsSizeBeforeCachesOn, s.Size)
	require.Equal(t, uint64(statsSize)-8, statsSizeBeforeCachesOn, "caches_on is the last field")
	require.NotZero(t, s.ByPath[pathAlloc]+s.ByPath[pathSetup])
	require.Equal(t, uint64(0xdeadbeef), buf[statsSizeBeforeCachesOn/8], "caches_on written for an older caller")
}

// noPoolDevice is the simulated device no test makes a pool on.
const noPoolDevice = 3

// device_calls_by_path splits device_calls by path, and
// tlsf_get_device_calls reads any path and entry point.
func TestDeviceCallsByPath(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	n, rc := callGetDeviceCalls(noPoolDevice, pathAll, "", true, false)
	require.Zero(t, rc, lastError())
	require.Zero(t, n, "a device with no pool")
	const dev = 2 // the pool may exist already (another test, -count)
	ptr := callMalloc(simCapacity/2, dev, 0)
	require.NotZero(t, ptr, lastError())
	require.Zero(t, callMalloc(simCapacity*3/4, dev, 0), "a request the device has no room for")
	require.Contains(t, lastError(), "out of memory")
	callFree(ptr, 0, dev, 0)
	require.Empty(t, lastError())
	require.NotZero(t, callTrim(dev), lastError())

	s, _, rc := callGetStats(dev, statsSize, false)
	require.Zero(t, rc, lastError())
	p, err := reg.lookup(dev)
	require.NoError(t, err)
	ps := p.Stats()
	require.Equal(t, ps.ReleasedBytes, s.Released)
	var sum uint64
	for path, c := range s.ByPath {
		require.Equal(t, ps.DeviceCallsByPath[path].Total(), c, "path %d", path)
		sum += c
		got, rc := callGetDeviceCalls(dev, path, "", true, false)
		require.Zero(t, rc, lastError())
		require.Equal(t, c, got, "path %d", path)
	}
	require.Equal(t, s.DevCall, sum)
	require.NotZero(t, s.ByPath[pathSetup], "New reserves the address range")
	require.NotZero(t, s.ByPath[pathAlloc], "the growth")
	require.NotZero(t, s.ByPath[pathOutOfMemory], "the failed request's retry")
	all, rc := callGetDeviceCalls(dev, pathAll, "", true, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, s.DevCall, all)
	// One entry point: on each path as the pool counts it, and on all
	// paths their sum.
	var mapsSum uint64
	for path := range numPaths {
		maps, rc := callGetDeviceCalls(dev, path, "cuMemMap", false, false)
		require.Zero(t, rc, lastError())
		require.Equal(t, ps.DeviceCallsByPath[path][device.CallMemMap], maps, "path %d", path)
		mapsSum += maps
	}
	require.NotZero(t, mapsSum)
	allMaps, rc := callGetDeviceCalls(dev, pathAll, "cuMemMap", false, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, mapsSum, allMaps)
	// A versioned symbol, as the driver exports it, names its entry point.
	infos, rc := callGetDeviceCalls(dev, pathAll, "cuMemGetInfo", false, false)
	require.Zero(t, rc, lastError())
	infosV2, rc := callGetDeviceCalls(dev, pathAll, "cuMemGetInfo_v2", false, false)
	require.Zero(t, rc, lastError())
	require.Equal(t, infos, infosV2)
	allocs, rc := callGetDeviceCalls(dev, pathAll, "cuMemAlloc", false, false) // a VMM pool makes none
	require.Zero(t, rc, lastError())
	require.Zero(t, allocs)

	for _, tc := range []struct {
		name              string
		dev, path         int
		call              string
		nullCall, nullOut bool
		want              string
	}{
		{"out NULL", dev, pathAll, "", true, true, "NULL"},
		{"path below TLSF_PATH_ALL", dev, -2, "", true, false, "path -2"},
		{"path TLSF_NUM_PATHS", dev, numPaths, "", true, false, "path 6"},
		{"an unknown entry point", dev, pathAll, "cuMemAllocManaged", false, false, `"cuMemAllocManaged"`},
		{"an empty entry point name", dev, pathAll, "", false, false, `""`},
		{"a version suffix alone", dev, pathAll, "cuMemMap_v", false, false, `"cuMemMap_v"`},
		{"a version of no entry point", dev, pathAll, "cuMemAllocManaged_v2", false, false, `"cuMemAllocManaged_v2"`},
		{"another case", dev, pathAll, "cumemmap", false, false, `"cumemmap"`},
		{"a bad device", -1, pathAll, "", true, false, "device ordinal -1"},
		{"a bad path on a device with no pool", noPoolDevice, 99, "", true, false, "path 99"},
		{"an entry point called but not counted", dev, pathAll, "cuMemGetAllocationGranularity", false, false, `"cuMemGetAllocationGranularity"`},
		{"a versioned entry point called but not counted", dev, pathAll, "cuCtxPushCurrent_v2", false, false, `"cuCtxPushCurrent_v2"`},
	} {
		n, rc := callGetDeviceCalls(tc.dev, tc.path, tc.call, tc.nullCall, tc.nullOut)
		require.Equal(t, -1, rc, tc.name)
		require.Contains(t, lastError(), tc.want, tc.name)
		require.Equal(t, uint64(sentinel), n, "%s: out changed", tc.name)
	}
	after, _, _ := callGetStats(dev, statsSize, false)
	require.Equal(t, s, after, "a failed call moved the statistics")
	checkPools(t)
}

// tlsf.h lists the names tlsf_get_device_calls accepts: exactly the
// counted kinds of driver call, device.Call's. Each is accepted, with or
// without any _vN suffix, whether or not the pool ever calls it.
func TestDeviceCallNamesAreTheHeadersList(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	h, err := os.ReadFile("tlsf.h")
	require.NoError(t, err)
	text := string(h)
	const from, to = "case mattering:\n", " * optionally followed by a version suffix"
	i, j := strings.Index(text, from), strings.Index(text, to)
	require.True(t, i >= 0 && j > i, "tlsf_get_device_calls's list of names not found in tlsf.h")
	var listed []string
	for _, line := range strings.Split(text[i+len(from):j], "\n") {
		listed = append(listed, strings.Fields(strings.TrimPrefix(line, " *"))...)
	}
	var kinds []string
	for k := range device.NumCalls {
		kinds = append(kinds, k.String())
	}
	require.Equal(t, kinds, listed, "tlsf.h's list of counted driver calls differs from device.Call's")
	const dev = 2
	for _, name := range kinds {
		for _, suffix := range []string{"", "_v2", "_v10"} {
			_, rc := callGetDeviceCalls(dev, pathAll, name+suffix, false, false)
			require.Zero(t, rc, "%s%s: %s", name, suffix, lastError())
		}
	}
	n, rc := callGetDeviceCalls(dev, pathAll, "cuMemAllocAsync", false, false)
	require.Zero(t, rc, lastError())
	require.Zero(t, n, "a pool never calls the stream-ordered allocator")
}

// The memory-fraction hook caps reserved memory at fraction × total, and
// the reset hook trims.
func TestMemoryFractionAndReset(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const dev = 1
	callTrim(dev) // the cap applies to growth: start from nothing reserved
	require.Empty(t, lastError())
	callSetMemoryFraction(1.0/1024, dev) // 4 MiB of the 4 GiB
	require.Empty(t, lastError())
	s, _, _ := callGetStats(dev, statsSize, false)
	require.Equal(t, uint64(simCapacity/1024), s.Cap)
	require.Zero(t, callMalloc(8<<20, dev, 0))
	require.Contains(t, lastError(), "out of memory")
	s2, _, _ := callGetStats(dev, statsSize, false)
	require.Equal(t, s.NumOOMs+1, s2.NumOOMs)

	callSetMemoryFraction(1, dev)
	require.Empty(t, lastError())
	ptr := callMalloc(8<<20, dev, 0)
	require.NotZero(t, ptr, lastError())
	callFree(ptr, 8<<20, dev, 0)
	s, _, _ = callGetStats(dev, statsSize, false)
	require.NotZero(t, s.Reserved)
	callReset()
	require.Empty(t, lastError())
	s, _, _ = callGetStats(dev, statsSize, false)
	require.Zero(t, s.Reserved)
	checkPools(t)
}

func TestInitAndRecordStream(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	callInit(8) // PyTorch passes the device count
	require.Empty(t, lastError())
	ptr := callMalloc(1<<20, 0, 0)
	require.NotZero(t, ptr, lastError())
	callRecordStream(ptr, 0) // the legacy default stream: the one it is freed on
	require.Empty(t, lastError())
	callFree(ptr, 1<<20, 0, 0)
	require.Empty(t, lastError())
	callRecordStream(ptr, 0)
	require.Contains(t, lastError(), "unknown pointer")
	checkPools(t)
}

// Streams the caller creates and destroys, as a framework does: allocate
// and free on them, record one on another's block, destroy them without
// telling the pool; the pool keeps serving, trimming and checking.
func TestDestroyedStreamsThroughTheABI(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const dev = 2
	first := callMalloc(4096, dev, 0) // makes the pool, unless a test did
	require.NotZero(t, first, lastError())
	p, err := reg.lookup(dev)
	require.NoError(t, err)
	d := p.Device()
	for round := range 8 {
		a, err := d.StreamCreate()
		require.NoError(t, err)
		b, err := d.StreamCreate()
		require.NoError(t, err)
		x := callMalloc(3<<20, dev, uintptr(a))
		require.NotZero(t, x, "round %d: %s", round, lastError())
		y := callMalloc(3<<20, dev, uintptr(b))
		require.NotZero(t, y, "round %d: %s", round, lastError())
		callRecordStream(x, uintptr(b))
		require.Empty(t, lastError())
		callFree(x, 3<<20, dev, uintptr(a))
		require.Empty(t, lastError())
		callFree(y, 3<<20, dev, uintptr(b))
		require.Empty(t, lastError())
		require.NoError(t, d.StreamDestroy(a))
		require.NoError(t, d.StreamDestroy(b))
		callTrim(dev)
		require.Empty(t, lastError(), "round %d", round)
		require.NoError(t, p.Check())
	}
	callFree(first, 4096, dev, 0)
	require.Empty(t, lastError())
	s, _, _ := callGetStats(dev, statsSize, false)
	require.Zero(t, s.Allocated)
	// Active is what the caches hold and, with them off (one thread never
	// contends for the pool's lock), the last block, freed on the default
	// stream of a pool that has used others: it waits for its event.
	require.LessOrEqual(t, s.Active, s.Cached+4096)
	callTrim(dev)
	require.Empty(t, lastError())
	s, _, _ = callGetStats(dev, statsSize, false)
	require.Zero(t, s.Active, "nothing awaits a stream after a trim")
}

// BenchmarkMallocFree is a tlsf_malloc + tlsf_free pair of 4 KiB from one
// OS thread through tlsf.c, called from Go: it pays a Go-to-C call on top
// of what a C caller pays (capi/example measures that).
func BenchmarkMallocFree(b *testing.B) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	for b.Loop() {
		callFree(callMalloc(4096, 0, 0), 4096, 0, 0)
	}
}

// A block freed as another device's names the device whose pool has it
// (it was "double free (or unknown pointer)"), and stays live there.
func TestFreeOnTheWrongDeviceNamesTheOwner(t *testing.T) {
	p := callMalloc(4096, 0, 0)
	require.NotZero(t, p, lastError())
	q := callMalloc(4096, 1, 0) // device 1 has a pool
	require.NotEqual(t, p, q, "unified virtual addressing")
	require.NotZero(t, q, lastError())
	for _, dev := range []int{1, noPoolDevice} {
		callFree(p, 4096, dev, 0)
		require.Contains(t, lastError(), "on device "+strconv.Itoa(dev)+": pool: ")
		require.Contains(t, lastError(), "; it is a live allocation of device 0's pool")
	}
	callFree(p, 4096, 0, 0)
	require.Empty(t, lastError())
	callFree(q, 4096, 1, 0)
	require.Empty(t, lastError())
	checkPools(t)
}

// TestPassthroughEnvUnknownValue: a TLSF_PASSTHROUGH value that is
// neither on nor off fails the first use of a device (NULL, the message
// naming it) and makes no pool. (Device 3, which TestBadInput needs
// without a pool: this test leaves it so.)
func TestPassthroughEnvUnknownValue(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	const dev = 3
	t.Setenv(pool.PassthroughEnv, "enabled")
	require.Zero(t, callMalloc(4096, dev, 0))
	require.Contains(t, lastError(), pool.PassthroughEnv+`="enabled"`)
	p, err := reg.lookup(dev)
	require.NoError(t, err)
	require.Nil(t, p, "no pool made")
	require.Zero(t, callTrim(dev))
	require.Empty(t, lastError(), "a device with no pool trims nothing")
	checkPools(t)
}

// tlsf_version names the module and the ABI version, which agrees with
// tlsf.h's, returns the same string at every call and clears the
// caller's message.
func TestVersion(t *testing.T) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	require.Equal(t, abiVersion, headerABIVersion, "capi's abiVersion differs from tlsf.h's TLSF_ABI_VERSION")
	_, _, rc := callGetStats(0, statsSize, true) // out NULL: fails, leaving a message
	require.Equal(t, -1, rc)
	require.NotEmpty(t, lastError())
	s, abi, p := callVersion(false)
	require.Empty(t, lastError(), "tlsf_version leaves the caller's message")
	require.Equal(t, abiVersion, abi)
	f := strings.Fields(s)
	require.GreaterOrEqual(t, len(f), 4, s)
	require.Equal(t, modulePath, f[0], s)
	require.Equal(t, "abi="+strconv.Itoa(abiVersion), f[2], s)
	require.True(t, strings.HasPrefix(f[len(f)-1], "go=go"), s)
	require.Equal(t, s, versionString())
	s2, abi2, p2 := callVersion(true)
	require.Equal(t, s, s2)
	require.Equal(t, p, p2, "tlsf_version's string is kept, not made again")
	require.Equal(t, -1, abi2, "abi_version NULL is not written")
}
