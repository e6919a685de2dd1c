package pool_test

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
	"github.com/stretchr/testify/require"
)

// A free top that holds the request but sits behind more than
// tlsf.FitScan smaller blocks of its list serves it: before, best fit
// missed it, the heap did not grow (the top held the request already),
// and the request failed on an empty device.
func TestAFreeTopBehindMoreThanFitScanBlocksServes(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 1 << 30})
	p, err := pool.New(sd, pool.Options{Backend: pool.BackendVMM})
	require.NoError(t, err)
	defer p.Close()
	const x = 1 << 20 // the list [1 MiB, 1 MiB+16 KiB)
	var xs []uintptr
	for range 65 {
		a, err := p.Alloc(x)
		require.NoError(t, err)
		_, err = p.Alloc(256) // a separator
		require.NoError(t, err)
		xs = append(xs, a)
	}
	const top = x + 8<<10 // in the same list, holds the request
	for free := p.Stats().IndexFree; free != top; free = p.Stats().IndexFree {
		size := free - top
		if free < top {
			size = free + 512<<10
		}
		_, err := p.Alloc(size)
		require.NoError(t, err)
	}
	for _, a := range xs {
		require.NoError(t, p.Free(a))
	}
	_, err = p.Alloc(x + 256)
	require.NoError(t, err)
	require.NoError(t, p.Check())
}

// A growth leaves the device the memory the released pages under the free
// top need: before, a GrowFraction growth took it, and the request failed
// with room for all it needed.
func TestAGrowthLeavesTheTopsReleasedPagesTheirMemory(t *testing.T) {
	const mib = 1 << 20
	sd := sim.New(sim.Config{Capacity: 64 * mib})
	p, err := pool.New(sd, pool.Options{Backend: pool.BackendVMM, GrowFraction: 0.5,
		Cache: pool.CacheOptions{Disable: true}, NoScavenger: true})
	require.NoError(t, err)
	defer p.Close()
	a, err := p.Alloc(30 * mib)
	require.NoError(t, err)
	b, err := p.Alloc(16 * mib)
	require.NoError(t, err)
	require.NoError(t, p.Free(b))
	_, err = p.Trim() // the free top [30, 48) MiB: 16 MiB released
	require.NoError(t, err)
	require.NoError(t, sd.NewProcess().Occupy(12*mib)) // 20 MiB free
	// 2 MiB of growth and the top's 16 MiB: 18 of the 20 MiB free.
	c, err := p.Alloc(20 * mib)
	require.NoError(t, err)
	require.NoError(t, p.Free(c))
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Check())
}

// A mapping that fails part way keeps the pool's spare handles: before,
// its undo released them to the driver uncounted, so that a failed
// request lowered Reserved with no release counted (Reserved +
// ReleasedBytes fell) and gave a full device's memory to a neighbour.
func TestAFailedBackingKeepsTheSpares(t *testing.T) {
	const mib = 1 << 20
	sd := sim.New(sim.Config{Capacity: 32 * mib})
	p, err := pool.New(sd, pool.Options{Backend: pool.BackendVMM, MaxBytes: 64 * mib, // one-page handles
		Cache: pool.CacheOptions{Disable: true}, NoScavenger: true})
	require.NoError(t, err)
	defer p.Close()
	var b [12]uintptr
	for i := range b {
		b[i], err = p.Alloc(2 * mib)
		require.NoError(t, err)
	}
	for _, i := range []int{6, 8, 10} {
		require.NoError(t, p.Free(b[i]))
	}
	require.NoError(t, sd.NewProcess().Occupy(8*mib)) // the device full
	_, err = p.Alloc(4 * mib)                         // moves pages 6, 8, 10 to the spares, maps 2
	require.NoError(t, err)
	require.NoError(t, p.Free(b[7]))
	require.NoError(t, p.Free(b[9])) // a free block over pages 6 to 10, holes at 6, 8, 10; one spare
	before := p.Stats()
	_, err = p.Alloc(10 * mib) // maps the spare at page 6; the create for page 8 fails
	require.ErrorIs(t, err, pool.ErrOutOfMemory)
	after := p.Stats()
	require.Equal(t, before.Reserved, after.Reserved, "a failed request changes no reserved memory")
	require.Equal(t, before.ReleasedBytes, after.ReleasedBytes)
	require.NoError(t, p.Check())
}

// holesOnAFullDevice makes a pool of twelve 2 MiB blocks with one-page
// handles, frees the blocks free names and trims (released pages under
// free blocks, no spares), fills the device to one page from another
// process, frees the blocks after names (joining free blocks over the
// holes) and resets the peaks. It returns the pool, its device and a
// function that gives the other process's memory back.
func holesOnAFullDevice(t *testing.T, free []int, after ...int) (*pool.Pool, *sim.Device, func()) {
	const mib = 1 << 20
	sd := sim.New(sim.Config{Capacity: 32 * mib})
	p, err := pool.New(sd, pool.Options{Backend: pool.BackendVMM, MaxBytes: 64 * mib,
		Cache: pool.CacheOptions{Disable: true}, NoScavenger: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	var b [12]uintptr
	for i := range b {
		b[i], err = p.Alloc(2 * mib)
		require.NoError(t, err)
	}
	for _, i := range free {
		require.NoError(t, p.Free(b[i]))
	}
	_, err = p.Trim()
	require.NoError(t, err)
	f, _, err := sd.MemGetInfo()
	require.NoError(t, err)
	other := sd.NewProcess()
	require.NoError(t, other.Occupy(f-2*mib))
	for _, i := range after {
		require.NoError(t, p.Free(b[i]))
	}
	p.ResetPeaks()
	return p, sd, func() { other.Vacate(f - 2*mib) }
}

// A backing that fails after an earlier run of it created a handle (no
// spares to take) changes neither reserved memory, nor its peak, nor the
// releases counted: before, the undo kept the created handle as a spare
// (reserved and its peak rose), or released it counted as a release.
func TestAFailedBackingKeepsNoHandleItCreated(t *testing.T) {
	for _, tc := range []struct {
		name        string
		free, after []int
		size        uint64
	}{
		{"a later run refused", []int{6, 8, 10}, []int{7, 9}, 10 << 20}, // page 6 created, page 8 refused
		{"its own run refused", []int{6, 7}, []int{8}, 6 << 20},         // page 6 created, page 7 refused
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, _, _ := holesOnAFullDevice(t, tc.free, tc.after...)
			before := p.Stats()
			_, err := p.Alloc(tc.size)
			require.ErrorIs(t, err, pool.ErrOutOfMemory)
			after := p.Stats()
			require.Equal(t, before.Reserved, after.Reserved)
			require.Equal(t, before.ReservedPeak, after.ReservedPeak, "a failed request raises no peak")
			require.Equal(t, before.Releases, after.Releases, "a failed request counts no release")
			require.Equal(t, before.ReleasedBytes, after.ReleasedBytes)
			require.NoError(t, p.Check())
		})
	}
}

// A backing whose rollback cannot unmap an earlier run's page leaves it
// as a stray, counted as a hole still: before, the count fell one short,
// and a later block was handed out on the page once the stray was
// unmapped.
func TestARollbackLeavingAStrayKeepsItAHole(t *testing.T) {
	const mib = 1 << 20
	// A free block over pages 6 to 10, holes at 6, 8, 10.
	p, sd, vacate := holesOnAFullDevice(t, []int{6, 8, 10}, 7, 9)
	sd.FailNth(device.CallMemUnmap, 1, nil) // page 6 created, page 8 refused; the undo of 6 fails
	_, err := p.Alloc(10 * mib)
	require.ErrorIs(t, err, pool.ErrOutOfMemory)
	require.NoError(t, p.Check())
	vacate()
	for i := range 16 {
		a, err := p.Alloc(2 * mib)
		if err != nil {
			break
		}
		require.NoError(t, sd.MemsetD32(a, 0xabcd, 2*mib/4), "block %d at %#x", i, a)
	}
	require.Empty(t, sd.Violations())
	require.NoError(t, p.Check())
}

// A move goes on past an orphan whose release the driver refuses again:
// a growth under ReleaseFraction on a device with plenty of room serves
// the request (before the fix of the orphans' release, it failed with the
// orphan's error).
func TestAMoveGoesOnPastAStuckOrphan(t *testing.T) {
	const mib = 1 << 20
	sd := sim.New(sim.Config{Capacity: 1 << 30})
	p, err := pool.New(sd, pool.Options{Backend: pool.BackendVMM, ReleaseFraction: 0.1,
		Cache: pool.CacheOptions{Disable: true}, NoScavenger: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = p.Close() })
	var x [8]uintptr
	for i := range x {
		x[i], err = p.Alloc(32 * mib)
		require.NoError(t, err)
	}
	for _, i := range []int{1, 3, 5} {
		require.NoError(t, p.Free(x[i]))
	}
	sd.FailRate(device.CallMemRelease, 1, nil)
	_, err = p.Trim()
	sd.ClearFaults()
	require.NoError(t, err) // the released handles are orphans: still reserved
	require.Equal(t, uint64(256*mib), p.Stats().Reserved)
	for _, i := range []int{1, 3, 5} { // map the holes again, then free: free mapped memory
		x[i], err = p.Alloc(32 * mib)
		require.NoError(t, err)
	}
	for _, i := range []int{1, 3, 5} {
		require.NoError(t, p.Free(x[i]))
	}
	p.ResetPeaks()
	require.Greater(t, p.Stats().Reserved, uint64(256*mib), "orphans left")
	free, _, err := sd.MemGetInfo()
	require.NoError(t, err)
	sd.FailNth(device.CallMemRelease, 1, nil) // an orphan's release fails again
	_, err = p.Alloc(64 * mib)
	require.NoError(t, err, "the device has %d MiB free", free/mib)
	require.NoError(t, p.Check())
}
