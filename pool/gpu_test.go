package pool

// The device suite (suite_test.go) on a real GPU, both pooled backends and
// passthrough. It skips where there is no CUDA driver or GPU; with
// TLSF_REQUIRE_GPU=1 a missing GPU fails it instead. To run it on the GPU
// machine: go test -c -race -o pool.test ./pool, then
// TLSF_REQUIRE_GPU=1 ./pool.test -test.run 'GPU' -test.v.

import (
	"testing"
	"time"

	"github.com/gpumem/tlsf/device/cuda"
	"github.com/gpumem/tlsf/device/devicetest"
	"github.com/stretchr/testify/require"
)

func TestGPU(t *testing.T) {
	dev := openGPU(t)
	backends := []Backend{BackendChunks, BackendPassthrough}
	if dev.VMMSupported() {
		backends = append([]Backend{BackendVMM}, backends...)
	}
	t.Logf("%s (ordinal %d): backends %v", dev.Name(), dev.Ordinal(), backends)
	runDeviceSuite(t, func(*testing.T) testDevice { return testDevice{Device: dev} }, backends)
}

func TestGPUNewCUDAOwnsItsDevice(t *testing.T) {
	openGPU(t) // skips without a GPU
	p, err := NewCUDA(0, Options{})
	require.NoError(t, err)
	ptr, err := p.Alloc(3 * miB)
	require.NoError(t, err)
	fillBlock(t, p.Device(), ptr, 3*miB, 0x600d)
	expectFilled(t, p.Device(), ptr, 3*miB, 0x600d)
	require.NoError(t, p.Free(ptr))
	require.NoError(t, p.Check())
	require.NoError(t, p.Close(), "Close also releases the device")
	require.ErrorIs(t, p.Close(), ErrClosed)
}

// openGPU opens device 0 for t, or skips t where there is none (fails it
// with TLSF_REQUIRE_GPU=1).
func openGPU(t *testing.T) *cuda.Device {
	return devicetest.OpenGPU(t, func() (*cuda.Device, error) { return cuda.Open(0) })
}

// Guard mode on the GPU: a kernel's store one byte past the end of a
// block is caught by the free and by Check, on both pooled backends.
func TestGPUGuardCatchesOverrun(t *testing.T) {
	dev := openGPU(t)
	backends := []Backend{BackendChunks, BackendPassthrough}
	if dev.VMMSupported() {
		backends = append(backends, BackendVMM)
	}
	for _, be := range backends {
		t.Run(be.String(), func(t *testing.T) {
			p, err := New(dev, Options{Backend: be, Guard: 64})
			require.NoError(t, err)
			defer func() { require.NoError(t, p.Close()) }()
			ptr, err := p.Alloc(1000)
			require.NoError(t, err)
			require.NoError(t, p.Check())
			require.NoError(t, dev.StoreByte(ptr+999, 1, 0)) // inside
			require.NoError(t, p.Check())
			require.NoError(t, dev.StoreByte(ptr+1000, 1, 0)) // one past the end
			require.ErrorIs(t, p.Check(), ErrCorrupted)
			err = p.Free(ptr)
			require.ErrorIs(t, err, ErrCorrupted)
			t.Log(err)
			require.NoError(t, p.Free(ptr))
			require.NoError(t, p.Check())
		})
	}
}

// An idle pool with FreeFloorFraction returns its unused memory to another
// pool on the same GPU through its background scavenger, without being
// called: the neighbour's large request, failing at first, succeeds once
// the scavenger has brought the device's free memory back to the floor.
// The time it took is logged (the closing figure), not asserted.
func TestGPUAnIdlePoolsMemoryReachesItsNeighbour(t *testing.T) {
	dev := openGPU(t)
	if !dev.VMMSupported() {
		t.Skip("no VMM")
	}
	_, total, err := dev.MemGetInfo()
	require.NoError(t, err)
	idle, err := New(dev, Options{Backend: BackendVMM, FreeFloorFraction: 0.5})
	require.NoError(t, err)
	defer func() { require.NoError(t, idle.Close()) }()
	held := fillAndFree(t, dev, idle, total*3/10+giB)
	start := time.Now()
	busy, err := New(dev, Options{Backend: BackendVMM})
	require.NoError(t, err)
	defer func() { require.NoError(t, busy.Close()) }()
	want := total * 4 / 10
	ptr, tries := allocRetrying(t, busy, want, 1000)
	t.Logf("idle pool held %.1f GiB unused; a %.1f GiB request on its neighbour succeeded after %v (%d failed tries); the scavenger returned %.1f GiB",
		float64(held)/float64(giB), float64(want)/float64(giB), time.Since(start), tries, float64(idle.Stats().ScavengedBytes)/float64(giB))
	require.NoError(t, busy.Free(ptr))
}

// The same with default options in both pools: IdleRelease, no floor. The
// idle pool gives back everything unused once idle for 500 ms and another
// process (here, the newcomer's first block) has grown.
func TestGPUAnIdlePoolGivesItsMemoryToANewcomerByDefault(t *testing.T) {
	dev := openGPU(t)
	if !dev.VMMSupported() {
		t.Skip("no VMM")
	}
	_, total, err := dev.MemGetInfo()
	require.NoError(t, err)
	idle, err := New(dev, Options{Backend: BackendVMM})
	require.NoError(t, err)
	defer func() { require.NoError(t, idle.Close()) }()
	held := fillAndFree(t, dev, idle, total/10+giB)
	start := time.Now()
	late, err := New(dev, Options{Backend: BackendVMM})
	require.NoError(t, err)
	defer func() { require.NoError(t, late.Close()) }()
	// In one process the newcomer has no context of its own to show: its
	// first block, from what the device has free, is the sign instead.
	first, err := late.Alloc(512 << 20)
	require.NoError(t, err)
	defer func() { require.NoError(t, late.Free(first)) }()
	want := total / 2
	ptr, tries := allocRetrying(t, late, want, 5000)
	t.Logf("idle pool held %.1f GiB unused; a %.1f GiB request of a newcomer succeeded after %v (%d failed tries); the scavenger returned %.1f GiB",
		float64(held)/float64(giB), float64(want)/float64(giB), time.Since(start), tries, float64(idle.Stats().ScavengedBytes)/float64(giB))
	require.NoError(t, late.Free(ptr))
}

// fillAndFree allocates 1 GiB blocks from p until the device has at most
// leave bytes free, frees them, and returns the memory p then holds.
func fillAndFree(t *testing.T, dev *cuda.Device, p *Pool, leave uint64) uint64 {
	t.Helper()
	var ptrs []uintptr
	for {
		free, _, err := dev.MemGetInfo()
		require.NoError(t, err)
		if free <= leave {
			break
		}
		ptr, err := p.Alloc(giB)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
	}
	return p.Stats().Reserved
}

// allocRetrying asks p for want bytes every millisecond, up to tries
// times, each failure out of memory, until one succeeds; it returns the
// block and the failures.
func allocRetrying(t *testing.T, p *Pool, want uint64, tries int) (uintptr, int) {
	t.Helper()
	for failed := 0; failed < tries; failed++ {
		ptr, err := p.Alloc(want)
		if err == nil {
			return ptr, failed
		}
		require.ErrorIs(t, err, ErrOutOfMemory)
		time.Sleep(time.Millisecond)
	}
	t.Fatalf("no %d bytes after %d tries: the idle pool's memory did not come back", want, tries)
	return 0, tries
}
