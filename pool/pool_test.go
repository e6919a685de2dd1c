package pool

import (
	"fmt"
	"math/rand/v2"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

func TestAllocPitchGivesTheH200Pitches(t *testing.T) {
	cases := []struct {
		width, height uint64
		pitch         uint64 // measured with cuMemAllocPitch on an H200
	}{
		{4, 1, 512},
		{4, 1000, 512},
		{512, 7, 512},
		{513, 7, 1024},
		{2052, 1, 2560},
		{2052, 300, 2560},
		{16000, 1, 16384},
		{16000, 65, 16384},
	}
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be})
			for _, tc := range cases {
				before := p.Stats()
				ptr, pitch, err := p.AllocPitch(tc.width, tc.height)
				require.NoError(t, err)
				require.Equal(t, tc.pitch, pitch, "pitch of a %d-byte row", tc.width)
				require.Zero(t, ptr%512, "pointer %#x not aligned to the pitch unit", ptr)
				after := p.Stats()
				require.Equal(t, sizeClass(tc.pitch*tc.height), after.Allocated-before.Allocated,
					"%d × %d: Allocated counts pitch × height at its size class", tc.width, tc.height)
				require.Equal(t, sizeClass(tc.pitch*tc.height), after.Active-before.Active)
				checkStep(t, p, d)
				require.NoError(t, p.Free(ptr))
				require.Equal(t, before.Allocated, p.Stats().Allocated)
				checkStep(t, p, d)
			}
		})
	}
}

// parityOp is one step of a sequence run through two pools.
type parityOp struct {
	kind       byte // 'a' Alloc, 'p' AllocPitch, 'f' Free of live[freeSlot]
	size, w, h uint64
	freeSlot   int
}

func parityOps(seed uint64, n int) []parityOp {
	r := rand.New(rand.NewPCG(seed, 1))
	var ops []parityOp
	live := 0
	for range n {
		switch k := r.IntN(10); {
		case k < 2 && live > 0:
			ops = append(ops, parityOp{kind: 'f', freeSlot: r.IntN(live)})
			live--
		case k < 4:
			ops = append(ops, parityOp{kind: 'p', w: 1 + r.Uint64N(20000), h: 1 + r.Uint64N(100)})
			live++
		default:
			size := 1 + r.Uint64N(64*kiB)
			if r.IntN(4) == 0 {
				size = 1 + r.Uint64N(8*miB)
			}
			ops = append(ops, parityOp{kind: 'a', size: size})
			live++
		}
	}
	return ops
}

// runParity runs ops on p and returns the pitches it got and the Stats
// after each step.
func runParity(t *testing.T, d testDevice, p *Pool, ops []parityOp) (pitches []uint64, stats []Stats) {
	var live []uintptr
	for _, op := range ops {
		switch op.kind {
		case 'a':
			ptr, err := p.Alloc(op.size)
			require.NoError(t, err)
			live = append(live, ptr)
		case 'p':
			ptr, pitch, err := p.AllocPitch(op.w, op.h)
			require.NoError(t, err)
			live = append(live, ptr)
			pitches = append(pitches, pitch)
		case 'f':
			require.NoError(t, p.Free(live[op.freeSlot]))
			live = append(live[:op.freeSlot], live[op.freeSlot+1:]...)
		}
		stats = append(stats, p.Stats())
		checkStep(t, p, d)
	}
	for _, ptr := range live {
		require.NoError(t, p.Free(ptr))
	}
	return pitches, stats
}

func TestPassthroughAndPooledAgreeOnSizesAndStatistics(t *testing.T) {
	ops := parityOps(7, 300)
	for _, be := range pooledBackends {
		for _, cacheOff := range []bool{true, false} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				dp := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
				pt := openPool(t, dp, Options{Backend: BackendPassthrough})
				ptPitches, ptStats := runParity(t, dp, pt, ops)

				d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				pitches, stats := runParity(t, d, p, ops)

				require.Equal(t, ptPitches, pitches)
				for i := range ops {
					a, b := ptStats[i], stats[i]
					require.Equal(t, BackendPassthrough, a.Backend)
					require.Equal(t, be, b.Backend)
					require.Equal(t, a.Allocated, b.Allocated, "step %d", i)
					require.Equal(t, a.Allocations, b.Allocations, "step %d", i)
					require.Equal(t, a.Active, b.Active, "step %d", i)
					require.Equal(t, a.Allocs, b.Allocs, "step %d", i)
					require.Equal(t, a.Frees, b.Frees, "step %d", i)
					if cacheOff { // with caches on the peaks are an upper bound
						require.Equal(t, a.AllocatedPeak, b.AllocatedPeak, "step %d", i)
						require.Equal(t, a.AllocationsPeak, b.AllocationsPeak, "step %d", i)
						require.Equal(t, a.ActivePeak, b.ActivePeak, "step %d", i)
					} else {
						require.GreaterOrEqual(t, b.AllocatedPeak, a.AllocatedPeak, "step %d", i)
					}
				}
			})
		}
	}
}

// TestPassthroughEnvironmentValueUnknown: a value of TLSF_PASSTHROUGH
// that is neither on nor off fails New with ErrBadOptions naming it, and
// the device sees no call that keeps memory.
func TestPassthroughEnvironmentValueUnknown(t *testing.T) {
	for _, v := range []string{"enabled", "2", "passthrough"} {
		t.Setenv(PassthroughEnv, v)
		sd := sim.New(sim.Config{Capacity: giB})
		p, err := New(sd, Options{})
		require.ErrorIs(t, err, ErrBadOptions)
		require.Nil(t, p)
		require.Contains(t, err.Error(), PassthroughEnv+"=\""+v+"\"")
		require.Zero(t, sd.Mapped())
		on, err := PassthroughFromEnv()
		require.ErrorIs(t, err, ErrBadOptions)
		require.False(t, on)
		// Validating a configuration reads no environment.
		_, err = ParseConf("caches:false")
		require.NoError(t, err)
	}
}

func TestPassthroughIsChosenByOptionOrEnvironment(t *testing.T) {
	cases := []struct {
		name string
		env  string
		opts Options
		want Backend
	}{
		{"default", "", Options{}, BackendVMM},
		{"option", "", Options{Backend: BackendChunks, Passthrough: true}, BackendPassthrough},
		{"backend", "", Options{Backend: BackendPassthrough}, BackendPassthrough},
		{"environment overrides vmm", "1", Options{Backend: BackendVMM}, BackendPassthrough},
		{"environment overrides chunks", "1", Options{Backend: BackendChunks}, BackendPassthrough},
		{"environment 0 leaves the backend", "0", Options{Backend: BackendChunks}, BackendChunks},
		{"environment off leaves the backend", " Off ", Options{Backend: BackendChunks}, BackendChunks},
		{"environment true", "true", Options{Backend: BackendVMM}, BackendPassthrough},
		{"environment yes", "YES", Options{Backend: BackendVMM}, BackendPassthrough},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv(PassthroughEnv, tc.env)
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, tc.opts)
			require.Equal(t, tc.want, p.Backend())
			require.Equal(t, tc.want, p.Stats().Backend)
			if tc.want != BackendPassthrough {
				return
			}
			// Every request is a driver call of its own.
			before := sd.Counts()
			a, err := p.Alloc(100)
			require.NoError(t, err)
			b, _, err := p.AllocPitch(100, 3)
			require.NoError(t, err)
			after := sd.Counts()
			require.Equal(t, before[device.CallMemAlloc]+1, after[device.CallMemAlloc])
			require.Equal(t, before[device.CallMemAllocPitch]+1, after[device.CallMemAllocPitch])
			require.Equal(t, 2, sd.Stats().LinearAllocs)
			require.NoError(t, p.Free(a))
			require.NoError(t, p.Free(b))
			require.Equal(t, after[device.CallMemFree]+2, sd.Counts()[device.CallMemFree])
			require.Zero(t, sd.Mapped())
			checkStep(t, p, d)
		})
	}
}

func TestProcessesSharingAGPUEachGetTheirFraction(t *testing.T) {
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			sim1 := sim.New(sim.Config{Capacity: giB})
			sim2 := sim1.NewProcess()
			d1, d2 := onSim(sim1), onSim(sim2)
			p1 := openPool(t, d1, Options{Backend: be, MaxFraction: 0.5})
			p2 := openPool(t, d2, Options{Backend: be, MaxFraction: 0.5})

			// The first takes half the GPU.
			a, err := p1.Alloc(400 * miB)
			require.NoError(t, err)
			b, err := p1.Alloc(112 * miB)
			require.NoError(t, err)
			_, err = p1.Alloc(2 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory, "above half of what is available")
			checkStep(t, p1, d1)

			// The second may take half of the GPU too, whatever the first
			// holds: the cap is a fraction of total memory (share.go).
			c, err := p2.Alloc(200 * miB)
			require.NoError(t, err)
			e, err := p2.Alloc(312 * miB)
			require.NoError(t, err)
			checkStep(t, p2, d2)
			before := p2.Stats()
			for _, n := range []uint64{2 * miB, 100 * miB, giB} {
				_, err = p2.Alloc(n)
				require.ErrorIs(t, err, ErrOutOfMemory, "%d bytes", n)
				require.NotErrorIs(t, err, device.ErrOutOfMemory, "the cap, not the driver, refused")
				after := p2.Stats()
				require.Equal(t, withoutCounters(before), withoutCounters(after), "a refused request changes nothing")
				checkStep(t, p2, d2)
			}
			require.Equal(t, before.OutOfMemory+3, p2.Stats().OutOfMemory)

			// When the first process gives memory back, the second's cap
			// stays where it was: shares do not depend on who came first.
			require.NoError(t, p1.Free(a))
			_, err = p1.Trim()
			require.NoError(t, err)
			checkStep(t, p1, d1)
			_, err = p2.Alloc(2 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			checkStep(t, p2, d2)
			for _, ptr := range []uintptr{c, e} {
				require.NoError(t, p2.Free(ptr))
			}
			require.NoError(t, p1.Free(b))
			require.NoError(t, sim1.Check())
		})
	}
}

func TestAGPUTakenByAnotherProcessGivesTheDriversOutOfMemory(t *testing.T) {
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			sim1 := sim.New(sim.Config{Capacity: giB})
			sim2 := sim1.NewProcess()
			d2 := onSim(sim2)
			p2 := openPool(t, d2, Options{Backend: be})
			keep, err := p2.Alloc(10 * miB)
			require.NoError(t, err)
			require.NoError(t, sim1.Occupy(giB-sim2.Used()-3*miB))
			// 3 MiB are left on the device.
			before := p2.Stats()
			_, err = p2.Alloc(6 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			require.Equal(t, liveState(before), liveState(p2.Stats()))
			checkStep(t, p2, d2)
			require.NoError(t, p2.Free(keep))
		})
	}
}

func TestCloseReturnsEverythingAndLaterCallsFailWithErrClosed(t *testing.T) {
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: giB})
				d := onSim(sd)
				ss := newStreams(t, sd, 2)
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				// Live blocks of every kind, cached ones, and frees
				// pending on a held stream.
				var live []uintptr
				for _, n := range []uint64{kiB, 4 * kiB, 64 * kiB, 3 * miB} {
					ptr, err := p.Alloc(n)
					require.NoError(t, err)
					live = append(live, ptr)
				}
				q, _, err := p.AllocPitch(2052, 10)
				require.NoError(t, err)
				live = append(live, q)
				for range 10 {
					ptr, err := p.Alloc(4 * kiB)
					require.NoError(t, err)
					require.NoError(t, p.Free(ptr))
				}
				pend, err := p.AllocOn(2*miB, ss[0])
				require.NoError(t, err)
				onB, err := p.AllocOn(2*miB, ss[1])
				require.NoError(t, err)
				live = append(live, onB)
				require.NoError(t, sd.HoldStream(ss[0]))
				require.NoError(t, sd.MemsetD32Async(pend, 1, wordCount(2*miB), ss[0]))
				require.NoError(t, p.FreeOn(pend, ss[0]))
				checkStep(t, p, d)

				require.NoError(t, p.Close())
				require.Zero(t, sd.Mapped(), "Close returns live memory too")
				require.Empty(t, sd.Violations(), "Close waits for pending frees before unmapping")
				require.NoError(t, sd.Check())
				require.Zero(t, sd.Stats().Events, "Close destroys its events")

				require.ErrorIs(t, p.Close(), ErrClosed)
				require.ErrorIs(t, p.Check(), ErrClosed)
				calls := map[string]func() error{
					"Alloc small":  func() error { _, err := p.Alloc(4 * kiB); return err },
					"Alloc large":  func() error { _, err := p.Alloc(4 * miB); return err },
					"AllocOn":      func() error { _, err := p.AllocOn(4*kiB, ss[1]); return err },
					"AllocPitch":   func() error { _, _, err := p.AllocPitch(100, 2); return err },
					"Trim":         func() error { _, err := p.Trim(); return err },
					"Free foreign": func() error { return p.Free(0x1000) },
				}
				for i, ptr := range live {
					calls[fmt.Sprintf("Free live %d", i)] = func() error { return p.Free(ptr) }
					calls[fmt.Sprintf("FreeOn live %d", i)] = func() error { return p.FreeOn(ptr, ss[1]) }
				}
				for name, call := range calls {
					require.ErrorIs(t, call(), ErrClosed, name)
				}
				require.Zero(t, sd.Mapped())
			})
		}
	}
}

func TestNewWithAnInitialReserveBeyondTheCapIsRefused(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	_, err := New(sd, Options{InitialFraction: 0.5, MaxBytes: 64 * miB})
	require.ErrorIs(t, err, ErrBadOptions)
	_, err = New(sd, Options{InitialFraction: 0.5, MaxFraction: 0.25})
	require.ErrorIs(t, err, ErrBadOptions)
	require.Zero(t, sd.Mapped(), "a refused New holds nothing")
	require.NoError(t, sd.Check())
	require.Zero(t, sd.Stats().Reservations)
}

// A VMM pool whose VirtualSize is below its initial reserve could never
// map that reserve: New refuses the options, rather than fail the
// reserve with ErrTooLarge.
func TestNewWithAnInitialReserveBeyondTheVirtualRangeIsRefused(t *testing.T) {
	sd := sim.New(sim.Config{Capacity: giB})
	_, err := New(sd, Options{Backend: BackendVMM, InitialFraction: 0.5, VirtualSize: 64 * miB})
	require.ErrorIs(t, err, ErrBadOptions)
	require.NotErrorIs(t, err, ErrTooLarge)
	require.Contains(t, err.Error(), "VirtualSize")
	require.Zero(t, sd.Mapped(), "a refused New holds nothing")
	require.Zero(t, sd.Stats().Reservations)
	require.NoError(t, sd.Check())
	// A range that holds the reserve is accepted.
	p, err := New(sd, Options{Backend: BackendVMM, InitialFraction: 0.5, VirtualSize: 512 * miB})
	require.NoError(t, err)
	require.NoError(t, p.Close())
}

// A device that refuses New's memory for want of it fails New with the
// pool's ErrOutOfMemory, which wraps the driver's device.ErrOutOfMemory
// (errors.go: every failure for want of memory matches ErrOutOfMemory).
func TestNewOutOfDeviceMemoryIsErrOutOfMemory(t *testing.T) {
	cases := []struct {
		name string
		be   Backend
		call device.Call
	}{
		{"initial reserve, VMM", BackendVMM, device.CallMemCreate},
		{"initial reserve, chunks", BackendChunks, device.CallMemAlloc},
		{"virtual range", BackendVMM, device.CallAddressReserve},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			sd.FailRate(c.call, 1, device.ErrOutOfMemory)
			_, err := New(sd, Options{Backend: c.be, InitialFraction: 0.25})
			require.ErrorIs(t, err, ErrOutOfMemory)
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			require.Zero(t, sd.Mapped(), "a failed New holds nothing")
			st := sd.Stats()
			require.Zero(t, st.Used)
			require.Zero(t, st.Reservations)
		})
	}
}

// An aligned search needs a free block of the size class of the request
// plus the alignment's padding: growth must make that much room, even
// when the request fills a granule, a chunk, or the free tail exactly.
func TestAPitchAllocationThatFillsItsGrowthExactlySucceeds(t *testing.T) {
	cases := []struct{ width, height uint64 }{
		{512, 4096},      // 2 MiB: one granule
		{1024, 4096},     // 4 MiB
		{16384, 640},     // 10 MiB
		{3531, 108},      // 387072 bytes: between two size classes
		{2052 + 512, 33}, // odd rows
	}
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be})
			for _, tc := range cases {
				ptr, pitch, err := p.AllocPitch(tc.width, tc.height)
				require.NoError(t, err, "%d × %d", tc.width, tc.height)
				require.Zero(t, ptr%512)
				require.NoError(t, d.MemsetD32(ptr, 1, wordCount(pitch*tc.height)))
				checkStep(t, p, d)
			}
			require.Zero(t, p.Stats().OutOfMemory)
		})
	}
}

// 2^64−1 is the empty-slot key of the address tables under the index and
// the caches: freeing it once found an "entry" there and freed a random
// live block (caches off) or corrupted a cache (caches on).
func TestFreeingAnAddressNoBlockCanStartAtFreesNothing(t *testing.T) {
	for _, be := range allBackends {
		for _, cm := range cacheModes {
			t.Run(be.String()+"/"+cm.name, func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				p := openPool(t, d, Options{Backend: be, Cache: cm.opts()})
				a, err := p.Alloc(4 * kiB)
				require.NoError(t, err)
				b, err := p.Alloc(3 * miB)
				require.NoError(t, err)
				before := p.Stats()
				for _, ptr := range []uintptr{^uintptr(0), ^uintptr(0) - 255, a + 1, b + 4} {
					require.ErrorIs(t, p.Free(ptr), ErrUnknownPointer, "%#x", ptr)
					require.Equal(t, withoutCounters(before), withoutCounters(p.Stats()))
					checkStep(t, p, d)
				}
				require.NoError(t, p.Free(a))
				require.NoError(t, p.Free(b))
			})
		}
	}
}
