package pool

// The device suite: test bodies that run on any device.Device, on the
// simulated GPU here and on a real GPU in gpu_test.go. What only a
// simulation can tell (memory held, violations, holding a stream's work)
// is checked where testDevice.sim is set.

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

type suiteCase struct {
	name       string
	pooledOnly bool // stream-ordered reuse is the pooled backends' alone
	run        func(t *testing.T, d testDevice, be Backend)
}

var deviceSuite = []suiteCase{
	{"alloc returns aligned disjoint blocks and free takes them back", false, suiteAllocFree},
	{"pitch allocations use the driver's pitch and count pitch × height", false, suitePitch},
	{"every block keeps its own contents", false, suiteContents},
	{"a block freed on a stream is reused there at once and not on another", true, suiteTwoStreams},
	{"a request above MaxBytes fails with ErrOutOfMemory", false, suiteCapOOM},
	{"a request beyond the device fails cleanly", false, suiteBeyondDevice},
	{"Trim returns unused memory and Close the rest", false, suiteTrimClose},
}

// runDeviceSuite runs every suite body on each backend, each on a device
// from newDev.
func runDeviceSuite(t *testing.T, newDev deviceFactory, backends []Backend) {
	for _, be := range backends {
		for _, tc := range deviceSuite {
			if tc.pooledOnly && be == BackendPassthrough {
				continue
			}
			t.Run(be.String()+"/"+tc.name, func(t *testing.T) { tc.run(t, newDev(t), be) })
		}
	}
}

func TestDeviceSuiteOnSim(t *testing.T) {
	runDeviceSuite(t, simDevices(sim.Config{Capacity: 4 * giB, Shadow: true}), allBackends)
}

func TestDeviceSuiteOnSimWithoutVMM(t *testing.T) {
	// BackendAuto picks chunks where the device has no VMM.
	sd := sim.New(sim.Config{Capacity: giB, NoVMM: true})
	p := openPool(t, onSim(sd), Options{})
	require.Equal(t, BackendChunks, p.Backend())
	runDeviceSuite(t, simDevices(sim.Config{Capacity: 4 * giB, Shadow: true, NoVMM: true}),
		[]Backend{BackendChunks, BackendPassthrough})
}

func suiteAllocFree(t *testing.T, d testDevice, be Backend) {
	p := openPool(t, d, Options{Backend: be})
	require.Equal(t, be, p.Backend())
	sizes := []uint64{1, 255, 256, 257, 4 * kiB, 100*kiB + 3, miB, miB + 1, 3 * miB, 17 * miB}
	live := map[uintptr]uint64{}
	var ptrs []uintptr
	var want, requested uint64
	for _, n := range sizes {
		ptr, err := p.Alloc(n)
		require.NoError(t, err)
		require.Zero(t, ptr%256, "%d bytes at %#x: not 256-byte aligned", n, ptr)
		requireDisjoint(t, live, ptr, n)
		live[ptr] = n
		ptrs = append(ptrs, ptr)
		want += blockSizeOf(p, n)
		requested += n
		checkStep(t, p, d)
	}
	s := p.Stats()
	require.Equal(t, want, s.Allocated, "Allocated counts each block at its block size")
	require.Equal(t, want, s.Active)
	require.Equal(t, int64(len(sizes)), s.Allocations)
	require.GreaterOrEqual(t, s.Reserved, requested)

	for i, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
		require.ErrorIs(t, p.Free(ptr), ErrDoubleFree, "freeing %d bytes twice", sizes[i])
		checkStep(t, p, d)
	}
	s = p.Stats()
	require.Zero(t, s.Allocated)
	require.Zero(t, s.Allocations)
	require.Zero(t, s.Active)
	// With caches on, the peaks count blocks the caches hold as in use.
	require.GreaterOrEqual(t, s.AllocatedPeak, want)
	require.GreaterOrEqual(t, s.AllocationsPeak, int64(len(sizes)))
	require.Equal(t, uint64(len(sizes)), s.Allocs)
	require.Equal(t, uint64(len(sizes)), s.Frees)
}

func suitePitch(t *testing.T, d testDevice, be Backend) {
	p := openPool(t, d, Options{Backend: be})
	// The driver's pitch unit: the pitch of a one-byte row.
	probe, unit, err := d.MemAllocPitch(1, 1, 4)
	require.NoError(t, err)
	require.NoError(t, d.MemFree(probe))
	for _, w := range []uint64{1, 4, 511, 512, 513, 2052, 16000} {
		for _, h := range []uint64{1, 3, 64} {
			dptr, dpitch, err := d.MemAllocPitch(w, h, 4)
			require.NoError(t, err)
			require.NoError(t, d.MemFree(dptr))

			before := p.Stats()
			ptr, pitch, err := p.AllocPitch(w, h)
			require.NoError(t, err)
			require.Equal(t, dpitch, pitch, "pitch of a %d-byte row", w)
			require.Zero(t, ptr%uintptr(unit), "pitch allocation at %#x: not aligned to %d", ptr, unit)
			after := p.Stats()
			require.Equal(t, sizeClass(pitch*h), after.Allocated-before.Allocated, "%d × %d: Allocated counts pitch × height", w, h)
			require.Equal(t, int64(1), after.Allocations-before.Allocations)
			fillBlock(t, d, ptr, pitch*h, uint32(w<<8|h))
			expectFilled(t, d, ptr, pitch*h, uint32(w<<8|h))
			checkStep(t, p, d)
			require.NoError(t, p.Free(ptr))
			checkStep(t, p, d)
		}
	}
}

func suiteContents(t *testing.T, d testDevice, be Backend) {
	p := openPool(t, d, Options{Backend: be})
	type blk struct {
		ptr uintptr
		n   uint64
		v   uint32
	}
	var live []blk
	next := uint32(0x1000)
	add := func(ptr uintptr, n uint64) {
		next++
		fillBlock(t, d, ptr, n, next)
		live = append(live, blk{ptr, n, next})
	}
	verifyAll := func() {
		for _, b := range live {
			expectFilled(t, d, b.ptr, b.n, b.v)
		}
		checkStep(t, p, d)
	}
	for _, n := range []uint64{100, 4 * kiB, 64*kiB + 4, 700 * kiB, 2 * miB, 5*miB + 256, 8 * kiB, 300} {
		ptr, err := p.Alloc(n)
		require.NoError(t, err)
		add(ptr, n)
	}
	ptr, pitch, err := p.AllocPitch(2052, 33)
	require.NoError(t, err)
	add(ptr, pitch*33)
	verifyAll()

	// Free every other block, then fill the holes with new ones.
	kept := live[:0:0]
	for i, b := range live {
		if i%2 == 0 {
			expectFilled(t, d, b.ptr, b.n, b.v)
			require.NoError(t, p.Free(b.ptr))
		} else {
			kept = append(kept, b)
		}
	}
	live = kept
	verifyAll()
	for _, n := range []uint64{64, 4 * kiB, 96 * kiB, miB, 3 * miB} {
		ptr, err := p.Alloc(n)
		require.NoError(t, err)
		add(ptr, n)
		verifyAll()
	}
	for _, b := range live {
		expectFilled(t, d, b.ptr, b.n, b.v)
		require.NoError(t, p.Free(b.ptr))
	}
	checkStep(t, p, d)
}

func suiteTwoStreams(t *testing.T, d testDevice, be Backend) {
	ss := newStreams(t, d, 2)
	a, b := ss[0], ss[1]
	p := openPool(t, d, Options{Backend: be})
	const n = 2 * miB // above the caches' sizes: every request takes the index
	x, err := p.AllocOn(n, a)
	require.NoError(t, err)
	y, err := p.AllocOn(n, b)
	require.NoError(t, err)

	// Work on a, held where the device lets the test hold it.
	if d.sd != nil {
		require.NoError(t, d.sd.HoldStream(a))
	}
	require.NoError(t, d.MemsetD32Async(x, 0xaaaa, wordCount(n), a))
	require.NoError(t, p.FreeOn(x, a))
	require.Equal(t, n, p.Stats().Pending, "a block freed on a stream awaits its event")
	checkStep(t, p, d)

	x2, err := p.AllocOn(n, a)
	require.NoError(t, err)
	require.Equal(t, x, x2, "a request on the stream that freed a block reuses it at once")
	require.Zero(t, p.Stats().Pending)
	require.NoError(t, d.MemsetD32Async(x2, 0xaaab, wordCount(n), a))
	require.NoError(t, p.FreeOn(x2, a))

	z, err := p.AllocOn(n, b)
	require.NoError(t, err)
	requireDisjoint(t, map[uintptr]uint64{x: n}, z, n)
	require.NoError(t, d.MemsetD32Async(z, 0xbbbb, wordCount(n), b))
	checkStep(t, p, d)

	if d.sd != nil {
		require.NoError(t, d.sd.ReleaseStream(a))
	}
	require.NoError(t, d.StreamSynchronize(a))
	require.NoError(t, d.StreamSynchronize(b))
	expectFilled(t, d, z, n, 0xbbbb)
	require.NoError(t, p.FreeOn(z, b))
	require.NoError(t, p.FreeOn(y, b))
	_, err = p.Trim()
	require.NoError(t, err)
	checkStep(t, p, d)
	require.Zero(t, p.Stats().Reserved)
}

func suiteCapOOM(t *testing.T, d testDevice, be Backend) {
	p := openPool(t, d, Options{Backend: be, MaxBytes: 64 * miB})
	a, err := p.Alloc(32 * miB)
	require.NoError(t, err)
	checkStep(t, p, d)

	before := p.Stats()
	_, err = p.Alloc(giB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	for _, part := range []string{"request of 1.00 GiB (1073741824 bytes)", "allocated", "reserved", "cap 64.00 MiB", "largest block that could be allocated", "device free"} {
		require.Contains(t, err.Error(), part)
	}
	after := p.Stats()
	require.Equal(t, liveState(before), liveState(after))
	require.Equal(t, before.OutOfMemory+1, after.OutOfMemory)
	require.LessOrEqual(t, after.Reserved, 64*miB)
	checkStep(t, p, d)

	// What fits under the cap still fits.
	c, err := p.Alloc(16 * miB)
	require.NoError(t, err)
	require.LessOrEqual(t, p.Stats().Reserved, 64*miB)
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Free(c))
	checkStep(t, p, d)
}

func suiteBeyondDevice(t *testing.T, d testDevice, be Backend) {
	_, total, err := d.MemGetInfo()
	require.NoError(t, err)
	// A VMM pool with a range of the device's size can never serve more:
	// it refuses at once rather than mapping the whole GPU first, as out
	// of memory, as every backend does.
	p := openPool(t, d, Options{Backend: be, VirtualSize: total})
	keep, err := p.Alloc(miB)
	require.NoError(t, err)
	before := p.Stats()
	_, err = p.Alloc(2 * total)
	require.ErrorIs(t, err, ErrOutOfMemory)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "the driver's out-of-memory error is wrapped")
	require.Equal(t, before.OutOfMemory+1, p.Stats().OutOfMemory)
	if be == BackendVMM {
		require.Equal(t, withoutCounters(before), withoutCounters(p.Stats()), "refused before any work")
		// Above a VirtualSize set below the device's memory, but within
		// that memory: too large for this pool.
		// (Not openPool: its cleanup would find p's memory still held.)
		small, err := New(d.Device, Options{Backend: be, VirtualSize: total / 4})
		require.NoError(t, err)
		t.Cleanup(func() { _ = small.Close() })
		_, err = small.Alloc(total / 2)
		require.ErrorIs(t, err, ErrTooLarge)
		require.Zero(t, small.Stats().OutOfMemory)
		require.NoError(t, small.Close())
	}
	require.Equal(t, liveState(before), liveState(p.Stats()))
	checkStep(t, p, d)
	require.NoError(t, p.Free(keep))
}

func suiteTrimClose(t *testing.T, d testDevice, be Backend) {
	p := openPool(t, d, Options{Backend: be})
	var ptrs []uintptr
	for _, n := range []uint64{4 * kiB, 4 * kiB, 64 * kiB, 3 * miB, 300 * kiB, 9 * miB} {
		ptr, err := p.Alloc(n)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	keep := ptrs[len(ptrs)-1]
	for _, ptr := range ptrs[:len(ptrs)-1] {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
	before := p.Stats()
	n, err := p.Trim()
	require.NoError(t, err)
	after := p.Stats()
	checkStep(t, p, d)
	require.Zero(t, after.Cached, "Trim empties the caches")
	require.Equal(t, before.Reserved-after.Reserved, n, "Trim reports the bytes it released")
	if be != BackendPassthrough {
		require.Equal(t, blockSizeOf(p, 9*miB), after.Allocated)
		// A chunk pool on a large GPU takes one chunk for all of these
		// (GrowFraction of free memory), which the live block keeps.
		require.LessOrEqual(t, after.Reserved, before.Reserved)
	}

	require.NoError(t, p.Free(keep))
	n, err = p.Trim()
	require.NoError(t, err)
	require.Zero(t, p.Stats().Reserved, "with nothing live, Trim returns everything")
	checkStep(t, p, d)
	_ = n

	// Close returns live memory too.
	live, err := p.Alloc(5 * miB)
	require.NoError(t, err)
	small, err := p.Alloc(kiB)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	if d.sd != nil {
		require.Zero(t, d.sd.Mapped())
	}
	require.ErrorIs(t, p.Close(), ErrClosed)
	require.ErrorIs(t, p.Free(live), ErrClosed)
	require.ErrorIs(t, p.Free(small), ErrClosed)
	_, err = p.Alloc(kiB)
	require.ErrorIs(t, err, ErrClosed)
}
