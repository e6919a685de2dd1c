package sim

import (
	"encoding/binary"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func simHostFixture(t *testing.T) (*Host, *Device, *Device) {
	t.Helper()
	h := NewHost(2, Config{Capacity: 16 * simMiB, Granularity: 64 << 10, Shadow: true})
	return h, h.Device(0), h.Device(1)
}

func simWord(t *testing.T, d *Device, ptr uintptr) uint32 {
	t.Helper()
	var b [4]byte
	require.NoError(t, d.MemcpyDtoH(b[:], ptr))
	return binary.LittleEndian.Uint32(b[:])
}

func TestSimHostGPUsAreSeparate(t *testing.T) {
	h, d0, d1 := simHostFixture(t)
	assert.Equal(t, 2, h.Len())
	assert.Equal(t, 0, d0.Ordinal())
	assert.Equal(t, 1, d1.Ordinal())
	p, err := d0.MemAlloc(8 * simMiB)
	require.NoError(t, err)
	free0, _, _ := d0.MemGetInfo()
	free1, total1, _ := d1.MemGetInfo()
	assert.Equal(t, uint64(8*simMiB), free0, "GPU 0 lost what it allocated")
	assert.Equal(t, total1, free1, "GPU 1 is untouched: capacities are per GPU")
	q, err := d1.MemAlloc(8 * simMiB)
	require.NoError(t, err)
	assert.NotEqual(t, p, q, "one address space: pointers of two GPUs differ")
	o, _, ok := d1.Owner(p)
	assert.False(t, ok, "GPU 1 does not own GPU 0's allocation (o=%#x)", o)
}

func TestSimHostVMMPeerCopyNeedsSetAccess(t *testing.T) {
	_, d0, d1 := simHostFixture(t)
	g, _ := d0.AllocationGranularity()
	src, _ := simMapped(t, d0, g, 1) // access for GPU 0 only
	dst, _ := simMapped(t, d1, g, 1)
	require.NoError(t, d0.MemsetD32(src, 0x1234abcd, g/4))

	err := d1.MemcpyDtoDAsync(dst, src, g, 0)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "copy on GPU 1 from GPU 0's mapping without cuMemSetAccess for GPU 1")
	assert.Contains(t, err.Error(), "device 1 has no access to device 0")
	assert.Equal(t, Uninitialized, simWord(t, d1, dst), "a failed copy writes nothing")

	require.NoError(t, d0.MemSetAccessPeers(src, g, []int{0, 1}))
	require.NoError(t, d1.MemcpyDtoDAsync(dst, src, g, 0))
	assert.Equal(t, uint32(0x1234abcd), simWord(t, d1, dst))
	assert.Equal(t, uint32(0x1234abcd), simWord(t, d1, dst+uintptr(g)-4))
	// The other direction needs access for GPU 0 to GPU 1's mapping.
	assert.ErrorIs(t, d0.MemcpyDtoDAsync(src, dst, g, 0), device.ErrInvalidValue)
	require.NoError(t, d0.Check())
	require.NoError(t, d1.Check())
}

func TestSimHostLinearPeerCopyNeedsEnable(t *testing.T) {
	_, d0, d1 := simHostFixture(t)
	src, err := d0.MemAlloc(4096)
	require.NoError(t, err)
	dst, err := d1.MemAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, d0.MemsetD32(src, 7, 1024))
	assert.ErrorIs(t, d1.MemcpyDtoDAsync(dst, src, 4096, 0), device.ErrInvalidValue)
	require.NoError(t, d0.EnablePeerAccess(1))
	require.NoError(t, d0.EnablePeerAccess(1), "enabling twice is harmless")
	require.NoError(t, d0.EnablePeerAccess(0), "own device: a no-op")
	require.NoError(t, d1.MemcpyDtoDAsync(dst+8, src, 4088, 0))
	assert.Equal(t, Uninitialized, simWord(t, d1, dst))
	assert.Equal(t, uint32(7), simWord(t, d1, dst+8))
	assert.Equal(t, uint32(7), simWord(t, d1, dst+4092))
}

func TestSimHostNoPeerPath(t *testing.T) {
	h, d0, _ := simHostFixture(t)
	h.SetCanAccessPeer(0, 1, false)
	ok, err := d0.CanAccessPeer(1)
	require.NoError(t, err)
	assert.False(t, ok)
	ok, err = d0.CanAccessPeer(0)
	require.NoError(t, err)
	assert.True(t, ok, "a device reaches its own memory")
	assert.ErrorIs(t, d0.EnablePeerAccess(1), device.ErrNotSupported)
	g, _ := d0.AllocationGranularity()
	va, _ := simMapped(t, d0, g, 1)
	assert.ErrorIs(t, d0.MemSetAccessPeers(va, g, []int{1}), device.ErrNotSupported)
	_, err = d0.CanAccessPeer(2)
	assert.ErrorIs(t, err, device.ErrNoDevice)
}

func TestSimSingleGPUPeerIsSelf(t *testing.T) {
	s := New(Config{})
	ok, err := s.CanAccessPeer(0)
	require.NoError(t, err)
	assert.True(t, ok)
	require.NoError(t, s.EnablePeerAccess(0))
	_, err = s.CanAccessPeer(1)
	assert.ErrorIs(t, err, device.ErrNoDevice)
}

// Open is Device for an ordinal in range, and an ErrNoDevice error, not a
// panic, for one out of range.
func TestSimHostOpen(t *testing.T) {
	h := NewHost(2, Config{Capacity: 64 * simMiB})
	for k := range 2 {
		d, err := h.Open(k)
		require.NoError(t, err)
		require.Same(t, h.Device(k), d)
		require.Equal(t, k, d.Ordinal())
	}
	for _, k := range []int{-1, 2, 64} {
		d, err := h.Open(k)
		require.ErrorIs(t, err, device.ErrNoDevice, "ordinal %d", k)
		require.Nil(t, d)
	}
}
