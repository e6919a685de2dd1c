package cuda

import (
	"runtime"
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// cuMemsetD8Async fills bytes at any alignment; the store kernel writes
// one byte where it is told. Both read back through cuMemcpyDtoH.
func TestCUDAByteFillAndStoreKernel(t *testing.T) {
	d := openCUDA(t)
	ptr, err := d.MemAlloc(4096)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.MemFree(ptr)) }()
	require.NoError(t, d.MemsetD32(ptr, 0, 1024))
	require.NoError(t, d.MemsetD8Async(ptr+5, 0xA5, 7, 0))
	require.NoError(t, d.StoreByte(ptr+13, 0x42, 0))
	require.NoError(t, d.StoreByte(ptr+4095, 0x43, 0))
	require.NoError(t, d.StreamSynchronize(0))
	got := make([]byte, 16)
	require.NoError(t, d.MemcpyDtoH(got, ptr))
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0, 0x42, 0, 0}, got)
	last := make([]byte, 1)
	require.NoError(t, d.MemcpyDtoH(last, ptr+4095))
	require.Equal(t, byte(0x43), last[0])
	require.NoError(t, d.MemsetD8Async(ptr, 1, 0, 0), "n = 0 makes no call")
}

// InContext runs its function with the device's context current, and
// leaves the thread's context stack as it found it.
func TestCUDAInContext(t *testing.T) {
	d := openCUDA(t)
	get := rawSym(t, d, "cuCtxGetCurrent")
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var before, inside, after uintptr
	require.Zero(t, get.call(uintptr(unsafe.Pointer(&before))))
	require.NoError(t, d.InContext(func() {
		require.Zero(t, get.call(uintptr(unsafe.Pointer(&inside))))
	}))
	require.Zero(t, get.call(uintptr(unsafe.Pointer(&after))))
	require.Equal(t, d.Context(), inside)
	require.Equal(t, before, after)
}
