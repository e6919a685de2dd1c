package pool_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/poolmodel"
	"github.com/gpumem/tlsf/pool"
	"github.com/gpumem/tlsf/tlsf"
)

// Fault-injection campaigns: a few thousand random operations on a pool
// over a simulated GPU whose driver calls of one kind fail at 1% or 10%,
// or whose free memory another process takes between the pool's memory
// query and its allocation. At every step:
//
//   - no panic, and p.Check passes;
//   - no byte of accounting is lost: Stats.Reserved equals what the
//     device holds for the pool (sim.Device.Mapped; a passthrough pool's linear
//     bytes), Allocated and Allocations equal the live blocks, and no
//     peak is below its figure;
//   - a failed call returns ErrOutOfMemory or the driver's error, and
//     leaves every live block live;
//   - no live block is clobbered (each is filled with its own pattern and
//     checked before it is freed), and the Sim records no violation.
//
// When the faults stop, every live block frees, the pool serves again,
// Trim returns everything, and Close leaves nothing on the device.

// campaignCalls are the driver calls each backend makes while serving
// (AddressReserve, AddressFree and EventDestroy come only at New and
// Close: TestFaultsAtNewAndClose).
var campaignCalls = map[pool.Backend][]device.Call{
	pool.BackendVMM: {
		device.CallMemGetInfo, device.CallMemAllocPitch, device.CallMemFree, device.CallMemCreate,
		device.CallMemRelease, device.CallMemMap, device.CallMemUnmap, device.CallMemSetAccess,
		device.CallStreamSynchronize, device.CallStreamWaitEvent, device.CallEventCreate,
		device.CallEventRecord, device.CallEventQuery, device.CallEventSynchronize,
	},
	pool.BackendChunks: {
		device.CallMemGetInfo, device.CallMemAlloc, device.CallMemFree, device.CallMemAllocPitch,
		device.CallStreamSynchronize, device.CallStreamWaitEvent, device.CallEventCreate,
		device.CallEventRecord, device.CallEventQuery, device.CallEventSynchronize,
	},
	pool.BackendPassthrough: {
		device.CallMemGetInfo, device.CallMemAlloc, device.CallMemFree, device.CallMemAllocPitch,
		device.CallStreamSynchronize,
	},
}

// faultFor is the error an injected failure of c wraps: out of memory for
// calls that allocate, the generic injected fault for the others.
func faultFor(c device.Call) error {
	switch c {
	case device.CallMemAlloc, device.CallMemAllocPitch, device.CallMemCreate, device.CallAddressReserve:
		return device.ErrOutOfMemory
	}
	return device.ErrInjected
}

// campaignOps is the number of operations per campaign: a few thousand,
// fewer under -short and under the race detector, which slows every
// Check tenfold and finds nothing in these single-goroutine campaigns
// that the concurrent tests do not.
func campaignOps() int {
	switch {
	case testing.Short():
		return 150
	case pool.RaceBuild():
		return 300
	}
	return 2000
}

func TestFaultCampaigns(t *testing.T) {
	for _, be := range []pool.Backend{pool.BackendVMM, pool.BackendChunks, pool.BackendPassthrough} {
		for i, c := range campaignCalls[be] {
			for j, rate := range []float64{0.01, 0.1} {
				cacheOff := (i+j)%2 == 1 // each kind and rate once with caches, once without, across the two rates
				t.Run(fmt.Sprintf("%v/%v/%v/%s", be, c, rate, cacheName(cacheOff)), func(t *testing.T) {
					seed := uint64(1000*int(be) + 10*int(c) + j)
					cp := newCampaign(t, be, cacheOff, seed, nil)
					cp.sd.FailRate(c, rate, faultFor(c))
					cp.run(campaignOps())
					calls := cp.sd.Counts()[c]
					cp.recover()
					if calls == 0 {
						if campaignOps() < 2000 {
							t.Skipf("%v not called in %d operations (-short or -race): nothing tested", c, campaignOps())
						}
						t.Fatalf("the pool never called %v: the campaign tested nothing", c)
					}
				})
			}
		}
	}
}

func cacheName(off bool) string {
	if off {
		return "caches-off"
	}
	return "caches-on"
}

// Another process takes most of the device's free memory between the
// pool's cuMemGetInfo and its next allocation call, now and then, and
// gives it back now and then: the pool sizes a growth from a figure that
// is stale by the time it allocates.
func TestFreeMemoryShrinksBetweenQueryAndAllocation(t *testing.T) {
	for _, be := range []pool.Backend{pool.BackendVMM, pool.BackendChunks, pool.BackendPassthrough} {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				// A passthrough pool never asks for the free memory (its cap,
				// a fraction of total memory, needs no query): memory is
				// taken before its allocations all the same.
				cp := newCampaign(t, be, cacheOff, 77+uint64(be), func(o *pool.Options) { o.MaxFraction = 0.95 })
				other := cp.sd.NewProcess()
				var taken []uintptr
				queried, thefts := false, 0
				rng := rand.New(rand.NewPCG(5, uint64(be)))
				cp.sd.SetHook(func(c device.Call) {
					switch c {
					case device.CallMemGetInfo:
						queried = true
					case device.CallMemCreate, device.CallMemAlloc, device.CallMemAllocPitch:
						if (!queried && be != pool.BackendPassthrough) || rng.IntN(2) == 0 {
							return
						}
						queried = false
						free, _, err := other.MemGetInfo()
						if err != nil || free < 4<<20 {
							return
						}
						// Leave less than the pool is likely to ask for.
						if ptr, err := other.MemAlloc(free - uint64(rng.IntN(4))<<20 - 512); err == nil {
							taken = append(taken, ptr)
							thefts++
						}
					}
				})
				cp.onStep = func(step int) {
					if step%50 == 0 {
						for _, ptr := range taken {
							if err := other.MemFree(ptr); err != nil {
								t.Fatal(err)
							}
						}
						taken = taken[:0]
					}
				}
				cp.run(campaignOps())
				cp.sd.SetHook(nil)
				for _, ptr := range taken {
					if err := other.MemFree(ptr); err != nil {
						t.Fatal(err)
					}
				}
				if thefts == 0 || cp.ooms == 0 {
					t.Fatalf("%d thefts, %d failed requests: the campaign tested nothing", thefts, cp.ooms)
				}
				cp.recover()
			})
		}
	}
}

// A growth whose mapping fails after the pages were mapped, and whose
// undo fails too, leaves them mapped (strays, counted as reserved until a
// later unmap succeeds). The failed request then gives them back: it
// leaves the pool no more memory than before (Pool.allocMiss). Without
// OnOutOfMemory the peak of reserved memory is as it was; with it (whose
// hook may raise the peak by what it allocates) the peak counts the pages
// the failed mapping held, as every peak counts what its figure did.
func TestAFailedMappingLeftMappedIsGivenBack(t *testing.T) {
	for _, hook := range []bool{false, true} {
		t.Run(fmt.Sprintf("hook=%v", hook), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: 1 << 30})
			o := pool.Options{Backend: pool.BackendVMM}
			if hook {
				o.OnOutOfMemory = func(uint64) {}
			}
			p, err := pool.New(sd, o)
			if err != nil {
				t.Fatal(err)
			}
			defer p.Close()
			sd.FailNth(device.CallMemSetAccess, 1, nil) // the growth fails after mapping
			sd.FailNth(device.CallMemUnmap, 1, nil)     // and its undo with it
			if _, err := p.Alloc(8 << 20); !errors.Is(err, device.ErrInjected) {
				t.Fatalf("Alloc: %v, want the injected failure", err)
			}
			if err := p.Check(); err != nil {
				t.Fatal(err)
			}
			st := p.Stats()
			switch {
			case st.Reserved != sd.Mapped():
				t.Fatalf("Reserved %d, the device holds %d", st.Reserved, sd.Mapped())
			case st.Reserved != 0:
				t.Fatalf("Reserved %d: the failed request left memory", st.Reserved)
			case !hook && st.ReservedPeak != 0:
				t.Fatalf("ReservedPeak %d: the failed request raised it", st.ReservedPeak)
			case hook && st.ReservedPeak < 8<<20:
				t.Fatalf("ReservedPeak %d: not the pages the failed mapping held", st.ReservedPeak)
			}
		})
	}
}

// Faults in the calls made only by New and Close: New fails and leaves
// nothing behind; Close reports the failure and the pool is closed.
func TestFaultsAtNewAndClose(t *testing.T) {
	t.Run("AddressReserve fails at New", func(t *testing.T) {
		sd := sim.New(sim.Config{Capacity: 1 << 30})
		sd.FailNth(device.CallAddressReserve, 1, device.ErrOutOfMemory)
		if _, err := pool.New(sd, pool.Options{Backend: pool.BackendVMM}); !errors.Is(err, device.ErrOutOfMemory) {
			t.Fatalf("New: %v", err)
		}
		if st := sd.Stats(); st.Used != 0 || st.Reservations != 0 {
			t.Fatalf("a failed New left %+v", st)
		}
	})
	for _, be := range []pool.Backend{pool.BackendVMM, pool.BackendChunks} {
		for _, c := range []device.Call{device.CallMemCreate, device.CallMemMap, device.CallMemSetAccess, device.CallMemAlloc, device.CallMemGetInfo} {
			t.Run(fmt.Sprintf("%v fails at New's initial reserve on %v", c, be), func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: 1 << 30})
				sd.FailNth(c, 2, faultFor(c))
				p, err := pool.New(sd, pool.Options{Backend: be, InitialFraction: 0.25})
				if p != nil {
					// The fault missed this backend's initial reserve.
					if err := p.Close(); err != nil {
						t.Fatal(err)
					}
				} else if !errors.Is(err, faultFor(c)) {
					t.Fatalf("New: %v", err)
				}
				if st := sd.Stats(); st.Used != 0 || st.Reservations != 0 {
					t.Fatalf("after a failed New the device holds %+v", st)
				}
			})
		}
	}
	// Close either reports the failure or, having retried, leaves nothing.
	for _, c := range []device.Call{device.CallAddressFree, device.CallEventDestroy, device.CallMemUnmap, device.CallMemRelease, device.CallMemFree} {
		t.Run(fmt.Sprintf("%v fails at Close", c), func(t *testing.T) {
			cp := newCampaign(t, pool.BackendVMM, true, 3, nil)
			cp.run(200)
			cp.sd.FailNth(c, 1, nil)
			err := cp.p.Close()
			st := cp.sd.Stats()
			clean := cp.sd.Mapped() == 0 && st.Handles == 0 && st.LinearAllocs == 0 && st.Reservations == 0 && st.Events == 0
			if err == nil && !clean || err != nil && !errors.Is(err, device.ErrInjected) {
				t.Fatalf("Close with a failing %v: %v; the device holds %+v", c, err, st)
			}
			if _, err := cp.p.Alloc(256); !errors.Is(err, pool.ErrClosed) {
				t.Fatalf("Alloc after a failed Close: %v", err)
			}
			if err := cp.p.Close(); !errors.Is(err, pool.ErrClosed) {
				t.Fatalf("second Close: %v", err)
			}
		})
	}
}

// campaign drives random operations on one pool and checks it.
type campaign struct {
	t       *testing.T
	sd      *sim.Device
	p       *pool.Pool
	backend pool.Backend
	sizes   *tlsf.Index // the pool's size classes (64 lists)
	opts    pool.Options
	rng     *rand.Rand
	streams []device.Stream
	live    []campaignBlock
	nextPat uint32
	ooms    int
	onStep  func(step int)
}

type campaignBlock struct {
	block
	rounded uint64
	stream  device.Stream
}

func newCampaign(t *testing.T, be pool.Backend, cacheOff bool, seed uint64, tune func(*pool.Options)) *campaign {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: 256 << 20, Shadow: true, Seed: seed})
	o := pool.Options{
		Backend:         be,
		GrowFraction:    1.0 / 64, // 4 MiB growths: many of them
		ReleaseFraction: 0.05,     // and releases
		Cache:           pool.CacheOptions{Disable: cacheOff, Eager: !cacheOff},
		IdleRelease:     -1, // every driver call, and every fault, is the campaign's own
	}
	if tune != nil {
		tune(&o)
	}
	p, err := pool.New(sd, o)
	if err != nil {
		t.Fatal(err)
	}
	sizes, err := tlsf.New(tlsf.Config{Granularity: 256, SLLog2: 6})
	if err != nil {
		t.Fatal(err)
	}
	cp := &campaign{t: t, sd: sd, p: p, backend: be, sizes: sizes, opts: o, rng: rand.New(rand.NewPCG(seed, 99)), streams: []device.Stream{0}, nextPat: 0xca000000}
	for range 2 {
		s, err := sd.StreamCreate()
		if err != nil {
			t.Fatal(err)
		}
		cp.streams = append(cp.streams, s)
	}
	return cp
}

// size draws a request: mostly small, some of a few MiB, a few large
// enough to run the device out.
func (cp *campaign) size() uint64 {
	switch x := cp.rng.IntN(100); {
	case x < 70:
		return 1 + cp.rng.Uint64N(64<<10)
	case x < 95:
		return 1 + cp.rng.Uint64N(4<<20)
	default:
		return 1 + cp.rng.Uint64N(96<<20)
	}
}

// run runs steps random operations: in the first half on the default
// stream only (the pool's single-stream mode, where frees mark the stream
// for synchronization), then on three streams (events, pending frees).
func (cp *campaign) run(steps int) {
	for step := range steps {
		if cp.onStep != nil {
			cp.onStep(step)
		}
		multi := step >= steps/2
		switch x := cp.rng.IntN(100); {
		case x < 40 && len(cp.live) < 64:
			cp.alloc(cp.size(), 0)
		case x < 46 && len(cp.live) < 64 && multi:
			cp.alloc(1+cp.rng.Uint64N(256<<10), cp.streams[1+cp.rng.IntN(2)])
		case x < 49 && len(cp.live) < 64:
			cp.allocPitch(1+cp.rng.Uint64N(8192), 1+cp.rng.Uint64N(64))
		case x < 98:
			if len(cp.live) > 0 {
				cp.free(cp.rng.IntN(len(cp.live)))
			}
		default:
			if _, err := cp.p.Trim(); err != nil {
				cp.failed("Trim", err)
			}
		}
		if step == steps/2-1 {
			// A free on the default stream, past the caches, just before
			// other streams appear: they must wait for it
			// (cuStreamWaitEvent). Make room for it first.
			for len(cp.live) > 8 {
				cp.free(0)
			}
			cp.alloc(2<<20, 0)
			if n := len(cp.live); n > 0 && cp.live[n-1].size == 2<<20 {
				cp.free(n - 1)
			}
			cp.alloc(4096, cp.streams[1])
		}
		cp.check(step)
	}
}

func (cp *campaign) alloc(size uint64, s device.Stream) {
	ptr, err := cp.p.AllocOn(size, s)
	if err != nil {
		cp.failed(fmt.Sprintf("AllocOn(%d)", size), err)
		return
	}
	cp.placed(campaignBlock{block: block{ptr: ptr, size: size}, rounded: cp.blockSize(size, s), stream: s})
}

// blockSize is the size Stats count a block of size bytes allocated on
// stream s at (poolmodel.BlockSize).
func (cp *campaign) blockSize(size uint64, s device.Stream) uint64 {
	return poolmodel.BlockSize(cp.opts, func(n uint64) uint64 { _, r := cp.sizes.SizeClass(n); return r }, size, s)
}

func (cp *campaign) allocPitch(w, h uint64) {
	ptr, pitch, err := cp.p.AllocPitch(w, h)
	if err != nil {
		cp.failed(fmt.Sprintf("AllocPitch(%d, %d)", w, h), err)
		return
	}
	_, r := cp.sizes.SizeClass(pitch * h)
	cp.placed(campaignBlock{block: block{ptr: ptr, size: pitch * h}, rounded: r})
}

func (cp *campaign) placed(b campaignBlock) {
	t := cp.t
	for _, o := range cp.live {
		if b.ptr < o.ptr+uintptr(o.size) && o.ptr < b.ptr+uintptr(b.size) {
			t.Fatalf("[%#x +%d) overlaps live [%#x +%d)", b.ptr, b.size, o.ptr, o.size)
		}
	}
	cp.nextPat++
	b.pat = cp.nextPat
	var err error
	if b.stream == 0 {
		err = cp.sd.MemsetD32(b.ptr, b.pat, b.size/4)
	} else {
		err = cp.sd.MemsetD32Async(b.ptr, b.pat, b.size/4, b.stream)
	}
	if err != nil {
		t.Fatalf("new block [%#x +%d) cannot be written: %v", b.ptr, b.size, err)
	}
	cp.live = append(cp.live, b)
}

func (cp *campaign) free(i int) {
	b := cp.live[i]
	expectSampled(cp.t, cp.sd, b.block)
	if err := cp.p.FreeOn(b.ptr, b.stream); err != nil {
		cp.failed(fmt.Sprintf("FreeOn(%#x)", b.ptr), err) // still live: freed again later
		return
	}
	cp.live = slices.Delete(cp.live, i, i+1)
}

// failed checks the error of a valid call under faults.
func (cp *campaign) failed(what string, err error) {
	switch {
	case errors.Is(err, pool.ErrOutOfMemory):
		cp.ooms++
	case errors.Is(err, device.ErrInjected):
	default:
		cp.t.Fatalf("%s: %v", what, err)
	}
}

func (cp *campaign) check(step int) {
	t := cp.t
	if err := cp.p.Check(); err != nil {
		t.Fatalf("step %d: Check: %v", step, err)
	}
	st := cp.p.Stats()
	if d := deviceBytes(cp.sd, cp.backend); st.Reserved != d {
		t.Fatalf("step %d: Reserved %d, the device holds %d for the pool", step, st.Reserved, d)
	}
	var allocated uint64
	for _, b := range cp.live {
		allocated += b.rounded
	}
	if st.Allocated != allocated || st.Allocations != int64(len(cp.live)) {
		t.Fatalf("step %d: Allocated %d in %d; live blocks hold %d in %d", step, st.Allocated, st.Allocations, allocated, len(cp.live))
	}
	// Every peak at least the figure now: a mapping that failed and whose
	// undo failed too leaves pages mapped (strays), counted as reserved,
	// and raised no peak before noteMapping noted it.
	if st.ReservedPeak < st.Reserved || st.AllocatedPeak < st.Allocated || st.ActivePeak < st.Active || st.AllocationsPeak < st.Allocations {
		t.Fatalf("step %d: a peak below its figure: reserved %d/%d, allocated %d/%d, active %d/%d, allocations %d/%d", step,
			st.ReservedPeak, st.Reserved, st.AllocatedPeak, st.Allocated, st.ActivePeak, st.Active, st.AllocationsPeak, st.Allocations)
	}
	if v := cp.sd.Violations(); len(v) > 0 {
		t.Fatalf("step %d: Sim violations: %q", step, v)
	}
}

// recover stops the faults and checks that the pool serves again and
// gives everything back.
func (cp *campaign) recover() {
	t, p := cp.t, cp.p
	cp.sd.ClearFaults()
	for len(cp.live) > 0 {
		b := cp.live[0]
		expectSampled(t, cp.sd, b.block)
		if err := p.FreeOn(b.ptr, b.stream); err != nil {
			t.Fatalf("free of a live block once faults stopped: %v", err)
		}
		cp.live = cp.live[1:]
	}
	cp.check(-1)
	for i := range 50 {
		size := uint64(1+i) * 40000
		ptr, err := p.Alloc(size)
		if err != nil {
			t.Fatalf("Alloc(%d) once faults stopped: %v", size, err)
		}
		cp.placed(campaignBlock{block: block{ptr: ptr, size: size}, rounded: cp.blockSize(size, 0)})
	}
	cp.check(-2)
	for _, b := range cp.live {
		expectSampled(t, cp.sd, b.block)
		if err := p.Free(b.ptr); err != nil {
			t.Fatalf("Free once faults stopped: %v", err)
		}
	}
	cp.live = nil
	if _, err := p.Trim(); err != nil {
		t.Fatalf("Trim once faults stopped: %v", err)
	}
	cp.check(-3)
	if st := p.Stats(); st.Reserved != 0 || st.Allocated != 0 {
		t.Fatalf("after freeing everything and Trim: %+v", st)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if st := cp.sd.Stats(); cp.sd.Mapped() != 0 || st.Handles != 0 || st.LinearAllocs != 0 || st.Reservations != 0 || st.Events != 0 {
		t.Fatalf("after Close the device holds %+v", st)
	}
	if v := cp.sd.Violations(); len(v) > 0 {
		t.Fatalf("Sim violations: %q", v)
	}
	if err := cp.sd.Check(); err != nil {
		t.Fatal(err)
	}
}

// expectSampled checks block b's pattern at its ends and at eight points
// between: cheaper than expectPattern for blocks of many MiB.
func expectSampled(t testing.TB, sd *sim.Device, b block) {
	t.Helper()
	n := b.size / 4 * 4
	if n == 0 {
		return
	}
	const sample = 64
	for k := uint64(0); k <= 8; k++ {
		off := min(n*k/8&^3, n-min(n, sample))
		expectPattern(t, sd, "sample", block{ptr: b.ptr + uintptr(off), size: min(sample, n-off), pat: b.pat})
	}
}
