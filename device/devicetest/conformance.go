package devicetest

import (
	"encoding/binary"
	"fmt"
	"math/bits"
	"sort"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Run runs the conformance suite against d as subtests. d must
// keep memory contents (a GPU, or a simulated device with sim.Config.Shadow). The VMM subtests
// skip themselves when d.VMMSupported() is false.
func Run(t *testing.T, d device.Device) {
	t.Helper()
	t.Run("Info", func(t *testing.T) { confInfo(t, d) })
	t.Run("LinearAllocFree", func(t *testing.T) { confLinearAllocFree(t, d) })
	t.Run("LinearErrors", func(t *testing.T) { confLinearErrors(t, d) })
	t.Run("Pitch", func(t *testing.T) { confPitch(t, d) })
	t.Run("MemsetCopy", func(t *testing.T) { confMemsetCopy(t, d) })
	t.Run("StreamsEvents", func(t *testing.T) { confStreamsEvents(t, d) })
	t.Run("TwoStreamsOrdered", func(t *testing.T) { confTwoStreamsOrdered(t, d) })
	t.Run("Concurrent", func(t *testing.T) { confConcurrent(t, d) })
	t.Run("VMM", func(t *testing.T) { confVMM(t, d) })
	t.Run("VMMReleaseWhileMapped", func(t *testing.T) { confVMMReleaseWhileMapped(t, d) })
	t.Run("VMMRemapKeepsContents", func(t *testing.T) { confVMMRemapKeepsContents(t, d) })
	t.Run("VMMErrors", func(t *testing.T) { confVMMErrors(t, d) })
	t.Run("LinearAndVMMDisjoint", func(t *testing.T) { confLinearAndVMMDisjoint(t, d) })
	t.Run("Async", func(t *testing.T) { confAsync(t, d) })
}

const confMiB = 1 << 20

// confByte is byte i of memory filled with 32-bit words v, i counted from a
// 4-byte aligned address: the words are stored little-endian.
func confByte(v uint32, i uint64) byte { return byte(v >> (8 * (i % 4))) }

// confRead copies n bytes at ptr back to the host.
func confRead(t *testing.T, d device.Device, ptr uintptr, n uint64) []byte {
	t.Helper()
	buf := make([]byte, n)
	require.NoError(t, d.MemcpyDtoH(buf, ptr))
	return buf
}

// confCheckFill asserts that got, read from base+off (base 4-byte aligned),
// holds words v throughout; it reports the first bad byte only.
func confCheckFill(t *testing.T, got []byte, off uint64, v uint32, what string) {
	t.Helper()
	for i, b := range got {
		if want := confByte(v, off+uint64(i)); b != want {
			t.Fatalf("%s: byte %d is %#02x, want %#02x (fill %#08x)", what, off+uint64(i), b, want, v)
		}
	}
}

// confSkipNoVMM skips a VMM subtest on a device without VMM, after checking
// that the granularity query agrees.
func confSkipNoVMM(t *testing.T, d device.Device) uint64 {
	t.Helper()
	if !d.VMMSupported() {
		t.Skip("device does not support virtual memory management")
	}
	g, err := d.AllocationGranularity()
	require.NoError(t, err)
	require.NotZero(t, g)
	require.Equal(t, 1, bits.OnesCount64(g), "granularity %d is not a power of two", g)
	return g
}

func confInfo(t *testing.T, d device.Device) {
	assert.NotEmpty(t, d.Name())
	assert.GreaterOrEqual(t, d.Ordinal(), 0)
	free, total, err := d.MemGetInfo()
	require.NoError(t, err)
	assert.NotZero(t, total)
	assert.LessOrEqual(t, free, total)
	tpa := d.TexturePitchAlignment()
	assert.NotZero(t, tpa)
	assert.Equal(t, 1, bits.OnesCount64(tpa), "texture pitch alignment %d is not a power of two", tpa)
	assert.LessOrEqual(t, tpa, uint64(512))
}

func confLinearAllocFree(t *testing.T, d device.Device) {
	const size = 8 * confMiB
	free0, _, err := d.MemGetInfo()
	require.NoError(t, err)
	p, err := d.MemAlloc(size)
	require.NoError(t, err)
	require.NotZero(t, p)
	assert.Zero(t, p%256, "MemAlloc must align to 256 bytes: %#x", p)
	free1, _, err := d.MemGetInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free0-free1, uint64(size), "free memory must drop by the allocation")
	require.NoError(t, d.MemFree(p))
	free2, _, err := d.MemGetInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free2-free1, uint64(size), "MemFree must give the memory back")

	// Several odd sizes at once: aligned and disjoint.
	sizes := []uint64{1, 3, 256, 4096, confMiB + 3, 3 * confMiB}
	type rng struct {
		p uintptr
		n uint64
	}
	var live []rng
	for _, n := range sizes {
		p, err := d.MemAlloc(n)
		require.NoError(t, err, "MemAlloc(%d)", n)
		assert.Zero(t, p%256, "MemAlloc(%d) = %#x is not 256-byte aligned", n, p)
		live = append(live, rng{p, n})
	}
	sort.Slice(live, func(i, j int) bool { return live[i].p < live[j].p })
	for i := 1; i < len(live); i++ {
		assert.LessOrEqual(t, uint64(live[i-1].p)+live[i-1].n, uint64(live[i].p), "allocations overlap")
	}
	for _, r := range live {
		require.NoError(t, d.MemFree(r.p))
	}
}

func confLinearErrors(t *testing.T, d device.Device) {
	_, err := d.MemAlloc(0)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "MemAlloc(0)")

	_, err = d.MemAlloc(1 << 50) // 1 PiB: more than any GPU has
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "MemAlloc(1 PiB)")

	p, err := d.MemAlloc(confMiB)
	require.NoError(t, err)
	assert.ErrorIs(t, d.MemFree(p+512), device.ErrInvalidValue, "MemFree of an interior pointer")
	require.NoError(t, d.MemFree(p))
	assert.ErrorIs(t, d.MemFree(p), device.ErrInvalidValue, "double MemFree")
}

func confPitch(t *testing.T, d device.Device) {
	// Measured on an H200: pitches are the width rounded up to 512 bytes.
	// Widths already a multiple of 512 keep their width whatever the
	// element size.
	cases := []struct {
		width, height uint64
		elem          uint32
		pitch         uint64
	}{
		{4, 3, 4, 512},
		{2052, 3, 4, 2560},
		{16000, 5, 4, 16384},
		{512, 2, 8, 512},
		{1024, 2, 16, 1024},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("w%d_h%d_e%d", c.width, c.height, c.elem), func(t *testing.T) {
			p, pitch, err := d.MemAllocPitch(c.width, c.height, c.elem)
			require.NoError(t, err)
			defer func() { require.NoError(t, d.MemFree(p)) }()
			assert.Zero(t, p%256, "pitched pointer %#x is not 256-byte aligned", p)
			assert.Equal(t, c.pitch, pitch)
			// The whole pitch×height block is usable.
			n := pitch * c.height
			require.NoError(t, d.MemsetD32(p, 0x0badcafe, n/4))
			last := confRead(t, d, p+uintptr(n-pitch), pitch)
			confCheckFill(t, last, 0, 0x0badcafe, "last row")
		})
	}
	_, _, err := d.MemAllocPitch(64, 4, 3)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "element size 3")
	_, _, err = d.MemAllocPitch(0, 4, 4)
	assert.Error(t, err, "width 0")
	_, _, err = d.MemAllocPitch(64, 0, 4)
	assert.Error(t, err, "height 0")
}

func confMemsetCopy(t *testing.T, d device.Device) {
	const size = confMiB + 12
	p, err := d.MemAlloc(size)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.MemFree(p)) }()

	require.NoError(t, d.MemsetD32(p, 0x11223344, size/4))
	confCheckFill(t, confRead(t, d, p, size), 0, 0x11223344, "whole allocation")

	// A few words in the middle; unaligned reads across their edges.
	require.NoError(t, d.MemsetD32(p+20, 0xaabbccdd, 3)) // bytes [20, 32)
	got := confRead(t, d, p+17, 20)                      // bytes [17, 37)
	confCheckFill(t, got[:3], 17, 0x11223344, "before the words")
	confCheckFill(t, got[3:15], 20, 0xaabbccdd, "the words")
	confCheckFill(t, got[15:], 32, 0x11223344, "after the words")
	one := confRead(t, d, p+size-1, 1)
	confCheckFill(t, one, size-1, 0x11223344, "last byte")

	// Async on the default stream, then synchronised.
	require.NoError(t, d.MemsetD32Async(p, 0x55667788, size/4, 0))
	require.NoError(t, d.StreamSynchronize(0))
	confCheckFill(t, confRead(t, d, p, size), 0, 0x55667788, "after async memset")

	// Words whose bytes differ only by position.
	require.NoError(t, d.MemsetD32(p, 0x00010203, 1))
	assert.Equal(t, []byte{3, 2, 1, 0}, confRead(t, d, p, 4))
	assert.Equal(t, uint32(0x00010203), binary.LittleEndian.Uint32(confRead(t, d, p, 4)))
}

func confStreamsEvents(t *testing.T, d device.Device) {
	s, err := d.StreamCreate()
	require.NoError(t, err)
	assert.NotZero(t, s, "a created stream is not the default stream")
	e, err := d.EventCreate()
	require.NoError(t, err)

	done, err := d.EventQuery(e)
	require.NoError(t, err)
	assert.True(t, done, "an event never recorded reports done")
	require.NoError(t, d.StreamWaitEvent(s, e), "waiting on an unrecorded event is a no-op")

	require.NoError(t, d.EventRecord(e, s))
	require.NoError(t, d.EventSynchronize(e))
	done, err = d.EventQuery(e)
	require.NoError(t, err)
	assert.True(t, done)

	require.NoError(t, d.EventRecord(e, 0), "recording on the default stream")
	require.NoError(t, d.StreamWaitEvent(s, e))
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.StreamSynchronize(0))
	done, err = d.EventQuery(e)
	require.NoError(t, err)
	assert.True(t, done)

	require.NoError(t, d.EventDestroy(e))
	require.NoError(t, d.StreamDestroy(s))
}

func confTwoStreamsOrdered(t *testing.T, d device.Device) {
	const size = 2 * confMiB
	p, err := d.MemAlloc(size)
	require.NoError(t, err)
	defer func() { require.NoError(t, d.MemFree(p)) }()
	s1, err := d.StreamCreate()
	require.NoError(t, err)
	s2, err := d.StreamCreate()
	require.NoError(t, err)
	e, err := d.EventCreate()
	require.NoError(t, err)
	defer func() {
		require.NoError(t, d.EventDestroy(e))
		require.NoError(t, d.StreamDestroy(s1))
		require.NoError(t, d.StreamDestroy(s2))
	}()

	// s2's write waits for s1's through the event, so s2's value wins.
	require.NoError(t, d.MemsetD32Async(p, 0xa1a1a1a1, size/4, s1))
	require.NoError(t, d.EventRecord(e, s1))
	require.NoError(t, d.StreamWaitEvent(s2, e))
	require.NoError(t, d.MemsetD32Async(p, 0xb2b2b2b2, size/4, s2))
	require.NoError(t, d.StreamSynchronize(s2))
	done, err := d.EventQuery(e)
	require.NoError(t, err)
	assert.True(t, done, "s2 finished after waiting for e, so e is done")
	confCheckFill(t, confRead(t, d, p, size), 0, 0xb2b2b2b2, "ordered writes")

	// Disjoint halves written on different streams.
	require.NoError(t, d.MemsetD32Async(p, 0x01010101, size/8, s1))
	require.NoError(t, d.MemsetD32Async(p+size/2, 0x02020202, size/8, s2))
	require.NoError(t, d.StreamSynchronize(s1))
	require.NoError(t, d.StreamSynchronize(s2))
	got := confRead(t, d, p, size)
	confCheckFill(t, got[:size/2], 0, 0x01010101, "first half")
	confCheckFill(t, got[size/2:], size/2, 0x02020202, "second half")
	require.NoError(t, d.EventSynchronize(e))
}

func confConcurrent(t *testing.T, d device.Device) {
	const (
		workers = 4
		rounds  = 16
		size    = 64 << 10
	)
	var wg sync.WaitGroup
	errs := make(chan error, workers)
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v := 0x01010101 * uint32(w+1)
			buf := make([]byte, 8)
			for range rounds {
				p, err := d.MemAlloc(size)
				if err != nil {
					errs <- err
					return
				}
				err = d.MemsetD32(p, v, size/4)
				if err == nil {
					err = d.MemcpyDtoH(buf, p+size-8)
				}
				if err == nil && binary.LittleEndian.Uint32(buf) != v {
					err = fmt.Errorf("worker %d read %x, want %#08x", w, buf, v)
				}
				if ferr := d.MemFree(p); err == nil {
					err = ferr
				}
				if err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func confVMM(t *testing.T, d device.Device) {
	g := confSkipNoVMM(t, d)
	free0, _, err := d.MemGetInfo()
	require.NoError(t, err)

	va, err := d.AddressReserve(4*g, 0)
	require.NoError(t, err)
	assert.Zero(t, uint64(va)%g, "reservation %#x is not granularity-aligned", va)
	h1, err := d.MemCreate(g)
	require.NoError(t, err)
	h2, err := d.MemCreate(g)
	require.NoError(t, err)
	h3, err := d.MemCreate(2 * g)
	require.NoError(t, err)
	free1, _, err := d.MemGetInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free0-free1, 4*g, "MemCreate consumes memory")

	require.NoError(t, d.MemMap(va, g, h1))
	require.NoError(t, d.MemMap(va+uintptr(g), g, h2))
	require.NoError(t, d.MemMap(va+uintptr(2*g), 2*g, h3))
	require.NoError(t, d.MemSetAccess(va, 4*g))

	// One memset across three handles, read back whole and across seams.
	require.NoError(t, d.MemsetD32(va, 0x5a5a0f0f, g))
	confCheckFill(t, confRead(t, d, va, 4*g), 0, 0x5a5a0f0f, "whole reservation")
	require.NoError(t, d.MemsetD32(va+uintptr(g)-8, 0xc3c3f0f0, 4)) // [g-8, g+8)
	got := confRead(t, d, va+uintptr(g)-11, 22)                     // [g-11, g+11)
	confCheckFill(t, got[:3], g-11, 0x5a5a0f0f, "before the seam")
	confCheckFill(t, got[3:19], g-8, 0xc3c3f0f0, "across the seam")
	confCheckFill(t, got[19:], g+8, 0x5a5a0f0f, "after the seam")

	// Async work across the handles, on a stream.
	s, err := d.StreamCreate()
	require.NoError(t, err)
	require.NoError(t, d.MemsetD32Async(va+uintptr(g), 0x77777777, g/2, s)) // [g, 3g)
	require.NoError(t, d.StreamSynchronize(s))
	require.NoError(t, d.StreamDestroy(s))
	got = confRead(t, d, va+uintptr(g)-4, 2*g+8)
	confCheckFill(t, got[:4], g-4, 0xc3c3f0f0, "before the async range")
	confCheckFill(t, got[4:4+2*g], g, 0x77777777, "async range")
	confCheckFill(t, got[4+2*g:], 3*g, 0x5a5a0f0f, "after the async range")

	// Two adjacent mappings unmapped by one call, then the last one.
	require.NoError(t, d.MemUnmap(va, 2*g))
	require.NoError(t, d.MemUnmap(va+uintptr(2*g), 2*g))
	require.NoError(t, d.MemRelease(h1))
	require.NoError(t, d.MemRelease(h2))
	require.NoError(t, d.MemRelease(h3))
	require.NoError(t, d.AddressFree(va, 4*g))
	free2, _, err := d.MemGetInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free2-free1, 4*g, "released, unmapped memory is free again")
}

func confVMMReleaseWhileMapped(t *testing.T, d device.Device) {
	g := confSkipNoVMM(t, d)
	va, err := d.AddressReserve(g, 0)
	require.NoError(t, err)
	h, err := d.MemCreate(g)
	require.NoError(t, err)
	require.NoError(t, d.MemMap(va, g, h))
	require.NoError(t, d.MemSetAccess(va, g))
	free0, _, err := d.MemGetInfo()
	require.NoError(t, err)

	// Releasing the handle keeps the memory while it stays mapped.
	require.NoError(t, d.MemRelease(h))
	require.NoError(t, d.MemsetD32(va, 0x600df00d, g/4))
	confCheckFill(t, confRead(t, d, va+uintptr(g)-64, 64), g-64, 0x600df00d, "released but mapped")
	require.NoError(t, d.MemUnmap(va, g))
	free1, _, err := d.MemGetInfo()
	require.NoError(t, err)
	assert.GreaterOrEqual(t, free1-free0, g, "the last unmap frees a released handle")
	require.NoError(t, d.AddressFree(va, g))
}

func confVMMRemapKeepsContents(t *testing.T, d device.Device) {
	g := confSkipNoVMM(t, d)
	a, err := d.AddressReserve(g, 0)
	require.NoError(t, err)
	b, err := d.AddressReserve(2*g, 0)
	require.NoError(t, err)
	h, err := d.MemCreate(g)
	require.NoError(t, err)

	require.NoError(t, d.MemMap(a, g, h))
	require.NoError(t, d.MemSetAccess(a, g))
	require.NoError(t, d.MemsetD32(a, 0x13579bdf, g/4))
	require.NoError(t, d.MemUnmap(a, g))

	// The contents belong to the physical allocation, not the address.
	at := b + uintptr(g)
	require.NoError(t, d.MemMap(at, g, h))
	require.NoError(t, d.MemSetAccess(at, g))
	confCheckFill(t, confRead(t, d, at, g), 0, 0x13579bdf, "remapped handle")

	require.NoError(t, d.MemUnmap(at, g))
	require.NoError(t, d.MemRelease(h))
	require.NoError(t, d.AddressFree(a, g))
	require.NoError(t, d.AddressFree(b, 2*g))
}

func confVMMErrors(t *testing.T, d device.Device) {
	g := confSkipNoVMM(t, d)
	_, err := d.AddressReserve(g+1, 0)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "reservation not a multiple of the granularity")
	_, err = d.MemCreate(g + 1)
	assert.ErrorIs(t, err, device.ErrInvalidValue, "MemCreate not a multiple of the granularity")

	va, err := d.AddressReserve(2*g, 0)
	require.NoError(t, err)
	h, err := d.MemCreate(g)
	require.NoError(t, err)
	h2, err := d.MemCreate(g)
	require.NoError(t, err)
	require.NoError(t, d.MemMap(va, g, h))
	assert.Error(t, d.MemMap(va, g, h2), "mapping over a mapped range")
	assert.Error(t, d.MemMap(va+uintptr(g+g/2), g, h2), "a mapping not aligned to the granularity")

	require.NoError(t, d.MemUnmap(va, g))
	require.NoError(t, d.MemRelease(h))
	require.NoError(t, d.MemRelease(h2))
	require.NoError(t, d.AddressFree(va, 2*g))
}

func confLinearAndVMMDisjoint(t *testing.T, d device.Device) {
	type rng struct{ lo, hi uint64 }
	var rs []rng
	var ptrs []uintptr
	for range 3 {
		p, err := d.MemAlloc(confMiB)
		require.NoError(t, err)
		ptrs = append(ptrs, p)
		rs = append(rs, rng{uint64(p), uint64(p) + confMiB})
	}
	var g uint64
	var vas []uintptr
	if d.VMMSupported() {
		var err error
		g, err = d.AllocationGranularity()
		require.NoError(t, err)
		for range 2 {
			va, err := d.AddressReserve(2*g, 0)
			require.NoError(t, err)
			vas = append(vas, va)
			rs = append(rs, rng{uint64(va), uint64(va) + 2*g})
		}
	}
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	for i := 1; i < len(rs); i++ {
		assert.LessOrEqual(t, rs[i-1].hi, rs[i].lo, "address ranges overlap: %#x and %#x", rs[i-1], rs[i])
	}
	for _, p := range ptrs {
		require.NoError(t, d.MemFree(p))
	}
	for _, va := range vas {
		require.NoError(t, d.AddressFree(va, 2*g))
	}
}
