package sim

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simStreamFixture is a Sim with contents kept, a 64 KiB linear buffer and
// two streams.
type simStreamFixture struct {
	s      *Device
	p      uintptr
	s1, s2 device.Stream
}

const simBuf = 64 << 10

func newSimStreamFixture(t *testing.T) *simStreamFixture {
	t.Helper()
	s := New(Config{Capacity: 64 * simMiB, Granularity: 64 << 10, Shadow: true})
	p, err := s.MemAlloc(simBuf)
	require.NoError(t, err)
	s1, err := s.StreamCreate()
	require.NoError(t, err)
	s2, err := s.StreamCreate()
	require.NoError(t, err)
	return &simStreamFixture{s, p, s1, s2}
}

func (f *simStreamFixture) event(t *testing.T) device.Event {
	t.Helper()
	e, err := f.s.EventCreate()
	require.NoError(t, err)
	return e
}

func (f *simStreamFixture) done(t *testing.T, e device.Event) bool {
	t.Helper()
	d, err := f.s.EventQuery(e)
	require.NoError(t, err)
	return d
}

// word reads the 32-bit word at ptr.
func (f *simStreamFixture) word(t *testing.T, ptr uintptr) uint32 {
	t.Helper()
	buf := make([]byte, 4)
	require.NoError(t, f.s.MemcpyDtoH(buf, ptr))
	return uint32(buf[0]) | uint32(buf[1])<<8 | uint32(buf[2])<<16 | uint32(buf[3])<<24
}

func TestSimHoldDefersWork(t *testing.T) {
	f := newSimStreamFixture(t)
	e := f.event(t)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xa, simBuf/4, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	assert.False(t, f.done(t, e), "an event behind held work is not done")
	assert.Equal(t, 2, f.s.Stats().QueuedWork)
	assert.Equal(t, 1, f.s.Stats().HeldStreams)
	simCheck(t, f.s)

	// Reading the bytes the held work will write is a race, and sees the
	// old contents.
	assert.Equal(t, Uninitialized, f.word(t, f.p))
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "race")
	assert.Contains(t, v[0], "cuMemcpyDtoH")
	f.s.ClearViolations()

	require.NoError(t, f.s.ReleaseStream(f.s1))
	assert.True(t, f.done(t, e))
	assert.Equal(t, uint32(0xa), f.word(t, f.p+simBuf-4))
	assert.Empty(t, f.s.Violations())
	assert.Zero(t, f.s.Stats().QueuedWork)
	simCheck(t, f.s)
}

func TestSimSynchronizeLiftsHolds(t *testing.T) {
	f := newSimStreamFixture(t)
	e := f.event(t)

	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 1, 1, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.EventSynchronize(e))
	assert.True(t, f.done(t, e))
	assert.Equal(t, uint32(1), f.word(t, f.p))
	assert.Zero(t, f.s.Stats().HeldStreams)

	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.StreamSynchronize(f.s1), "synchronizing a held stream with no work")
	assert.Zero(t, f.s.Stats().HeldStreams, "StreamSynchronize lifts the hold")

	// Transitively: s2 waits on s1's event; synchronizing s2's event needs
	// s1's work too.
	e2 := f.event(t)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.HoldStream(f.s2))
	require.NoError(t, f.s.MemsetD32Async(f.p, 2, 1, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.StreamWaitEvent(f.s2, e))
	require.NoError(t, f.s.MemsetD32Async(f.p, 3, 1, f.s2))
	require.NoError(t, f.s.EventRecord(e2, f.s2))
	require.NoError(t, f.s.EventSynchronize(e2))
	assert.True(t, f.done(t, e))
	assert.True(t, f.done(t, e2))
	assert.Equal(t, uint32(3), f.word(t, f.p), "s2's write is ordered after s1's")
	assert.Zero(t, f.s.Stats().HeldStreams)
	assert.Empty(t, f.s.Violations())

	// StreamSynchronize of a stream waiting on a held stream.
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 4, 1, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.StreamWaitEvent(f.s2, e))
	require.NoError(t, f.s.MemsetD32Async(f.p, 5, 1, f.s2))
	require.NoError(t, f.s.StreamSynchronize(f.s2))
	assert.Equal(t, uint32(5), f.word(t, f.p))
	assert.Empty(t, f.s.Violations())
	simCheck(t, f.s)
}

func TestSimWaitEventOrdersStreams(t *testing.T) {
	// The correct stream-ordered reuse: s2 waits for s1's event before it
	// writes what s1 is still writing.
	f := newSimStreamFixture(t)
	e := f.event(t)
	e2 := f.event(t)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xa, simBuf/4, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.StreamWaitEvent(f.s2, e))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xb, simBuf/4, f.s2))
	require.NoError(t, f.s.EventRecord(e2, f.s2))
	assert.False(t, f.done(t, e2), "s2 waits for held s1")
	assert.Equal(t, 5, f.s.Stats().QueuedWork, "s1: memset, record; s2: wait, memset, record")
	require.NoError(t, f.s.ReleaseStream(f.s1))
	assert.True(t, f.done(t, e2))
	assert.Equal(t, uint32(0xb), f.word(t, f.p))
	assert.Empty(t, f.s.Violations())

	// Work on s1 after the recorded event is not ordered before s2's.
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xc, 1, f.s1)) // after e
	require.NoError(t, f.s.StreamWaitEvent(f.s2, e))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xd, 1, f.s2))
	require.NoError(t, f.s.ReleaseStream(f.s1))
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "race")
	simCheck(t, f.s)
}

func TestSimReuseWithoutWaitIsARace(t *testing.T) {
	// The bug pool tests look for: memory still written by held work on s1
	// handed to s2 without waiting for s1's event.
	f := newSimStreamFixture(t)
	e := f.event(t)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xa, simBuf/4, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p+64, 0xb, 4, f.s2)) // runs now
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "race")
	assert.Contains(t, v[0], "held")

	// And when the held work runs, it clobbers s2's data, as on a GPU.
	require.NoError(t, f.s.ReleaseStream(f.s1))
	assert.Equal(t, uint32(0xa), f.word(t, f.p+64))

	// A host-synchronous memset over held work is a race too.
	f.s.ClearViolations()
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xa, 1, f.s1))
	require.NoError(t, f.s.MemsetD32(f.p, 0xe, 1))
	v = f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "cuMemsetD32 wrote")

	// Disjoint bytes are no race.
	f.s.ClearViolations()
	require.NoError(t, f.s.MemsetD32(f.p+4, 0xe, 1))
	require.NoError(t, f.s.MemsetD32Async(f.p+8, 0xe, 1, f.s2))
	assert.Empty(t, f.s.Violations())
	require.NoError(t, f.s.ReleaseStream(f.s1))
	simCheck(t, f.s)
}

func TestSimFreeWithHeldWorkIsAViolation(t *testing.T) {
	f := newSimStreamFixture(t)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xa, 16, f.s1))
	require.NoError(t, f.s.MemFree(f.p), "the driver does not refuse it")
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "cuMemFree")
	assert.Contains(t, v[0], "freed")

	// The same addresses reused: the dropped write does not land there.
	q, err := f.s.MemAlloc(simBuf)
	require.NoError(t, err)
	require.Equal(t, f.p, q)
	require.NoError(t, f.s.ReleaseStream(f.s1))
	assert.Equal(t, Uninitialized, f.word(t, q))
	assert.Len(t, f.s.Violations(), 1)
	simCheck(t, f.s)
}

// A device-to-device copy within the GPU queues behind held work, as a
// memset does: it keeps the hold, runs in order when the stream goes,
// and freeing memory it will read or write meanwhile is a violation.
func TestSimCopyQueuesBehindAHold(t *testing.T) {
	f := newSimStreamFixture(t)
	q, err := f.s.MemAlloc(simBuf)
	require.NoError(t, err)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 0xa, simBuf/4, f.s1))
	require.NoError(t, f.s.MemcpyDtoDAsync(q, f.p, simBuf, f.s1))
	assert.Equal(t, 1, f.s.Stats().HeldStreams, "the copy keeps the hold")
	assert.Equal(t, 2, f.s.Stats().QueuedWork)
	require.NoError(t, f.s.ReleaseStream(f.s1))
	assert.Equal(t, uint32(0xa), f.word(t, q+simBuf-4), "the copy ran after the memset")
	assert.Empty(t, f.s.Violations())

	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemcpyDtoDAsync(f.p, q, simBuf, f.s1))
	require.NoError(t, f.s.MemFree(q), "the driver does not refuse it")
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "cuMemcpyDtoDAsync")
	assert.Contains(t, v[0], "still reads it")
	require.NoError(t, f.s.ReleaseStream(f.s1))
	simCheck(t, f.s)
}

// What a queued copy will read is guarded as what it will write: an
// unordered write over its source, on another stream or from the host,
// is a race, and an unordered stream-ordered free of it a violation.
func TestSimQueuedCopySourceIsGuarded(t *testing.T) {
	f := newSimStreamFixture(t)
	q, err := f.s.MemAlloc(simBuf)
	require.NoError(t, err)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemcpyDtoDAsync(q, f.p, simBuf, f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 2, simBuf/4, f.s2))
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "will read it")
	f.s.ClearViolations()
	require.NoError(t, f.s.MemsetD32(f.p, 3, 1))
	v = f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "will read it")
	f.s.ClearViolations()
	require.NoError(t, f.s.ReleaseStream(f.s1))

	a, err := f.s.MemAllocAsync(simBuf, f.s2)
	require.NoError(t, err)
	require.NoError(t, f.s.StreamSynchronize(f.s2))
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemcpyDtoDAsync(q, a, simBuf, f.s1))
	require.NoError(t, f.s.MemFreeAsync(a, f.s2))
	v = f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "still reads it")
	require.NoError(t, f.s.ReleaseStream(f.s1))
	simCheck(t, f.s)
}

func TestSimUnmapWithHeldWorkIsAViolation(t *testing.T) {
	f := newSimStreamFixture(t)
	g := uint64(64 << 10)
	va, hs := simMapped(t, f.s, g, 2)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(va+uintptr(g)-8, 0xa, 4, f.s1)) // spans both handles
	require.NoError(t, f.s.MemUnmap(va+uintptr(g), g))
	v := f.s.Violations()
	require.Len(t, v, 1)
	assert.Contains(t, v[0], "cuMemUnmap")

	// A different handle mapped where the old one was does not get the
	// dropped write; the still-mapped handle does.
	h3, err := f.s.MemCreate(g)
	require.NoError(t, err)
	require.NoError(t, f.s.MemMap(va+uintptr(g), g, h3))
	require.NoError(t, f.s.MemSetAccess(va+uintptr(g), g))
	require.NoError(t, f.s.ReleaseStream(f.s1))
	assert.Equal(t, uint32(0xa), f.word(t, va+uintptr(g)-4))
	assert.Equal(t, Uninitialized, f.word(t, va+uintptr(g)))

	// Releasing the unmapped handle: its memory goes, no further report.
	require.NoError(t, f.s.MemRelease(hs[1]))
	assert.Len(t, f.s.Violations(), 1)
	simCheck(t, f.s)
}

func TestSimDestroyHeldStream(t *testing.T) {
	f := newSimStreamFixture(t)
	e := f.event(t)
	require.NoError(t, f.s.HoldStream(f.s1))
	require.NoError(t, f.s.MemsetD32Async(f.p, 7, 1, f.s1))
	require.NoError(t, f.s.EventRecord(e, f.s1))
	require.NoError(t, f.s.StreamDestroy(f.s1), "destroying a stream with work queued is allowed")
	assert.ErrorIs(t, f.s.StreamSynchronize(f.s1), device.ErrInvalidValue)
	assert.ErrorIs(t, f.s.HoldStream(f.s1), device.ErrInvalidValue)
	assert.False(t, f.done(t, e))
	simCheck(t, f.s)
	require.NoError(t, f.s.EventSynchronize(e), "the queued work still completes")
	assert.Equal(t, uint32(7), f.word(t, f.p))
	require.NoError(t, f.s.ReleaseStream(f.s1), "releasing a destroyed stream is harmless")
	assert.Equal(t, 1, f.s.Stats().Streams)
	simCheck(t, f.s)
}

func TestSimHoldDefaultStream(t *testing.T) {
	f := newSimStreamFixture(t)
	e := f.event(t)
	require.NoError(t, f.s.HoldStream(0))
	require.NoError(t, f.s.MemsetD32Async(f.p, 9, 1, 0))
	require.NoError(t, f.s.EventRecord(e, 0))
	assert.False(t, f.done(t, e))
	// A synchronous copy waits for the default stream's work: no race.
	assert.Equal(t, uint32(9), f.word(t, f.p))
	assert.True(t, f.done(t, e))
	assert.Empty(t, f.s.Violations())
	simCheck(t, f.s)
}

func TestSimStreamEventMisuse(t *testing.T) {
	f := newSimStreamFixture(t)
	e := f.event(t)
	require.NoError(t, f.s.EventDestroy(e))
	cases := []struct {
		name string
		call func() error
	}{
		{"destroy default stream", func() error { return f.s.StreamDestroy(0) }},
		{"destroy unknown stream", func() error { return f.s.StreamDestroy(0x1234) }},
		{"synchronize unknown stream", func() error { return f.s.StreamSynchronize(0x1234) }},
		{"wait on unknown stream", func() error { return f.s.StreamWaitEvent(0x1234, e) }},
		{"wait on destroyed event", func() error { return f.s.StreamWaitEvent(f.s1, e) }},
		{"record destroyed event", func() error { return f.s.EventRecord(e, f.s1) }},
		{"query destroyed event", func() error { _, err := f.s.EventQuery(e); return err }},
		{"synchronize destroyed event", func() error { return f.s.EventSynchronize(e) }},
		{"destroy destroyed event", func() error { return f.s.EventDestroy(e) }},
		{"memset on unknown stream", func() error { return f.s.MemsetD32Async(f.p, 0, 1, 0x1234) }},
		{"misaligned memset", func() error { return f.s.MemsetD32(f.p+2, 0, 1) }},
		{"misaligned async memset", func() error { return f.s.MemsetD32Async(f.p+2, 0, 1, f.s1) }},
		{"hold unknown stream", func() error { return f.s.HoldStream(0x1234) }},
		{"release unknown stream", func() error { return f.s.ReleaseStream(0x1234) }},
		{"memset overflow", func() error { return f.s.MemsetD32(f.p, 0, 1<<62) }},
	}
	for _, c := range cases {
		assert.ErrorIs(t, c.call(), device.ErrInvalidValue, c.name)
	}
	ev, err := f.s.EventCreate()
	require.NoError(t, err)
	require.NoError(t, f.s.EventRecord(ev, f.s1))
	e2, err := f.s.EventCreate()
	require.NoError(t, err)
	assert.NotEqual(t, e, ev, "handles are never reused")
	assert.NotEqual(t, ev, e2)
	require.NoError(t, f.s.StreamWaitEvent(f.s2, ev))
	counts := f.s.Counts()
	assert.Equal(t, uint64(3), counts[device.CallStreamWaitEvent], "StreamWaitEvent counts, failed calls too")
	simCheck(t, f.s)
}

func TestSimIllegalAddress(t *testing.T) {
	f := newSimStreamFixture(t)
	buf := make([]byte, 8)
	cases := []struct {
		name string
		call func() error
	}{
		{"memset past the end", func() error { return f.s.MemsetD32(f.p+simBuf-4, 0, 2) }},
		{"copy past the end", func() error { return f.s.MemcpyDtoH(buf, f.p+simBuf-4) }},
		{"memset unallocated", func() error { return f.s.MemsetD32(0x1000, 0, 1) }},
		{"async memset unallocated", func() error { return f.s.MemsetD32Async(0x1000, 0, 1, f.s1) }},
		{"copy from null", func() error { return f.s.MemcpyDtoH(buf, 0) }},
		{"copy wrapping the address space", func() error { return f.s.MemcpyDtoH(buf, ^uintptr(0)-3) }},
	}
	for _, c := range cases {
		assert.ErrorIs(t, c.call(), device.ErrIllegalAddress, c.name)
	}
	require.NoError(t, f.s.MemFree(f.p))
	assert.ErrorIs(t, f.s.MemsetD32(f.p, 0, 1), device.ErrIllegalAddress, "use after free")
	assert.ErrorIs(t, f.s.MemcpyDtoH(buf, f.p), device.ErrIllegalAddress, "use after free")
	require.NoError(t, f.s.MemsetD32(0x1000, 0, 0), "zero words touch nothing")
	require.NoError(t, f.s.MemcpyDtoH(nil, 0x1000), "zero bytes touch nothing")
}

func TestSimWithoutHoldsEverythingIsDone(t *testing.T) {
	f := newSimStreamFixture(t)
	e := f.event(t)
	for i := range 10 {
		st := []device.Stream{0, f.s1, f.s2}[i%3]
		require.NoError(t, f.s.MemsetD32Async(f.p, uint32(i), simBuf/4, st))
		require.NoError(t, f.s.EventRecord(e, st))
		assert.True(t, f.done(t, e))
		require.NoError(t, f.s.StreamWaitEvent([]device.Stream{0, f.s1, f.s2}[(i+1)%3], e))
	}
	assert.Zero(t, f.s.Stats().QueuedWork)
	assert.Empty(t, f.s.Violations())
}
