package pool

// Physical memory in large handles (vmm.go): one handle per growth,
// one-page handles where memory must move, release of whole handles only.

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/tlsf"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func creates(p *Pool) uint64 { return p.Stats().DeviceCalls[device.CallMemCreate] }

func TestAGrowthMapsOneHandle(t *testing.T) {
	d := onSim(sim.New(sim.Config{})) // an H200's memory: growths of about 35 MiB
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	a, err := p.Alloc(30 * miB)
	require.NoError(t, err)
	s := p.Stats()
	require.Equal(t, uint64(1), creates(p), "one handle for the growth")
	require.Greater(t, s.Reserved, 30*miB)
	require.Equal(t, uint64(1), s.DeviceCalls[device.CallMemSetAccess])
	checkStep(t, p, d)

	// A growth above maxHandlePages pages takes several handles.
	b, err := p.Alloc(300 * miB)
	require.NoError(t, err)
	require.Equal(t, uint64(1+3), creates(p), "300 MiB as handles of at most 128 MiB")
	checkStep(t, p, d)

	// A handle partly in use stays; whole free handles go.
	require.NoError(t, p.Free(b))
	_, err = p.Trim()
	require.NoError(t, err)
	s = p.Stats()
	require.Equal(t, s.Reserved%(2*miB), uint64(0))
	require.GreaterOrEqual(t, s.Reserved, 30*miB, "the handle under a stays mapped")
	require.Less(t, s.Reserved, 300*miB)
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	_, err = p.Trim()
	require.NoError(t, err)
	require.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
}

// A capped pool alone on its GPU maps one-page handles, so that its
// memory can move 2 MiB at a time to fit its cap: with MaxBytes, and with
// a MaxFraction above one half (at most one half declares the device
// shared: TestADeclaredShareGrowsInLargerHandles).
func TestCappedPoolsMapOnePageHandles(t *testing.T) {
	for _, c := range []struct {
		name string
		opts Options
	}{
		{"MaxBytes", Options{MaxBytes: 8 * giB}},
		{"MaxBytes of half the device", Options{MaxBytes: sim.H200Capacity / 2}},
		{"MaxFraction", Options{MaxFraction: 0.75}},
		{"MaxFraction and ReleaseFraction", Options{MaxFraction: 0.75, ReleaseFraction: 0.1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{}))
			o := c.opts
			o.Backend = BackendVMM
			p := openPool(t, d, o)
			a, err := p.Alloc(300 * miB)
			require.NoError(t, err)
			s := p.Stats()
			require.Equal(t, s.Reserved/(2*miB), creates(p), "a handle per page")
			checkStep(t, p, d)
			require.NoError(t, p.Free(a))
		})
	}
}

// A MaxFraction of at most one half declares the device shared
// (declaredShareFraction): alone on its GPU, such a pool's growths map the
// interior of each block in handles of up to a 2048th of its cap, not one
// page each, so that jobs started together do not each map thousands of
// one-page handles before they see one another. Below a cap of 8 GiB a
// 2048th is under two pages: one-page handles. ReleaseFraction changes
// nothing here. Trim returns every byte.
func TestADeclaredShareGrowsInLargerHandles(t *testing.T) {
	for _, c := range []struct {
		name     string
		fraction float64
		release  float64 // ReleaseFraction
		most     uint64  // pages per handle at most
	}{
		{"one half", 0.5, 0, 17},          // 70.2 GiB / 2048 = 35.1 MiB: 17 pages
		{"one quarter", 0.25, 0, 8},       // 35.1 GiB / 2048 = 17.5 MiB: 8 pages
		{"a cap under 8 GiB", 0.05, 0, 1}, // 7.0 GiB / 2048 < 4 MiB: under two pages
		{"a small cap", 0.02, 0, 1},       // 2.8 GiB / 2048 < 2 MiB
		{"just above one half", 0.51, 0, 1},
		{"one half, ReleaseFraction too", 0.5, 0.05, 17},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := onSim(sim.New(sim.Config{}))
			p := openPool(t, d, Options{Backend: BackendVMM, MaxFraction: c.fraction, ReleaseFraction: c.release, Cache: CacheOptions{Disable: true}, NoScavenger: true})
			a, err := p.Alloc(300 * miB) // 150 pages
			require.NoError(t, err)
			var handles, several, largest uint64
			for _, k := range mappings(p) {
				handles++
				largest = max(largest, k)
				if k > 1 {
					several++
				}
			}
			assert.Equal(t, handles, creates(p))
			assert.Equal(t, c.most, largest, "pages in the largest handle")
			if c.most > 1 {
				assert.Less(t, handles, p.Stats().Reserved/(2*miB), "fewer handles than pages")
			}
			freeTrimmedToZero(t, p, d, a)
		})
	}
}

// freeTrimmedToZero checks p, frees a, its last live block, and checks
// that Trim returns every byte: whole handles under free blocks go back.
func freeTrimmedToZero(t *testing.T, p *Pool, d testDevice, a uintptr) {
	t.Helper()
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	_, err := p.Trim()
	require.NoError(t, err)
	assert.Zero(t, p.Stats().Reserved, "whole handles under free blocks go back")
	checkStep(t, p, d)
}

// mappings returns the pages of each mapping of a VMM pool, in address
// order.
func mappings(p *Pool) []uint64 {
	h := p.heap.(*vmmHeap)
	var out []uint64
	for pg := uint64(0); pg < (h.end-h.base)/h.gran; pg++ {
		if h.mapped[pg] && uint64(h.start[pg]) == pg {
			out = append(out, h.mappingLen(pg))
		}
	}
	return out
}

// A pool with no cap that recycles memory under ReleaseFraction f maps
// handles of at most f/2 of its peak of memory in use (the request being
// mapped included): one page while the peak is small, several once it is
// large. Trim returns every byte.
func TestReleaseFractionHandlesScaleWithThePeak(t *testing.T) {
	d := onSim(sim.New(sim.Config{}))
	p := openPool(t, d, Options{Backend: BackendVMM, ReleaseFraction: 0.1, GrowFraction: 1e-12, Cache: CacheOptions{Disable: true}})
	a, err := p.Alloc(20 * miB) // f/2 of 20 MiB: 1 MiB, below a page
	require.NoError(t, err)
	assert.Equal(t, []uint64{1, 1, 1, 1, 1, 1, 1, 1, 1, 1}, mappings(p))
	b, err := p.Alloc(2 * giB) // f/2 of 2068 MiB: 103 MiB, 51 pages
	require.NoError(t, err)
	ms := mappings(p)[10:]
	var pages uint64
	for _, k := range ms {
		assert.LessOrEqual(t, k, uint64(51))
		pages += k
	}
	assert.Equal(t, uint64(1024), pages)
	assert.Less(t, len(ms), 30, "handles of several pages: %v", ms)
	assert.Equal(t, uint64(len(ms)+10), creates(p))
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	require.NoError(t, p.Free(b))
	_, err = p.Trim()
	require.NoError(t, err)
	assert.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
}

// smallHandles is a device that refuses physical allocations above most
// bytes, as a device shared with other processes refuses large ones.
type smallHandles struct {
	device.Device
	most    uint64
	refused int
}

func (d *smallHandles) MemCreate(size uint64) (device.MemHandle, error) {
	if size > d.most {
		d.refused++
		return 0, device.ErrOutOfMemory
	}
	return d.Device.MemCreate(size)
}

// A refused handle size is remembered: later mappings ask for the smaller
// size at once, and try the larger one again only after handleStreak
// handles succeed, so refusals stay below one per handleStreak handles.
func TestARefusedHandleSizeIsRemembered(t *testing.T) {
	sd := sim.New(sim.Config{})
	d := &smallHandles{Device: sd, most: 64 * miB}
	p := openPool(t, testDevice{Device: d, sd: sd}, Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	const n = 40
	for i := range n {
		_, err := p.Alloc(128 * miB)
		require.NoError(t, err, "alloc %d", i)
	}
	require.NoError(t, p.Check())
	handles := int(creates(p)) - d.refused
	require.Equal(t, 2*n, handles, "each 128 MiB block as two 64 MiB handles")
	require.LessOrEqual(t, d.refused, 1+handles/8, "refused cuMemCreate calls (asking for the full size every time: one a block)")
	require.Positive(t, d.refused)
}

// testHeap is a VMM heap of vsize bytes of address space over sd, with an
// index of its own, closed when the test ends, and the counted device it
// calls.
func testHeap(t *testing.T, sd *sim.Device, vsize uint64) (*vmmHeap, *counted) {
	t.Helper()
	dev := &counted{Device: sd}
	x, err := tlsf.New(tlsf.Config{})
	require.NoError(t, err)
	_, total, err := sd.MemGetInfo()
	require.NoError(t, err)
	h, err := newVMMHeap(dev, x, vsize, total)
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, h.close()) })
	return h, dev
}

// A handle is no larger than the device's free memory: a run that wants
// more pages than the device has left maps what it has in one handle
// instead of asking for the whole run and halving down after refusals.
func TestAHandleIsSizedToTheDevicesFreeMemory(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 64 * miB})
	other := sd.NewProcess()
	held, err := other.MemCreate(32 * miB) // another process holds half
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, other.MemRelease(held)) })
	h, dev := testHeap(t, sd, 256*miB)
	// 32 pages wanted, 16 needed, 16 free: one handle of 16 pages, then
	// one refused page. (Asking for 32 first: 32, 16 and then 16, 8, 4, 2
	// and 1 for the rest, six refused.)
	n, err := h.mapRun(0, 32, 16, 0, ^uint64(0), maxHandlePages, &mapLog{})
	require.NoError(t, err)
	require.Equal(t, uint64(16), n)
	require.LessOrEqual(t, dev.counts()[device.CallMemCreate], uint64(2))
	require.NoError(t, h.unmapRun(0, n))
}

// On a device where other processes hold much memory (sharedFraction), a
// capped pool's growth maps the interior of the block it is for in
// handles of several pages (at most a 1024th of the cap), not one page
// each; alone on the device it maps one-page handles
// (TestCappedPoolsMapOnePageHandles). A pool with no cap that recycles
// under ReleaseFraction, shared or not, maps handles of at most f/2 of its
// peak (TestReleaseFractionHandlesScaleWithThePeak): here one page. All
// return every byte.
func TestACappedPoolGrowsInLargerHandlesOnASharedDevice(t *testing.T) {
	for _, c := range []struct {
		name     string
		opts     Options
		most     uint64 // pages per handle at most
		severalN bool   // some handles of several pages
	}{
		{"MaxFraction", Options{MaxFraction: 0.5}, 4, true},  // 8 GiB / 1024 = 4 pages
		{"a small cap", Options{MaxBytes: 2 * giB}, 4, true}, // 8 MiB, as a 256th of 2 GiB
		{"ReleaseFraction", Options{ReleaseFraction: 0.03}, 1, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: 16 * giB})
			require.NoError(t, sd.Occupy(2*giB)) // another process: 1/8 of the device
			t.Cleanup(func() { sd.Vacate(2 * giB) })
			d := onSim(sd)
			o := c.opts
			o.Backend, o.Cache, o.NoScavenger = BackendVMM, CacheOptions{Disable: true}, true
			p := openPool(t, d, o)
			a, err := p.Alloc(200 * miB) // 100 pages
			require.NoError(t, err)
			var handles, several uint64
			for i, k := range mappings(p) {
				assert.LessOrEqual(t, k, c.most, "mapping %d", i)
				handles++
				if k > 1 {
					several++
				}
			}
			assert.Equal(t, handles, creates(p))
			assert.Equal(t, c.severalN, several > 0, "%d handles of several pages", several)
			freeTrimmedToZero(t, p, d, a)
		})
	}
}

// Other processes that hold little of the device (less than
// sharedFraction) make it shared once they hold sharedGrowthFraction of it
// (and sharedGrowthMin) more than at New or at any growth since:
// processes started together fill the device together, and one-page
// handles mapped before any of them reached a sixteenth cost a third of
// all driver calls in tlsf-stress multi. What they held at New (their
// contexts, say) does not count; memory they took after leaving does.
func TestACappedPoolGrowsInLargerHandlesOnceOthersGrow(t *testing.T) {
	for _, c := range []struct {
		name          string
		capacity      uint64 // the device's bytes (0: 512 GiB)
		before, after uint64 // bytes other processes hold at New, and take after it
		left          bool   // those of before leave after New, before a first growth
		several       bool
	}{
		{"others grew since New", 0, 8 * giB, 8 * giB, false, true}, // 8 GiB more ≥ 512 GiB / 128
		{"others as at New", 0, 16 * giB, 0, false, false},          // 1/32 of the device: not shared
		{"others grew a little", 0, 8 * giB, 2 * giB, false, false}, // less than 1/128 more
		{"others left, others came", 0, 16 * giB, 8 * giB, true, true},
		// 512 MiB more is 1/32 of a 16 GiB device, but less than sharedGrowthMin.
		{"a small device, others grew by a context", 16 * giB, 0, 512 * miB, false, false},
		{"a small device, others took a sixteenth", 16 * giB, 0, 1 * giB, false, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			capacity := c.capacity
			if capacity == 0 {
				capacity = 512 * giB
			}
			sd := sim.New(sim.Config{Capacity: capacity})
			require.NoError(t, sd.Occupy(c.before))
			held := c.before
			t.Cleanup(func() { sd.Vacate(held) })
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: BackendVMM, MaxBytes: 8 * giB, Cache: CacheOptions{Disable: true}, NoScavenger: true})
			if c.left {
				sd.Vacate(c.before)
				held = 0
				first, err := p.Alloc(2 * miB) // a growth sees the device as the others left it
				require.NoError(t, err)
				t.Cleanup(func() { _ = p.Free(first) })
			}
			require.NoError(t, sd.Occupy(c.after))
			held += c.after
			a, err := p.Alloc(200 * miB) // 100 pages
			require.NoError(t, err)
			var several uint64
			for i, k := range mappings(p) {
				assert.LessOrEqual(t, k, uint64(4), "mapping %d: 8 MiB at most (8 GiB / 1024)", i)
				if k > 1 {
					several++
				}
			}
			assert.Equal(t, c.several, several > 0, "%d handles of several pages", several)
			checkStep(t, p, d)
			require.NoError(t, p.Free(a))
			checkStep(t, p, d)
		})
	}
}

// Holes a capped pool on a shared device maps again under a block
// (vmmHeap.back) get the block's interior in handles of up to sharedPages
// pages, as its growths do, not one handle per page.
func TestACappedPoolBacksHolesInLargerHandlesOnASharedDevice(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 16 * giB})
	require.NoError(t, sd.Occupy(2*giB)) // another process: 1/8 of the device
	t.Cleanup(func() { sd.Vacate(2 * giB) })
	d := onSim(sd)
	p := openPool(t, d, Options{Backend: BackendVMM, MaxFraction: 0.5, Cache: CacheOptions{Disable: true}, NoScavenger: true})
	a, err := p.Alloc(200 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	_, err = p.Trim()
	require.NoError(t, err)
	require.Zero(t, p.Stats().Reserved, "the range is all holes")
	before := creates(p)
	a, err = p.Alloc(200 * miB) // 100 pages, all holes: mapped by back
	require.NoError(t, err)
	h := p.heap.(*vmmHeap)
	var several uint64
	for pg := uint64(0); pg < (h.end-h.base)/h.gran; pg++ {
		if h.mapped[pg] && uint64(h.start[pg]) == pg {
			k := h.mappingLen(pg)
			assert.LessOrEqual(t, k, uint64(4), "mapping at page %d: 8 GiB / 1024 = 4 pages at most", pg)
			if k > 1 {
				several++
			}
		}
	}
	assert.Positive(t, several, "handles of several pages")
	assert.LessOrEqual(t, creates(p)-before, uint64(100/4+3), "a handle per 4 pages and the block's first and last")
	checkStep(t, p, d)
	require.NoError(t, p.Free(a))
	checkStep(t, p, d)
}

// A mapping releases the spares that fit nowhere in it before it creates
// handles, not after: on a full device the memory they hold is what the
// new handles are made of (a neighbouring process would otherwise take
// it, or the creation fail).
func TestSparesThatFitNowhereAreReleasedBeforeCreating(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: 16 * miB}) // 8 pages
	h, dev := testHeap(t, sd, 64*miB)
	mh, err := sd.MemCreate(16 * miB) // all of the device, as a spare of 8 pages
	require.NoError(t, err)
	h.pushSpare(mh, 8)
	n, err := h.mapRun(0, 4, 4, 0, ^uint64(0), 1, &mapLog{})
	require.NoError(t, err, "the 8-page spare fits nowhere in 4 pages: released first, its memory makes the 4 handles")
	require.Equal(t, uint64(4), n)
	assert.Zero(t, h.nSpare)
	assert.Equal(t, uint64(4), dev.counts()[device.CallMemCreate], "no refused creation")
	require.NoError(t, h.unmapRun(0, n))
}
