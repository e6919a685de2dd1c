package device

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// confAsync is the conformance case of the stream-ordered allocator: what
// the driver's default pool and Sim's emulation both do. It skips where d
// is no AsyncAllocator or the driver has no memory pools; it leaves the
// pool empty and trimmed, with the release threshold at 0.
func confAsync(t *testing.T, d Device) {
	a, ok := d.(AsyncAllocator)
	if !ok {
		t.Skipf("%T is not an AsyncAllocator", d)
	}
	if _, err := a.MemPoolGetAttribute(MemPoolReservedMemCurrent); err != nil {
		if assert.ErrorIs(t, err, ErrNotSupported) {
			t.Skip(err)
		}
		return
	}
	require.NoError(t, a.MemPoolSetAttribute(MemPoolReleaseThreshold, math.MaxUint64))
	defer func() {
		require.NoError(t, a.MemPoolSetAttribute(MemPoolReleaseThreshold, 0))
		require.NoError(t, d.StreamSynchronize(0))
		require.NoError(t, a.MemPoolTrimTo(0))
		res, err := a.MemPoolGetAttribute(MemPoolReservedMemCurrent)
		require.NoError(t, err)
		assert.Zero(t, res, "trimmed to 0 with nothing live")
	}()
	v, err := a.MemPoolGetAttribute(MemPoolReleaseThreshold)
	require.NoError(t, err)
	assert.Equal(t, uint64(math.MaxUint64), v)

	// On the default stream: allocate, fill, read back, free.
	const size = 3*confMiB + 4
	p, err := a.MemAllocAsync(size, 0)
	require.NoError(t, err)
	assert.Zero(t, p%256, "256-byte aligned")
	require.NoError(t, d.MemsetD32Async(p, 0xa5a5f00d, size/4, 0))
	confCheckFill(t, confRead(t, d, p, size/4*4), 0, 0xa5a5f00d, "async block")
	used, err := a.MemPoolGetAttribute(MemPoolUsedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, used, uint64(size))
	res, err := a.MemPoolGetAttribute(MemPoolReservedMemCurrent)
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
	used, err = a.MemPoolGetAttribute(MemPoolUsedMemCurrent)
	require.NoError(t, err)
	assert.Zero(t, used)
	kept, err := a.MemPoolGetAttribute(MemPoolReservedMemCurrent)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, kept, uint64(size), "the pool keeps freed memory below the threshold")
	high, err := a.MemPoolGetAttribute(MemPoolReservedMemHigh)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, high, kept)
	require.NoError(t, a.MemPoolSetAttribute(MemPoolReservedMemHigh, 0), "a high-water mark resets to 0")
	require.NoError(t, a.MemPoolSetAttribute(MemPoolUsedMemHigh, 0))

	// Attributes that are not 64-bit byte counts, or not settable.
	_, err = a.MemPoolGetAttribute(MemPoolAttribute(1))
	assert.ErrorIs(t, err, ErrInvalidValue)
	assert.ErrorIs(t, a.MemPoolSetAttribute(MemPoolAttribute(99), 0), ErrInvalidValue)
	assert.Error(t, a.MemPoolSetAttribute(MemPoolUsedMemCurrent, 5))
}

func TestSimAsyncPool(t *testing.T) {
	const g = 2 * simMiB
	s := NewSim(SimConfig{Capacity: 64 * simMiB, Shadow: true})
	free0, _, err := s.MemGetInfo()
	require.NoError(t, err)

	// A first allocation takes whole granules from the GPU.
	p, err := s.MemAllocAsync(3*simMiB, 0)
	require.NoError(t, err)
	simCheck(t, s)
	free, _, _ := s.MemGetInfo()
	assert.Equal(t, free0-2*g, free, "3 MiB takes two 2-MiB granules")
	res, _ := s.MemPoolGetAttribute(MemPoolReservedMemCurrent)
	assert.Equal(t, uint64(2*g), res)
	// A second one that fits in what the pool holds takes nothing more.
	q, err := s.MemAllocAsync(simMiB/2, 0)
	require.NoError(t, err)
	free, _, _ = s.MemGetInfo()
	assert.Equal(t, free0-2*g, free)
	assert.Equal(t, 2, s.Stats().AsyncAllocs)
	assert.Zero(t, s.Stats().LinearAllocs)

	// cuMemFree does not take async memory; MemFreeAsync takes nothing else.
	assert.ErrorIs(t, s.MemFree(p), ErrInvalidValue)
	lin, err := s.MemAlloc(4096)
	require.NoError(t, err)
	assert.ErrorIs(t, s.MemFreeAsync(lin, 0), ErrInvalidValue)
	assert.ErrorIs(t, s.MemFreeAsync(p+512, 0), ErrInvalidValue)
	require.NoError(t, s.MemFree(lin))
	_, err = s.MemAllocAsync(0, 0)
	assert.ErrorIs(t, err, ErrInvalidValue)
	_, err = s.MemAllocAsync(1, Stream(12345))
	assert.ErrorIs(t, err, ErrInvalidValue)

	// Running out: the pool is unchanged.
	before := s.Stats()
	_, err = s.MemAllocAsync(63*simMiB, 0)
	assert.ErrorIs(t, err, ErrOutOfMemory)
	assert.Equal(t, before, s.Stats())
	simCheck(t, s)

	// Frees return bytes to the pool; a synchronize returns them to the
	// GPU beyond the release threshold (0 by default).
	require.NoError(t, s.MemFreeAsync(q, 0))
	require.NoError(t, s.MemFreeAsync(p, 0))
	free, _, _ = s.MemGetInfo()
	assert.Equal(t, free0-2*g, free, "freed memory stays in the pool until a synchronize")
	require.NoError(t, s.MemPoolSetAttribute(MemPoolReleaseThreshold, 3*simMiB))
	require.NoError(t, s.StreamSynchronize(0))
	res, _ = s.MemPoolGetAttribute(MemPoolReservedMemCurrent)
	assert.Equal(t, uint64(g), res, "keeps the threshold rounded down to a granule")
	require.NoError(t, s.MemPoolTrimTo(0))
	assert.Zero(t, s.Used())
	high, _ := s.MemPoolGetAttribute(MemPoolReservedMemHigh)
	assert.Equal(t, uint64(2*g), high)
	require.NoError(t, s.MemPoolSetAttribute(MemPoolReservedMemHigh, 0))
	high, _ = s.MemPoolGetAttribute(MemPoolReservedMemHigh)
	assert.Zero(t, high)
	assert.ErrorIs(t, s.MemPoolSetAttribute(MemPoolReservedMemHigh, 1), ErrInvalidValue)
	simCheck(t, s)
	assert.Empty(t, s.Violations())
}

func TestSimAsyncSharesCapacity(t *testing.T) {
	a := NewSim(SimConfig{Capacity: 16 * simMiB})
	b := a.NewProcess()
	p, err := a.MemAllocAsync(10*simMiB, 0)
	require.NoError(t, err)
	_, err = b.MemAllocAsync(8*simMiB, 0)
	assert.ErrorIs(t, err, ErrOutOfMemory, "the other process's pool holds the memory")
	require.NoError(t, a.MemFreeAsync(p, 0))
	_, err = b.MemAllocAsync(8*simMiB, 0)
	assert.ErrorIs(t, err, ErrOutOfMemory, "freed, but still held by a's pool")
	require.NoError(t, a.StreamSynchronize(0))
	q, err := b.MemAllocAsync(8*simMiB, 0)
	require.NoError(t, err, "a's synchronize returned it")
	require.NoError(t, b.MemFreeAsync(q, 0))
	simCheck(t, a)
	simCheck(t, b)
}

func TestSimAsyncStreamOrder(t *testing.T) {
	s := NewSim(SimConfig{Shadow: true})
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
	s := NewSim(SimConfig{})
	p, err := s.MemAllocAsync(4096, 0) // grows the pool by one granule
	require.NoError(t, err)
	require.NoError(t, s.MemFreeAsync(p, 0))
	p, err = s.MemAllocAsync(4096, 0) // served from the pool
	require.NoError(t, err)
	require.NoError(t, s.MemFreeAsync(p, 0))
	l := H200Latency()
	by := s.SimTimeByCall()
	const oh = 470 * time.Nanosecond
	grow := l.Cost[CallMemCreate](2 * simMiB)
	assert.Equal(t, 2*(oh+1100*time.Nanosecond)+grow, by[CallMemAllocAsync])
	assert.Equal(t, 2*(oh+1200*time.Nanosecond), by[CallMemFreeAsync])
}
