package devicetest

import (
	"math"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// confAsync is the conformance case of the stream-ordered allocator: what
// the driver's default pool and the simulator's emulation both do. It skips where d
// is no AsyncAllocator or the driver has no memory pools; it leaves the
// pool empty and trimmed, with the release threshold at 0.
func confAsync(t *testing.T, d device.Device) {
	a, ok := d.(device.AsyncAllocator)
	if !ok {
		t.Skipf("%T is not an AsyncAllocator", d)
	}
	if _, err := a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent); err != nil {
		if assert.ErrorIs(t, err, device.ErrNotSupported) {
			t.Skip(err)
		}
		return
	}
	require.NoError(t, a.MemPoolSetAttribute(device.MemPoolReleaseThreshold, math.MaxUint64))
	defer func() {
		require.NoError(t, a.MemPoolSetAttribute(device.MemPoolReleaseThreshold, 0))
		require.NoError(t, d.StreamSynchronize(0))
		require.NoError(t, a.MemPoolTrimTo(0))
		res, err := a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
		require.NoError(t, err)
		assert.Zero(t, res, "trimmed to 0 with nothing live")
	}()
	v, err := a.MemPoolGetAttribute(device.MemPoolReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, uint64(math.MaxUint64), v)

	// On the default stream: allocate, fill, read back, free.
	const size = 3*confMiB + 4
	p, err := a.MemAllocAsync(size, 0)
	require.NoError(t, err)
	assert.Zero(t, p%256, "256-byte aligned")
	require.NoError(t, d.MemsetD32Async(p, 0xa5a5f00d, size/4, 0))
	confCheckFill(t, confRead(t, d, p, size/4*4), 0, 0xa5a5f00d, "async block")
	used, err := a.MemPoolGetAttribute(device.MemPoolUsedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, used, uint64(size))
	res, err := a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, res, used)

	// On a stream of its own, next to the first block.
	s, err := d.StreamCreate()
	require.NoError(t, err)
	q, err := a.MemAllocAsync(confMiB, s)
	require.NoError(t, err)
	assert.True(t, q+confMiB <= p || p+size <= q, "blocks %#x and %#x overlap", p, q)
	require.NoError(t, d.MemsetD32Async(q, 7, confMiB/4, s))
	require.NoError(t, d.StreamSynchronize(s))
	confCheckFill(t, confRead(t, d, q, confMiB), 0, 7, "block on a stream")
	confCheckFill(t, confRead(t, d, p, 4096), 0, 0xa5a5f00d, "first block untouched")
	require.NoError(t, a.MemFreeAsync(q, s))
	require.NoError(t, a.MemFreeAsync(p, 0))
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.StreamSynchronize(0))
	require.NoError(t, d.StreamDestroy(s))

	// With the threshold at its maximum, a synchronize keeps the memory.
	used, err = a.MemPoolGetAttribute(device.MemPoolUsedMemCurrent)
	require.NoError(t, err)
	assert.Zero(t, used)
	kept, err := a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, kept, uint64(size), "the pool keeps freed memory below the threshold")
	high, err := a.MemPoolGetAttribute(device.MemPoolReservedMemHigh)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, high, kept)
	require.NoError(t, a.MemPoolSetAttribute(device.MemPoolReservedMemHigh, 0), "a high-water mark resets to 0")
	require.NoError(t, a.MemPoolSetAttribute(device.MemPoolUsedMemHigh, 0))

	// A trim keeps at least keep bytes (cuMemPoolTrimTo's minBytesToKeep),
	// even where that is not a whole granule, and releases nothing of a
	// pool that holds no more.
	const keep = confMiB + 4096
	require.NoError(t, a.MemPoolTrimTo(keep))
	trimmed, err := a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, trimmed, uint64(keep), "a trim to %d bytes keeps at least that many", keep)
	assert.LessOrEqual(t, trimmed, kept)
	// (Not math.MaxUint64: driver 580 on the H200 released everything
	// for it, 2026-12-07.)
	require.NoError(t, a.MemPoolTrimTo(2*trimmed))
	again, err := a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
	require.NoError(t, err)
	assert.Equal(t, trimmed, again, "a trim to more than the pool holds releases nothing")

	// Attributes that are not 64-bit byte counts, or not settable.
	_, err = a.MemPoolGetAttribute(device.MemPoolAttribute(1))
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.ErrorIs(t, a.MemPoolSetAttribute(device.MemPoolAttribute(99), 0), device.ErrInvalidValue)
	assert.Error(t, a.MemPoolSetAttribute(device.MemPoolUsedMemCurrent, 5))
}
