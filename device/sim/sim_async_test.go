package sim

import (
	"testing"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSimAsyncPool(t *testing.T) {
	const g = 2 * simMiB
	s := New(Config{Capacity: 64 * simMiB, Shadow: true})
	free0, _, err := s.MemGetInfo()
	require.NoError(t, err)

	// A first allocation takes whole granules from the GPU.
	p, err := s.MemAllocAsync(3*simMiB, 0)
	require.NoError(t, err)
	simCheck(t, s)
	free, _, _ := s.MemGetInfo()
	assert.Equal(t, free0-2*g, free, "3 MiB takes two 2-MiB granules")
	res, _ := s.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
	assert.Equal(t, uint64(2*g), res)
	// A second one that fits in what the pool holds takes nothing more.
	q, err := s.MemAllocAsync(simMiB/2, 0)
	require.NoError(t, err)
	free, _, _ = s.MemGetInfo()
	assert.Equal(t, free0-2*g, free)
	assert.Equal(t, 2, s.Stats().AsyncAllocs)
	assert.Zero(t, s.Stats().LinearAllocs)

	// cuMemFree does not take async memory; MemFreeAsync takes nothing else.
	assert.ErrorIs(t, s.MemFree(p), device.ErrInvalidValue)
	lin, err := s.MemAlloc(4096)
	require.NoError(t, err)
	assert.ErrorIs(t, s.MemFreeAsync(lin, 0), device.ErrInvalidValue)
	assert.ErrorIs(t, s.MemFreeAsync(p+512, 0), device.ErrInvalidValue)
	require.NoError(t, s.MemFree(lin))
	_, err = s.MemAllocAsync(0, 0)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	_, err = s.MemAllocAsync(1, device.Stream(12345))
	assert.ErrorIs(t, err, device.ErrInvalidValue)

	// Running out: the pool is unchanged.
	before := s.Stats()
	_, err = s.MemAllocAsync(63*simMiB, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Equal(t, before, s.Stats())
	simCheck(t, s)

	// Frees return bytes to the pool; a synchronize returns them to the
	// GPU beyond the release threshold (0 by default).
	require.NoError(t, s.MemFreeAsync(q, 0))
	require.NoError(t, s.MemFreeAsync(p, 0))
	free, _, _ = s.MemGetInfo()
	assert.Equal(t, free0-2*g, free, "freed memory stays in the pool until a synchronize")
	require.NoError(t, s.MemPoolSetAttribute(device.MemPoolReleaseThreshold, 3*simMiB))
	require.NoError(t, s.StreamSynchronize(0))
	res, _ = s.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
	assert.Equal(t, uint64(g), res, "keeps the threshold rounded down to a granule")
	require.NoError(t, s.MemPoolTrimTo(0))
	assert.Zero(t, s.Used())
	high, _ := s.MemPoolGetAttribute(device.MemPoolReservedMemHigh)
	assert.Equal(t, uint64(2*g), high)
	require.NoError(t, s.MemPoolSetAttribute(device.MemPoolReservedMemHigh, 0))
	high, _ = s.MemPoolGetAttribute(device.MemPoolReservedMemHigh)
	assert.Zero(t, high)
	assert.ErrorIs(t, s.MemPoolSetAttribute(device.MemPoolReservedMemHigh, 1), device.ErrInvalidValue)
	simCheck(t, s)
	assert.Empty(t, s.Violations())
}

func TestSimAsyncSharesCapacity(t *testing.T) {
	a := New(Config{Capacity: 16 * simMiB})
	b := a.NewProcess()
	p, err := a.MemAllocAsync(10*simMiB, 0)
	require.NoError(t, err)
	_, err = b.MemAllocAsync(8*simMiB, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "the other process's pool holds the memory")
	require.NoError(t, a.MemFreeAsync(p, 0))
	_, err = b.MemAllocAsync(8*simMiB, 0)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "freed, but still held by a's pool")
	require.NoError(t, a.StreamSynchronize(0))
	q, err := b.MemAllocAsync(8*simMiB, 0)
	require.NoError(t, err, "a's synchronize returned it")
	require.NoError(t, b.MemFreeAsync(q, 0))
	simCheck(t, a)
	simCheck(t, b)
}

func TestSimAsyncStreamOrder(t *testing.T) {
	s := New(Config{Shadow: true})
	s1, err := s.StreamCreate()
	require.NoError(t, err)
	s2, err := s.StreamCreate()
	require.NoError(t, err)

	// Work on the free's own stream is ordered before it: no violation.
	p, err := s.MemAllocAsync(simMiB, s1)
	require.NoError(t, err)
	require.NoError(t, s.HoldStream(s1))
	require.NoError(t, s.MemsetD32Async(p, 1, simMiB/4, s1))
	require.NoError(t, s.MemFreeAsync(p, s1))
	require.NoError(t, s.ReleaseStream(s1))
	assert.Empty(t, s.Violations())

	// Work on another stream, not ordered before the free: a violation.
	p, err = s.MemAllocAsync(simMiB, s1)
	require.NoError(t, err)
	require.NoError(t, s.HoldStream(s2))
	require.NoError(t, s.MemsetD32Async(p, 2, simMiB/4, s2))
	require.NoError(t, s.MemFreeAsync(p, s1))
	require.NoError(t, s.ReleaseStream(s2))
	require.Len(t, s.Violations(), 1)
	assert.Contains(t, s.Violations()[0], "cuMemFreeAsync")
	s.ClearViolations()

	// Ordered by an event: no violation.
	e, err := s.EventCreate()
	require.NoError(t, err)
	p, err = s.MemAllocAsync(simMiB, s1)
	require.NoError(t, err)
	require.NoError(t, s.HoldStream(s2))
	require.NoError(t, s.MemsetD32Async(p, 3, simMiB/4, s2))
	require.NoError(t, s.EventRecord(e, s2))
	require.NoError(t, s.StreamWaitEvent(s1, e))
	require.NoError(t, s.MemFreeAsync(p, s1))
	require.NoError(t, s.ReleaseStream(s2))
	assert.Empty(t, s.Violations())
	simCheck(t, s)
}

func TestSimAsyncLatency(t *testing.T) {
	s := New(Config{})
	p, err := s.MemAllocAsync(4096, 0) // grows the pool by one granule
	require.NoError(t, err)
	require.NoError(t, s.MemFreeAsync(p, 0))
	p, err = s.MemAllocAsync(4096, 0) // served from the pool
	require.NoError(t, err)
	require.NoError(t, s.MemFreeAsync(p, 0))
	l := H200Latency()
	by := s.SimTimeByCall()
	const oh = 470 * time.Nanosecond
	grow := l.Cost[device.CallMemCreate](2 * simMiB)
	assert.Equal(t, 2*(oh+1100*time.Nanosecond)+grow, by[device.CallMemAllocAsync])
	assert.Equal(t, 2*(oh+1200*time.Nanosecond), by[device.CallMemFreeAsync])
}

// A trim keeps at least its target, rounded up to a granule as the pool
// holds whole granules (cuMemPoolTrimTo's minBytesToKeep), and leaves a
// pool that holds no more than the target as it is.
func TestSimAsyncTrimKeepsAtLeastKeep(t *testing.T) {
	const g = 2 * simMiB
	s := New(Config{Capacity: 64 * simMiB})
	require.NoError(t, s.MemPoolSetAttribute(device.MemPoolReleaseThreshold, ^uint64(0)))
	p, err := s.MemAllocAsync(7*simMiB, 0) // four granules
	require.NoError(t, err)
	require.NoError(t, s.MemFreeAsync(p, 0))
	require.NoError(t, s.StreamSynchronize(0))
	reserved := func() uint64 {
		v, err := s.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
		require.NoError(t, err)
		return v
	}
	require.Equal(t, uint64(4*g), reserved())
	require.NoError(t, s.MemPoolTrimTo(8*g))
	assert.Equal(t, uint64(4*g), reserved(), "a target above the pool releases nothing")
	require.NoError(t, s.MemPoolTrimTo(3*simMiB))
	assert.Equal(t, uint64(2*g), reserved(), "3 MiB kept as two granules, not one")
	require.NoError(t, s.MemPoolTrimTo(g))
	assert.Equal(t, uint64(g), reserved(), "a whole granule is kept exactly")
	require.NoError(t, s.MemPoolTrimTo(1))
	assert.Equal(t, uint64(g), reserved(), "one byte keeps a granule")
	require.NoError(t, s.MemPoolTrimTo(0))
	assert.Zero(t, reserved())
	assert.Zero(t, s.Used())

	// A target within a granule of 2^64 wraps to 0 when rounded up, as
	// driver 580's did on the H200 (2026-12-07): everything unused goes.
	p, err = s.MemAllocAsync(7*simMiB, 0)
	require.NoError(t, err)
	require.NoError(t, s.MemFreeAsync(p, 0))
	require.NoError(t, s.StreamSynchronize(0))
	require.Equal(t, uint64(4*g), reserved())
	require.NoError(t, s.MemPoolTrimTo(^uint64(0)))
	assert.Zero(t, reserved(), "2^64 - 1 wraps")
	require.NoError(t, s.Close())
	assert.ErrorIs(t, s.MemPoolTrimTo(0), device.ErrInvalidValue, "after Close")
}
