package pool

// The device suite (suite_test.go) on a real GPU, both pooled backends and
// passthrough. It skips where there is no CUDA driver or GPU; with
// TLSF_REQUIRE_GPU=1 a missing GPU fails it instead. To run it on the GPU
// machine: go test -c -race -o pool.test ./pool, then
// TLSF_REQUIRE_GPU=1 ./pool.test -test.run 'GPU' -test.v.

import (
	"testing"

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
