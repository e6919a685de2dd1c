package pool

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shareJob is one simulated process of a sharing test: a pool and a
// workload that wants more than its share.
type shareJob struct {
	p      *Pool
	d      testDevice
	rng    *rand.Rand
	live   []uintptr
	sizes  map[uintptr]uint64
	bytes  uint64 // live bytes
	target uint64 // live bytes it wants
	ooms   int
	// failedUnder counts failed allocations while live bytes, the request
	// included, were within 90% of the share.
	failedUnder int
	share       uint64
}

func newShareJob(t *testing.T, d testDevice, o Options, seed uint64, share, target uint64) *shareJob {
	return &shareJob{p: openPool(t, d, o), d: d, rng: rand.New(rand.NewPCG(seed, 7)),
		sizes: map[uintptr]uint64{}, target: target, share: share}
}

// step frees a random block when over the target (or one time in three),
// else allocates a block of 2 to 64 MiB (log-uniform).
func (j *shareJob) step(t *testing.T) {
	if len(j.live) > 0 && (j.bytes >= j.target || j.rng.IntN(3) == 0) {
		i := j.rng.IntN(len(j.live))
		ptr := j.live[i]
		require.NoError(t, j.p.Free(ptr))
		j.bytes -= j.sizes[ptr]
		delete(j.sizes, ptr)
		j.live[i] = j.live[len(j.live)-1]
		j.live = j.live[:len(j.live)-1]
		return
	}
	n := uint64(2*miB) << j.rng.IntN(6)
	ptr, err := j.p.Alloc(n)
	if err != nil {
		require.ErrorIs(t, err, ErrOutOfMemory)
		j.ooms++
		if float64(j.bytes+n) <= 0.9*float64(j.share) {
			j.failedUnder++
			if j.failedUnder == 1 {
				t.Logf("failed at %d MiB live + %d MiB: %v", j.bytes/miB, n/miB, err)
			}
		}
		return
	}
	j.live = append(j.live, ptr)
	j.sizes[ptr] = n
	j.bytes += n
}

func (j *shareJob) freeAll(t *testing.T) {
	for _, ptr := range j.live {
		require.NoError(t, j.p.Free(ptr))
	}
	j.live, j.bytes = nil, 0
}

// shareRatio is max / min of the jobs' peak reserved bytes.
func shareRatio(jobs []*shareJob) float64 {
	lo, hi := math.Inf(1), 0.0
	for _, j := range jobs {
		r := float64(j.p.Stats().ReservedPeak)
		lo, hi = min(lo, r), max(hi, r)
	}
	return hi / lo
}

// K identical processes with MaxFraction 1/K, oversubscribed 1.5×, end
// with equal shares whether they start together or one after another, and
// at most 1% of a VMM pool's failures come while its live bytes are
// within 90% of its share.
func TestKProcessesGetEqualShares(t *testing.T) {
	const capacity = 2 * giB
	for _, k := range []int{2, 3, 4} {
		for _, staggered := range []bool{false, true} {
			for _, be := range []Backend{BackendVMM, BackendChunks} {
				t.Run(fmt.Sprintf("K=%d/staggered=%v/%v", k, staggered, be), func(t *testing.T) {
					first := sim.New(sim.Config{Capacity: capacity})
					share := uint64(capacity) / uint64(k)
					jobs := make([]*shareJob, k)
					for i := range jobs {
						sd := first
						if i > 0 {
							sd = first.NewProcess()
						}
						jobs[i] = newShareJob(t, onSim(sd), Options{Backend: be, MaxFraction: 1 / float64(k)},
							uint64(i+1), share, share*3/2)
					}
					const steps = 1500
					if staggered {
						// Each starts when those before it have run a while
						// and hold their shares.
						for i, j := range jobs {
							for range steps {
								for _, prev := range jobs[:i+1] {
									prev.step(t)
								}
								_ = j
							}
						}
					} else {
						for range steps {
							for _, j := range jobs {
								j.step(t)
							}
						}
					}
					for i, j := range jobs {
						st := j.p.Stats()
						t.Logf("proc %d: peak reserved %d MiB of share %d MiB, %d OOM, %d failed under 90%%, calls %v",
							i, st.ReservedPeak/miB, share/miB, j.ooms, j.failedUnder, st.DeviceCalls)
						assert.LessOrEqual(t, st.ReservedPeak, share, "proc %d: within its cap", i)
						assert.Positive(t, j.ooms, "proc %d: oversubscribed, some requests fail", i)
						checkStep(t, j.p, j.d)
					}
					assert.LessOrEqual(t, shareRatio(jobs), 1.10, "max share / min share")
					if be == BackendVMM {
						// Chunk pools cannot move memory between chunks: a
						// request may fail for want of a contiguous chunk.
						// A VMM pool under pressure maps large handles
						// (Pool.setFine), which move only whole: rarely, a
						// request within 90% of the share fails.
						for i, j := range jobs {
							assert.LessOrEqual(t, j.failedUnder, j.ooms/100, "proc %d failed while within 90%% of its share", i)
						}
					}
					for _, j := range jobs {
						j.freeAll(t)
						checkStep(t, j.p, j.d)
					}
				})
			}
		}
	}
}

// A process that went idle holding unused memory (no cap) starves a
// neighbour until that memory is returned (Trim here, IdleRelease off;
// idle_test.go has the scavenger's rule). The neighbour's failures are clean and cheap, and
// its first request after the return succeeds: the remembered failure
// does not outlive the memory coming back.
func TestAnIdleNeighboursMemoryServesAfterItIsReturned(t *testing.T) {
	for _, be := range []Backend{BackendVMM, BackendChunks} {
		t.Run(be.String(), func(t *testing.T) {
			sa := sim.New(sim.Config{Capacity: giB})
			da, db := onSim(sa), onSim(sa.NewProcess())
			a := openPool(t, da, Options{Backend: be})
			b := openPool(t, db, Options{Backend: be, MaxFraction: 0.5})
			var ptrs []uintptr
			for {
				ptr, err := a.Alloc(64 * miB)
				if err != nil {
					break
				}
				ptrs = append(ptrs, ptr)
			}
			for _, ptr := range ptrs {
				require.NoError(t, a.Free(ptr))
			}
			require.Positive(t, a.Stats().Reserved, "idle, holding its memory")

			before := b.Stats()
			for range 5 {
				_, err := b.Alloc(128 * miB)
				require.ErrorIs(t, err, ErrOutOfMemory)
				require.ErrorIs(t, err, device.ErrOutOfMemory, "the device, not the cap, refused")
			}
			after := b.Stats()
			assert.Equal(t, withoutCounters(before), withoutCounters(after), "failures change nothing")
			assert.Equal(t, before.Retries+1, after.Retries, "the full out-of-memory path ran once; the repeats were remembered")
			assert.LessOrEqual(t, after.DeviceCalls.Total()-before.DeviceCalls.Total(), uint64(10),
				"five failures, few driver calls: %v", after.DeviceCalls)
			checkStep(t, b, db)

			_, err := a.Trim()
			require.NoError(t, err)
			ptr, err := b.Alloc(128 * miB)
			require.NoError(t, err, "the neighbour's memory came back")
			ptr2, err := b.Alloc(384 * miB)
			require.NoError(t, err, "up to the share")
			_, err = b.Alloc(2 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory, "and no further: the cap")
			require.NotErrorIs(t, err, device.ErrOutOfMemory)
			checkStep(t, b, db)
			require.NoError(t, b.Free(ptr))
			require.NoError(t, b.Free(ptr2))
		})
	}
}

// A remembered failure is forgotten at the next free: the request after
// it runs the whole path again.
func TestARememberedFailureIsForgottenAfterAFree(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{MaxBytes: 256 * miB})
	a, err := p.Alloc(200 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(40 * miB)
	require.NoError(t, err)
	for range 3 {
		_, err = p.Alloc(100 * miB)
		require.ErrorIs(t, err, ErrOutOfMemory)
	}
	assert.Equal(t, uint64(1), p.Stats().Retries)
	_, err = p.Alloc(60 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory, "a smaller request runs the path again")
	assert.Equal(t, uint64(2), p.Stats().Retries)
	require.NoError(t, p.Free(b))
	_, err = p.Alloc(100 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Equal(t, uint64(3), p.Stats().Retries, "a free clears the memory")
	c, err := p.Alloc(50 * miB)
	require.NoError(t, err)
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Free(c))
}

// Frees into the per-P caches clear the memory of a failure as frees
// under the lock do: a pool whose every block went back to the caches
// serves the next request that fits, which runs the path that flushes
// them. (The memory counted lock-held frees only, and the request failed
// from it up to oomMemoSkips times in a row.)
func TestARememberedFailureIsForgottenAfterAFreeIntoACache(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{MaxBytes: 2 * miB, Cache: CacheOptions{Eager: true}})
	var small []uintptr
	for {
		ptr, err := p.Alloc(4096)
		if err != nil {
			require.ErrorIs(t, err, ErrOutOfMemory)
			break
		}
		small = append(small, ptr)
	}
	require.NotEmpty(t, small)
	for _, ptr := range small {
		require.NoError(t, p.Free(ptr))
	}
	st := p.Stats()
	require.Zero(t, st.Allocations)
	require.NotZero(t, st.Cached, "the frees went to the caches")
	big, err := p.Alloc(miB)
	require.NoError(t, err, "every block is free")
	checkStep(t, p, d)
	require.NoError(t, p.Free(big))
}

// Under the cap, the out-of-memory path moves the pages a request lacks
// instead of returning every unused page to the driver.
func TestTheOutOfMemoryPathMovesOnlyWhatIsNeeded(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 256 * miB, Cache: CacheOptions{Disable: true}})
	// Fill the cap with 32 blocks of 8 MiB, free every other one: 128 MiB
	// free in 8 MiB pieces, none of them 16 MiB long.
	ptrs := allocBlocks(t, p, 32, 8*miB)
	freeEveryOther(t, p, ptrs)
	before := p.Stats()
	big, err := p.Alloc(16 * miB)
	require.NoError(t, err, "gathered from the free pieces")
	after := p.Stats()
	assert.Zero(t, after.Releases-before.Releases, "nothing went back to the driver")
	assert.LessOrEqual(t, after.RecycledBytes-before.RecycledBytes, uint64(16*miB+2*miB), "moved what it needed")
	assert.Zero(t, after.DeviceCalls[device.CallMemCreate]-before.DeviceCalls[device.CallMemCreate], "no new physical memory")
	assert.LessOrEqual(t, after.Reserved, uint64(256*miB))
	require.NoError(t, sd.MemsetD32(big, 1, wordCount(16*miB)))
	checkStep(t, p, d)
}

// Above 90% of the cap, pages move only while no allocation failed in the
// last recyclePressureAllocs allocations: an oversubscribed job fails fast
// instead of gathering scattered pages for every request.
func TestMayRecycleUnderPressure(t *testing.T) {
	p := openPool(t, onSim(sim.New(sim.Config{Capacity: giB})), Options{MaxBytes: 100 * miB, Cache: CacheOptions{Disable: true}})
	p.mu.Lock()
	defer p.mu.Unlock()
	saved := p.c
	defer func() { p.c = saved }()
	p.c.active = 85 * miB
	require.True(t, p.mayRecycle(4*miB), "89% of the cap")
	require.True(t, p.mayRecycle(10*miB), "95% of the cap, no failure yet")
	require.False(t, p.mayRecycle(20*miB), "above the cap")
	p.rememberOOM(50 * miB)
	require.True(t, p.mayRecycle(4*miB), "below 90%: always")
	require.False(t, p.mayRecycle(10*miB), "95% right after a failure")
	p.c.allocs += recyclePressureAllocs
	require.True(t, p.mayRecycle(10*miB), "the failure is old")
}

// pressuredPool makes a VMM pool on a simulated GPU of 1 GiB, capped at
// 256 MiB, caches and scavenger off, with blocks of 32 MiB up to the cap,
// put under pressure (as after a failed allocation).
func pressuredPool(t *testing.T) (*Pool, testDevice, *sim.Device, []uintptr) {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 256 * miB, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	ptrs := allocBlocks(t, p, 8, 32*miB)
	p.mu.Lock()
	p.pressure = p.c.allocs + 1
	p.mu.Unlock()
	return p, d, sd, ptrs
}

// A capped pool under pressure (an allocation failed lately) moves memory
// in large handles: where the block found lies on released pages and the
// device is full, the one-page handles it takes from under other free
// blocks are released, and the block's pages are mapped as one handle,
// not one cuMemMap per 2 MiB page.
func TestUnderPressureMemoryMovesInLargeHandles(t *testing.T) {
	p, d, sd, ptrs := pressuredPool(t)
	// The bottom 64 MiB free and released (holes), two more 32 MiB free
	// and mapped.
	require.NoError(t, p.Free(ptrs[0]))
	require.NoError(t, p.Free(ptrs[1]))
	_, err := p.Trim()
	require.NoError(t, err)
	require.NoError(t, p.Free(ptrs[3]))
	require.NoError(t, p.Free(ptrs[5]))
	free, _, err := sd.MemGetInfo()
	require.NoError(t, err)
	require.NoError(t, sd.Occupy(free)) // a neighbour holds the rest
	t.Cleanup(func() { sd.Vacate(free) })
	before := p.Stats()
	big, err := p.Alloc(64 * miB)
	require.NoError(t, err, "within 90% of the cap: the free pieces' pages moved under the released block")
	after := p.Stats()
	calls := func(c device.Call) uint64 { return after.DeviceCalls[c] - before.DeviceCalls[c] }
	assert.LessOrEqual(t, calls(device.CallMemMap), uint64(3), "64 MiB mapped as a few handles, not 32 pages: %v", after.DeviceCalls)
	assert.LessOrEqual(t, calls(device.CallMemCreate), uint64(4), "a refused one, then a few")
	assert.GreaterOrEqual(t, calls(device.CallMemRelease), uint64(32), "the 32 one-page handles moved were released: %v", after.DeviceCalls)
	assert.LessOrEqual(t, after.Reserved, uint64(256*miB))
	require.NoError(t, sd.MemsetD32(big, 1, wordCount(64*miB)))
	checkStep(t, p, d)
}

// The last move of the out-of-memory path under pressure, for a request
// within 90% of the cap that no free block is long enough for
// (releaseFor), keeps the memory: the one-page handles it unmaps stay
// spares and are mapped again under the block grown at the top, no handle
// released or created, also while a neighbour takes whatever the device
// has free whenever the pool creates a handle. (They used to be released,
// to be replaced by one large handle, and a neighbour that took the
// memory in between made the request fail within its share.)
func TestUnderPressureMemoryMovedForARequestWithinTheShareStaysInThePool(t *testing.T) {
	for _, neighbour := range []bool{false, true} {
		t.Run(fmt.Sprintf("neighbour=%v", neighbour), func(t *testing.T) {
			p, d, sd, ptrs := pressuredPool(t)
			freeEveryOther(t, p, ptrs) // 128 MiB free in 32 MiB pieces
			var taken uint64
			if neighbour {
				sd.SetHook(func(c device.Call) {
					if c != device.CallMemCreate {
						return
					}
					if free, _, err := sd.MemGetInfo(); err == nil && free > 0 && sd.Occupy(free) == nil {
						taken += free
					}
				})
				defer func() { sd.SetHook(nil); sd.Vacate(taken) }()
			}
			before := p.Stats()
			big, err := p.Alloc(64 * miB)
			require.NoError(t, err, "128 MiB in use of a 256 MiB cap: served from its own memory")
			after := p.Stats()
			calls := func(c device.Call) uint64 { return after.DeviceCalls[c] - before.DeviceCalls[c] }
			assert.Zero(t, calls(device.CallMemCreate), "no new handle: %v", after.DeviceCalls)
			assert.Zero(t, calls(device.CallMemRelease), "no memory left the pool")
			assert.Greater(t, after.RecycledBytes, before.RecycledBytes, "moved from under the free pieces")
			assert.Equal(t, before.Reserved, after.Reserved)
			require.NoError(t, sd.MemsetD32(big, 1, wordCount(64*miB)))
			checkStep(t, p, d)
		})
	}
}

// allocBlocks allocates n blocks of size bytes from p.
func allocBlocks(t *testing.T, p *Pool, n int, size uint64) []uintptr {
	t.Helper()
	ptrs := make([]uintptr, n)
	for i := range ptrs {
		var err error
		ptrs[i], err = p.Alloc(size)
		require.NoError(t, err)
	}
	return ptrs
}

// freeEveryOther frees ptrs[0], ptrs[2], ...
func freeEveryOther(t *testing.T, p *Pool, ptrs []uintptr) {
	t.Helper()
	for i := 0; i < len(ptrs); i += 2 {
		require.NoError(t, p.Free(ptrs[i]))
	}
}

// blocksMappedUnderPressure makes a VMM pool capped at capBytes, caches
// and scavenger off, allocates blocks of 96, 32, 96 and 32 MiB while it
// is under pressure (as after a failed allocation: large handles), and
// returns with the pressure over (as recyclePressureAllocs allocations
// later).
func blocksMappedUnderPressure(t *testing.T, capBytes uint64) (*Pool, testDevice, *sim.Device, []uintptr) {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: capBytes, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	p.mu.Lock()
	p.pressure = p.c.allocs + 1
	p.mu.Unlock()
	var ptrs []uintptr
	for _, n := range []uint64{96, 32, 96, 32} {
		ptr, err := p.Alloc(n * miB)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	p.mu.Lock()
	p.pressure = 0
	p.mu.Unlock()
	return p, d, sd, ptrs
}

// Large handles mapped under pressure still move once the pressure is
// over (the pool maps one-page handles again): the out-of-memory path
// moves them (as spares mapped again, or released) rather than leaving
// them stranded, and the request is served.
func TestLargeHandlesFromPressureMoveAfterIt(t *testing.T) {
	p, d, sd, ptrs := blocksMappedUnderPressure(t, 256*miB)
	freeEveryOther(t, p, ptrs)
	before := p.Stats()
	big, err := p.Alloc(128 * miB)
	require.NoError(t, err, "192 MiB in use of a 256 MiB cap: the 96 MiB handles moved")
	after := p.Stats()
	moved := after.RecycledBytes + after.ReleasedBytes - before.RecycledBytes - before.ReleasedBytes
	assert.Positive(t, moved, "the large handles moved (as spares mapped again, or back to the driver)")
	assert.LessOrEqual(t, after.Reserved, uint64(256*miB))
	require.NoError(t, sd.MemsetD32(big, 1, wordCount(128*miB)))
	checkStep(t, p, d)
}

// A remembered failure fails at most oomMemoSkips requests in a row
// without a free: then the whole out-of-memory path runs again.
func TestARememberedFailureIsRetriedAfterSkips(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 64 * miB, Cache: CacheOptions{Disable: true}})
	ptr, err := p.Alloc(48 * miB)
	require.NoError(t, err)
	retries := p.Stats().Retries
	for range 2*(oomMemoSkips+1) + 1 {
		_, err := p.Alloc(32 * miB)
		require.ErrorIs(t, err, ErrOutOfMemory)
	}
	assert.Equal(t, retries+3, p.Stats().Retries, "the whole path ran once, then after each %d skips", oomMemoSkips)
	require.NoError(t, p.Free(ptr))
	checkStep(t, p, d)
}

// Under pressure a capped pool maps large handles; moved, they become
// spares and are mapped again where they fit, with no new physical
// allocation for them: at its cap, with a 96 MiB block freed between two
// live ones, a request a little larger than it (a size class up, so not
// placed there) moves the freed block's 96 MiB handle to the top of the
// heap and maps it there; only its one extra page is created.
func TestMovedLargeHandlesAreMappedAgain(t *testing.T) {
	p, d, sd, ptrs := blocksMappedUnderPressure(t, 260*miB)
	require.NoError(t, p.Free(ptrs[2]))
	before := p.Stats()
	ptr, err := p.Alloc(96*miB + 1024)
	require.NoError(t, err)
	after := p.Stats()
	calls := func(c device.Call) uint64 { return after.DeviceCalls[c] - before.DeviceCalls[c] }
	assert.LessOrEqual(t, calls(device.CallMemCreate), uint64(1), "one page created, the 96 MiB handle moved")
	assert.Zero(t, calls(device.CallMemRelease), "nothing released")
	assert.LessOrEqual(t, after.Reserved, uint64(260*miB))
	require.NoError(t, sd.MemsetD32(ptr, 1, wordCount(96*miB)))
	checkStep(t, p, d)
}

// The 90% rule (mayRecycle) is of the bytes callers asked for: a pool
// under pressure counts blocks at their size class, up to 1/64 more, so
// it still moves pages for a request that leaves its rounded bytes a
// little above 90% of the cap, and not past 90% × (1 + 1/64).
// Good fit rounds blocks up to a size class: the 90% rule allows for it.
// (Best fit rounds to 256 bytes and counts as callers do.)
func TestTheNinetyPercentRuleAllowsForRounding(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, GoodFit: true, MaxBytes: giB, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	p.mu.Lock()
	defer p.mu.Unlock()
	active := p.c.active
	defer func() { p.c.active = active }()
	p.c.active = 900 * miB // 90% of the cap and more, rounded
	const size = 30 * miB
	require.True(t, p.mayRecycle(size), "no failure lately: always")
	p.pressure = p.c.allocs + 1
	defer func() { p.pressure = 0 }()
	assert.True(t, p.mayRecycle(size), "930 MiB rounded: within 90% of 1024 MiB as callers count")
	p.c.active = 910 * miB
	assert.False(t, p.mayRecycle(size), "940 MiB rounded: above 90% × (1 + 1/64)")
}

// poolOnHoles makes a VMM pool on a simulated GPU of 1 GiB, MaxFraction
// fraction (0: none), caches and scavenger off, whose heap has mapped
// 256 MiB and returned it: the range stays, in holes.
func poolOnHoles(t *testing.T, fraction float64) (*Pool, testDevice, *sim.Device) {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: giB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, MaxFraction: fraction, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	for _, ptr := range allocBlocks(t, p, 4, 64*miB) {
		require.NoError(t, p.Free(ptr))
	}
	_, err := p.Trim()
	require.NoError(t, err)
	return p, d, sd
}

// After the driver refuses a cuMemCreate, the pool treats the device as
// full: holes under a block are not backed with new memory (no
// cuMemCreate) while cuMemGetInfo reports too little free, and are again
// once it reports room.
func TestAFullDeviceIsNotAskedAgain(t *testing.T) {
	p, d, sd := poolOnHoles(t, 0.5)
	free, _, err := sd.MemGetInfo()
	require.NoError(t, err)
	require.NoError(t, sd.Occupy(free), "a neighbour takes the rest of the device")

	creates := func() uint64 { return p.Stats().DeviceCalls[device.CallMemCreate] }
	_, err = p.Alloc(64 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	checkStep(t, p, d)
	p.mu.Lock()
	full := p.full.on
	p.mu.Unlock()
	require.True(t, full, "the refusal is remembered")

	before := creates()
	for _, n := range []uint64{32, 16, 8} { // smaller each time: the memo does not skip them
		_, err = p.Alloc(n * miB)
		require.ErrorIs(t, err, ErrOutOfMemory)
	}
	assert.Equal(t, before, creates(), "a full device is not asked for memory")
	checkStep(t, p, d)

	sd.Vacate(free)
	ptr, err := p.Alloc(64 * miB)
	require.NoError(t, err, "room again: the holes are backed")
	assert.Greater(t, creates(), before)
	require.NoError(t, sd.MemsetD32(ptr, 1, wordCount(64*miB)))
	require.NoError(t, p.Free(ptr))
	checkStep(t, p, d)

	// While the device was found full, a request within 90% of the cap
	// that finds room grows and leaves the limit; one beyond it that finds
	// room lifts the limit.
	setFull := func() {
		p.mu.Lock()
		p.full.on, p.full.limit, p.full.skips = true, p.reserved(), 0
		p.mu.Unlock()
	}
	isFull := func() bool {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.full.on
	}
	setFull()
	big, err := p.Alloc(400 * miB) // 78% of the 512 MiB cap: within
	require.NoError(t, err)
	assert.True(t, isFull(), "a request within 90% leaves the limit")
	more, err := p.Alloc(80 * miB) // 94%: beyond
	require.NoError(t, err)
	assert.False(t, isFull(), "a request beyond it found room and lifted the limit")
	checkStep(t, p, d)

	// Found full again, a look that finds no room for a request beyond
	// 90% makes the next fullProbeSkips such requests fail without one.
	setFull()
	free, _, err = sd.MemGetInfo()
	require.NoError(t, err)
	require.NoError(t, sd.Occupy(free))
	infos := func() uint64 { return p.Stats().DeviceCalls[device.CallMemGetInfo] }
	_, err = p.Alloc(24 * miB) // 98%: beyond, and it needs new memory
	require.ErrorIs(t, err, ErrOutOfMemory)
	before = infos()
	for i := range fullProbeSkips {
		_, err = p.Alloc(uint64(23-i) * miB) // smaller each time: not remembered
		require.ErrorIs(t, err, ErrOutOfMemory)
		require.Contains(t, err.Error(), "is not asked again for")
		require.Contains(t, err.Error(), "at the pool's last look")
	}
	assert.Equal(t, before, infos(), "%d requests, no look at the device", fullProbeSkips)
	_, err = p.Alloc(6 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	assert.Greater(t, infos(), before, "the next one looks again")
	checkStep(t, p, d)
	sd.Vacate(free)
	require.NoError(t, p.Free(big))
	require.NoError(t, p.Free(more))
	checkStep(t, p, d)
}

// A pool without a cap has no requests beyond 90% of it: after a refused
// cuMemCreate, a request that finds room raises the limit to what it
// takes, so that the next ones below it need no look.
func TestAFullDevicesLimitRisesInAPoolWithoutACap(t *testing.T) {
	p, d, _ := poolOnHoles(t, 0)
	p.mu.Lock()
	p.full.on, p.full.limit = true, p.reserved()
	p.mu.Unlock()
	infos := func() uint64 { return p.Stats().DeviceCalls[device.CallMemGetInfo] }

	a, err := p.Alloc(128 * miB)
	require.NoError(t, err, "room: served")
	p.mu.Lock()
	full, limit := p.full.on, p.full.limit
	p.mu.Unlock()
	assert.True(t, full)
	assert.GreaterOrEqual(t, limit, uint64(128*miB), "the limit rose to what it took")
	require.NoError(t, p.Free(a))
	// Mapping 64 MiB on holes again, below the limit, looks no more than
	// with the device never found full (the mapping itself sizes its
	// handles with one cuMemGetInfo).
	looks := func() uint64 {
		_, err := p.Trim()
		require.NoError(t, err)
		before := infos()
		b, err := p.Alloc(64 * miB)
		require.NoError(t, err)
		require.NoError(t, p.Free(b))
		return infos() - before
	}
	below := looks()
	p.mu.Lock()
	p.full.on = false
	p.mu.Unlock()
	assert.Equal(t, looks(), below, "below the limit: no look of its own")
	checkStep(t, p, d)
}

// A remembered failure is forgotten once the pool grows: the memory it
// gained may serve what failed. Here a 2 MiB request fails on a full
// device (remembered); the neighbour leaves, a 40 MiB request grows the
// pool over the whole device, and a 3 MiB request, which best fit places
// on released pages the device can no longer back, is served from the
// mapped free memory the growth left (it failed from the memo before).
func TestARememberedFailureIsForgottenAfterAGrowth(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 64 * miB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1.0 / 4096, Cache: CacheOptions{Disable: true}})
	a, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	b, err := p.Alloc(8 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	_, err = p.Trim()
	require.NoError(t, err)
	require.Equal(t, uint64(8*miB), p.Stats().Reserved, "a's pages released: holes under the bottom free block")
	require.NoError(t, sd.Occupy(56*miB))
	_, err = p.Alloc(2 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory, "the device is full")
	sd.Vacate(56 * miB)
	p.mu.Lock()
	p.opts.GrowFraction = 1 // the next growth takes the whole device
	p.mu.Unlock()
	c, err := p.Alloc(40 * miB)
	require.NoError(t, err)
	require.Equal(t, uint64(64*miB), p.Stats().Reserved, "the growth took the whole device")
	e, err := p.Alloc(3 * miB)
	require.NoError(t, err, "16 MiB mapped and free at the top of the heap")
	checkStep(t, p, d)
	for _, ptr := range []uintptr{b, c, e} {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
}

// A request that best fit places on released pages the pool cannot back
// (here a full device) is served from a free block lying on mapped pages,
// without the out-of-memory path and without mapping anything
// (Pool.searchMapped). The pool did not know the device was full: its one
// cuMemCreate for the holes is refused first.
func TestARequestOnReleasedPagesTakesMappedMemoryFirst(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 64 * miB})
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, GrowFraction: 1.0 / 4096, Cache: CacheOptions{Disable: true}})
	var ptrs []uintptr
	for _, n := range []uint64{22, 2, 26, 2, 12} {
		ptr, err := p.Alloc(n * miB)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	require.NoError(t, p.Free(ptrs[0]))
	_, err := p.Trim()
	require.NoError(t, err)
	require.Equal(t, uint64(42*miB), p.Stats().Reserved, "the 22 MiB block's pages released")
	require.NoError(t, sd.Occupy(22*miB))
	require.NoError(t, p.Free(ptrs[2]))
	before := p.Stats()
	ptr, err := p.Alloc(20 * miB)
	require.NoError(t, err)
	after := p.Stats()
	assert.Equal(t, ptrs[2], ptr, "the 26 MiB block, mapped, rather than the 22 MiB one best fit gives")
	assert.Equal(t, before.Retries, after.Retries, "no out-of-memory path")
	assert.Equal(t, before.DeviceCalls[device.CallMemMap], after.DeviceCalls[device.CallMemMap], "nothing mapped")
	assert.Equal(t, before.DeviceCalls[device.CallMemCreate]+1, after.DeviceCalls[device.CallMemCreate], "one cuMemCreate, refused")
	assert.Equal(t, before.Reserved, after.Reserved)
	require.NoError(t, sd.MemsetD32(ptr, 1, wordCount(20*miB)))
	checkStep(t, p, d)
	for _, q := range []uintptr{ptr, ptrs[1], ptrs[3], ptrs[4]} {
		require.NoError(t, p.Free(q))
	}
	sd.Vacate(22 * miB)
	checkStep(t, p, d)
}

// K pools at MaxFraction 1/K on a GPU whose processes' contexts hold
// memory can all hold their caps at once, started together or one after
// another: each cap leaves its process's context room
// (contextShareDivisor), so the caps add up to no more than the device
// holds beside the contexts.
func TestFractionCapsLeaveRoomForTheContexts(t *testing.T) {
	const capacity, ctx = 256 * giB, 200 * miB // total/256 is 1 GiB
	const block = 64 * miB
	for _, k := range []int{2, 4} {
		for _, staggered := range []bool{false, true} {
			t.Run(fmt.Sprintf("K=%d/staggered=%v", k, staggered), func(t *testing.T) {
				first := sim.New(sim.Config{Capacity: capacity, ContextBytes: ctx})
				devs := []*sim.Device{first}
				for range k - 1 {
					devs = append(devs, first.NewProcess()) // every context before any pool
				}
				share := uint64(capacity) / uint64(k)
				fill := func(p *Pool) {
					limit, err := p.Cap()
					require.NoError(t, err)
					for range limit / block {
						_, err := p.Alloc(block)
						require.NoError(t, err, "a pool below its cap")
					}
				}
				var held uint64 // what the pools made before hold
				for i, d := range devs {
					p := openPool(t, onSim(d), Options{Backend: BackendVMM, MaxFraction: 1 / float64(k), NoScavenger: true})
					limit, err := p.Cap()
					require.NoError(t, err)
					// At New the device's memory in use is the k contexts
					// and what the pools made before hold, but at most
					// total/256 counts.
					require.Equal(t, share-min(uint64(k)*ctx+held, capacity/256), limit, "proc %d", i)
					if staggered {
						fill(p)
						held += p.Stats().Reserved
					}
					defer func() {
						if !staggered {
							fill(p)
						}
						require.LessOrEqual(t, p.Stats().Reserved, limit)
						require.NoError(t, p.Check())
					}()
				}
			})
		}
	}
}

// What a fraction cap leaves for the context is what the device had in
// use at New, at most total/256 and at most half the share; a request
// above the cap but within MaxFraction × total fails
// at once, with no driver call, and says why.
func TestAFractionCapsContextShareIsBounded(t *testing.T) {
	for _, tc := range []struct {
		name          string
		capacity, ctx uint64
		fraction      float64
		want          uint64
	}{
		{"no context", 64 * giB, 0, 0.25, 16 * giB},
		{"a context", 64 * giB, 100 * miB, 0.25, 16*giB - 100*miB},
		{"a context above total/256", 64 * giB, giB, 0.25, 16*giB - 256*miB},
		{"a larger GPU's bound", 512 * giB, 4 * giB, 0.25, 128*giB - 2*giB},
		{"a share below twice the context", 64 * giB, 200 * miB, 1.0 / 256, 128 * miB},
	} {
		for _, be := range pooledBackends {
			t.Run(tc.name+"/"+be.String(), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: tc.capacity, ContextBytes: tc.ctx}))
				p := openPool(t, d, Options{Backend: be, MaxFraction: tc.fraction})
				limit, err := p.Cap()
				require.NoError(t, err)
				require.Equal(t, tc.want, limit)
				share := uint64(tc.fraction * float64(tc.capacity))
				if limit == share {
					return
				}
				before := p.Stats()
				_, err = p.Alloc(share - 2*miB)
				require.ErrorIs(t, err, ErrOutOfMemory)
				require.Contains(t, err.Error(), "less the process's context")
				after := p.Stats()
				require.Equal(t, before.DeviceCalls, after.DeviceCalls, "a request above the cap asks nothing")
				require.Equal(t, before.Reserved, after.Reserved)
				checkStep(t, p, d)
			})
		}
	}
}

// The context counted is what was in use when the pool was made: a first
// process's own context alone, a later one's and the others' memory up to
// the bound. Caps at one fraction differ by what the first context held
// below the bound, never by more.
func TestAFractionCapCountsWhatWasInUseAtNew(t *testing.T) {
	const capacity, ctx = 256 * giB, 300 * miB // total/256 is 1 GiB
	first := sim.New(sim.Config{Capacity: capacity, ContextBytes: ctx})
	a := openPool(t, onSim(first), Options{Backend: BackendVMM, MaxFraction: 0.5})
	capA, err := a.Cap()
	require.NoError(t, err)
	require.Equal(t, uint64(128*giB-ctx), capA, "its own context")
	second := first.NewProcess()
	held, err := a.Alloc(giB) // pool a's memory is in use too when b is made
	require.NoError(t, err)
	b := openPool(t, onSim(second), Options{Backend: BackendVMM, MaxFraction: 0.5})
	capB, err := b.Cap()
	require.NoError(t, err)
	require.Equal(t, uint64(128*giB-giB), capB, "two contexts and a's gigabyte, counted up to total/256")
	// Both hold their caps at once.
	require.NoError(t, a.Free(held))
	for _, p := range []*Pool{a, b} {
		limit, _ := p.Cap()
		_, err := p.Alloc(limit / miB * miB)
		require.NoError(t, err)
	}
}

// An initial reserve of InitialFraction = MaxFraction stays within the
// cap, which leaves the context room: InitialFraction × free at New would
// pass it by half the context.
func TestAnInitialReserveStaysWithinAFractionCap(t *testing.T) {
	const capacity, ctx = 64 * giB, 200 * miB
	d := onSim(sim.New(sim.Config{Capacity: capacity, ContextBytes: ctx}))
	p := openPool(t, d, Options{Backend: BackendVMM, MaxFraction: 0.5, InitialFraction: 0.5})
	limit, err := p.Cap()
	require.NoError(t, err)
	require.Equal(t, uint64(capacity/2-ctx), limit)
	st := p.Stats()
	require.LessOrEqual(t, st.Reserved, limit)
	require.Greater(t, st.Reserved, limit-2*miB, "the reserve is the cap, to the page")
	checkStep(t, p, d)
	// MaxBytes below the initial reserve is still an error, not a clamp.
	_, err = New(sim.New(sim.Config{Capacity: capacity, ContextBytes: ctx}),
		Options{Backend: BackendVMM, MaxFraction: 0.5, InitialFraction: 0.5, MaxBytes: giB})
	require.ErrorIs(t, err, ErrBadOptions)
	require.Contains(t, err.Error(), "initial reserve")
}
