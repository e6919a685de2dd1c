package pool

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// guardConfigs: guard mode on every backend, caches on and off.
func guardConfigs(guard uint64) []Options {
	var out []Options
	for _, be := range allBackends {
		for _, off := range []bool{false, true} {
			out = append(out, Options{Backend: be, Guard: guard, Cache: CacheOptions{Disable: off}})
		}
	}
	return out
}

func guardName(o Options) string { return configName(o.Backend, o.Cache.Disable) }

// openGuarded opens a pool with o on a simulated GPU of 1 GiB that keeps
// memory contents (guard mode reads red zones back).
func openGuarded(t *testing.T, o Options) (*Pool, *sim.Device, testDevice) {
	t.Helper()
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	return openPool(t, d, o), sd, d
}

// storeByte writes one byte as a kernel would.
func storeByte(t *testing.T, sd *sim.Device, at uintptr, v byte) {
	t.Helper()
	require.NoError(t, sd.StoreByte(at, v, 0))
}

func TestGuardCatchesOneByteOverrunOnFree(t *testing.T) {
	for _, o := range guardConfigs(64) {
		t.Run(guardName(o), func(t *testing.T) {
			p, sd, d := openGuarded(t, o)
			const size = 1000 // not a multiple of 4 or 256: the zone starts mid-word
			ptr, err := p.Alloc(size)
			require.NoError(t, err)
			checkStep(t, p, d)
			storeByte(t, sd, ptr+size-1, 0x11) // the last byte of the block: fine
			require.NoError(t, p.Check())

			storeByte(t, sd, ptr+size, 0x22) // one byte past the end
			before := p.Stats()
			err = p.Free(ptr)
			require.ErrorIs(t, err, ErrCorrupted)
			msg := err.Error()
			require.Contains(t, msg, fmt.Sprintf("block %#x of %d bytes", ptr, size))
			require.Contains(t, msg, fmt.Sprintf("byte %#x (0 past the end) is 0x22", ptr+size))
			require.Equal(t, before, p.Stats(), "a failed free changes no statistic")
			checkStep(t, p, d) // the zone was filled again: Check passes

			// Reported once: the block frees now.
			require.NoError(t, p.Free(ptr))
			checkStep(t, p, d)
			require.Zero(t, p.Stats().Allocated)
		})
	}
}

func TestGuardCheckReportsOverrun(t *testing.T) {
	for _, o := range guardConfigs(16) {
		t.Run(guardName(o), func(t *testing.T) {
			p, sd, d := openGuarded(t, o)
			var ptrs []uintptr
			for _, n := range []uint64{1, 256, 4097, 3 * miB} {
				ptr, err := p.Alloc(n)
				require.NoError(t, err)
				ptrs = append(ptrs, ptr)
			}
			checkStep(t, p, d)
			// The last byte of the red zone of the 4097-byte block.
			storeByte(t, sd, ptrs[2]+4097+15, 0x00)
			err := p.Check()
			require.ErrorIs(t, err, ErrCorrupted)
			require.Contains(t, err.Error(), fmt.Sprintf("block %#x of 4097 bytes", ptrs[2]))
			require.Contains(t, err.Error(), "(15 past the end) is 0x00")
			// A write beyond the red zone is not seen.
			require.ErrorIs(t, p.Free(ptrs[2]), ErrCorrupted)
			require.NoError(t, p.Free(ptrs[2]))
			for _, ptr := range []uintptr{ptrs[0], ptrs[1], ptrs[3]} {
				require.NoError(t, p.Free(ptr))
			}
			checkStep(t, p, d)
		})
	}
}

// Statistics in guard mode are those of the same requests without it.
func TestGuardStatisticsExcludeRedZones(t *testing.T) {
	sizes := []uint64{1, 255, 256, 1000, 64 * kiB, 2*miB - 1, 5 * miB}
	for _, o := range guardConfigs(256) {
		t.Run(guardName(o), func(t *testing.T) {
			plain := o
			plain.Guard = 0
			run := func(o Options) []Stats {
				p, _, d := openGuarded(t, o)
				var out []Stats
				var ptrs []uintptr
				for _, n := range sizes {
					ptr, err := p.Alloc(n)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
					out = append(out, liveState(p.Stats()))
				}
				for _, ptr := range ptrs[:3] {
					require.NoError(t, p.Free(ptr))
					out = append(out, liveState(p.Stats()))
				}
				checkStep(t, p, d)
				return out
			}
			got, want := run(o), run(plain)
			for i := range want {
				require.Equal(t, want[i].Allocated, got[i].Allocated, "step %d: Allocated", i)
				require.Equal(t, want[i].Allocations, got[i].Allocations, "step %d: Allocations", i)
				require.Equal(t, want[i].Active, got[i].Active, "step %d: Active", i)
				// With caches on, a peak without guard counts the blocks
				// caches hold (an upper bound); with guard it is the exact
				// peak of live blocks, so it lies between.
				if o.Cache.Disable {
					require.Equal(t, want[i].AllocatedPeak, got[i].AllocatedPeak, "step %d: AllocatedPeak", i)
				} else {
					require.LessOrEqual(t, got[i].AllocatedPeak, want[i].AllocatedPeak, "step %d: AllocatedPeak", i)
					require.GreaterOrEqual(t, got[i].AllocatedPeak, got[i].Allocated, "step %d: AllocatedPeak", i)
				}
			}
		})
	}
}

// Bad input in guard mode gets the pool's own errors, and changes nothing.
func TestGuardBadInput(t *testing.T) {
	for _, o := range guardConfigs(8) {
		t.Run(guardName(o), func(t *testing.T) {
			p, _, d := openGuarded(t, o)
			ptr, err := p.Alloc(100)
			require.NoError(t, err)
			before := p.Stats()
			_, err = p.Alloc(0)
			require.ErrorIs(t, err, ErrInvalidSize)
			_, err = p.Alloc(^uint64(0) - 3)
			require.ErrorIs(t, err, ErrTooLarge)
			require.True(t, errors.Is(p.Free(ptr+256), ErrUnknownPointer) || errors.Is(p.Free(ptr+256), ErrDoubleFree))
			require.Equal(t, withoutCounters(before), withoutCounters(p.Stats()))
			checkStep(t, p, d)
			require.NoError(t, p.Free(ptr))
			require.ErrorIs(t, p.Free(ptr), ErrDoubleFree)
			checkStep(t, p, d)
		})
	}
}

func TestGuardOptions(t *testing.T) {
	_, err := New(sim.New(sim.Config{}), Options{Guard: MaxGuard + 1})
	require.ErrorIs(t, err, ErrBadOptions)
	_, err = New(noByteFills{sim.New(sim.Config{})}, Options{Guard: 8})
	require.ErrorIs(t, err, ErrBadOptions)
	// Without shadow memory every red zone would read as overwritten.
	_, err = New(sim.New(sim.Config{}), Options{Guard: 8})
	require.ErrorIs(t, err, ErrBadOptions)
	require.Contains(t, err.Error(), "Shadow")
	p, err := New(sim.New(sim.Config{}), Options{})
	require.NoError(t, err)
	require.Nil(t, p.dbg, "no guard, no checker: no debug layer")
	require.NoError(t, p.Close())
}

// noByteFills hides the simulated device's optional interfaces.
type noByteFills struct{ device.Device }

// Blocks allocated and freed on another stream: the red zone is filled on
// that stream and verified after it.
func TestGuardOnStreams(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
			d := onSim(sd)
			ss := newStreams(t, sd, 1)
			p := openPool(t, d, Options{Backend: be, Guard: 32})
			ptr, err := p.AllocOn(300, ss[0])
			require.NoError(t, err)
			checkStep(t, p, d)
			require.NoError(t, sd.StoreByte(ptr+300+31, 1, ss[0]))
			require.ErrorIs(t, p.FreeOn(ptr, ss[0]), ErrCorrupted)
			require.NoError(t, p.FreeOn(ptr, ss[0]))
			require.NoError(t, p.ForgetStream(ss[0]))
			checkStep(t, p, d)
		})
	}
}

// Goroutines allocating and freeing at once in guard mode with a checker
// attached: every red zone intact, every region gone at the end, and the
// statistics those of no guard (run it with -race).
func TestGuardConcurrent(t *testing.T) {
	for _, cm := range cacheModes {
		t.Run(cm.name, func(t *testing.T) {
			chk := withChecker(t)
			sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: BackendChunks, Guard: 16, Cache: cm.opts()})
			var wg sync.WaitGroup
			errs := make(chan error, 8)
			for g := 0; g < 8; g++ {
				wg.Add(1)
				go func() {
					defer wg.Done()
					var mine []uintptr
					for i := 0; i < 200; i++ {
						ptr, err := p.Alloc(uint64(100 + 37*((g*200+i)%50)))
						if err != nil {
							errs <- err
							return
						}
						mine = append(mine, ptr)
						if len(mine) > 5 {
							if err := p.Free(mine[0]); err != nil {
								errs <- err
								return
							}
							mine = mine[1:]
						}
					}
					for _, ptr := range mine {
						if err := p.Free(ptr); err != nil {
							errs <- err
							return
						}
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				require.NoError(t, err)
			}
			checkStep(t, p, d)
			s := p.Stats()
			require.Zero(t, s.Allocated)
			require.Zero(t, s.Allocations)
			_, regions := chk.live()
			require.Zero(t, regions)
		})
	}
}

// Two frees of one block at once in guard mode: the second, arriving
// while the first reads the red zone, is a double free; the first frees
// the block, and the layer's and the pool's counters agree after.
func TestGuardConcurrentDoubleFreeIsRefused(t *testing.T) {
	for _, o := range guardConfigs(256) {
		t.Run(guardName(o), func(t *testing.T) {
			p, sd, d := openGuarded(t, o)
			x, err := p.Alloc(64 * kiB)
			require.NoError(t, err)
			var second error
			armed := true
			sd.SetHook(func(c device.Call) {
				if c == device.CallMemcpyDtoH && armed {
					armed = false
					second = p.Free(x) // the other goroutine's, at this moment
				}
			})
			require.NoError(t, p.Free(x))
			sd.SetHook(nil)
			require.False(t, armed, "the red zone was read")
			require.ErrorIs(t, second, ErrDoubleFree)
			require.ErrorIs(t, p.Free(x), ErrDoubleFree)
			s := p.Stats()
			require.Zero(t, s.Allocated)
			require.Zero(t, s.Allocations)
			checkStep(t, p, d)
			y, err := p.Alloc(64 * kiB)
			require.NoError(t, err)
			require.NoError(t, p.Free(y))
			checkStep(t, p, d)
		})
	}
}

// A Close that another goroutine starts while guard mode fills or reads
// a red zone waits for it: the fill and the read are on mapped memory,
// the call returns its block or ErrClosed, never a device error.
func TestGuardCloseWaitsForARedZoneInFlight(t *testing.T) {
	for _, call := range []device.Call{device.CallMemsetD8Async, device.CallMemcpyDtoH} {
		for _, o := range guardConfigs(256) {
			t.Run(call.String()+"/"+guardName(o), func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
				p, err := New(sd, o)
				require.NoError(t, err)
				x, err := p.Alloc(4096)
				require.NoError(t, err)
				closed := make(chan error, 1)
				armed := true
				sd.SetHook(func(c device.Call) {
					if c == call && armed {
						armed = false
						go func() { closed <- p.Close() }()
						time.Sleep(2 * time.Millisecond) // room for the Close to run, were it not waiting
					}
				})
				if call == device.CallMemsetD8Async {
					_, err = p.Alloc(4096)
				} else {
					err = p.Free(x)
				}
				if err != nil {
					require.ErrorIs(t, err, ErrClosed)
				}
				require.NoError(t, <-closed)
				sd.SetHook(nil)
				require.Empty(t, sd.Violations())
			})
		}
	}
}

// A request whose red zone cannot be filled (its stream refused, or the
// fill's driver call failed on the default stream) fails and changes no
// statistic: the layer frees the block it got and takes that allocation
// and free off the counters (debugLayer.undo). Before, each such failure
// counted an allocation and a free, and, on a stream the device refuses,
// left the block pending there (active and reserved up until a Trim).
// (On a stream with work queued, the block stays pending until that work
// completes, as after any free there: debugLayer.undo.)
func TestGuardFillFailureChangesNoStatistic(t *testing.T) {
	type view struct {
		allocs, frees              uint64
		allocated, allocatedPeak   uint64
		allocations, allocationsPk int64
		bySize                     [NumSizeBuckets]uint64
		active, pending            uint64
	}
	look := func(s Stats) view {
		return view{s.Allocs, s.Frees, s.Allocated, s.AllocatedPeak, s.Allocations, s.AllocationsPeak, s.AllocsBySize, s.Active, s.Pending}
	}
	for _, o := range guardConfigs(32) {
		for _, cause := range []string{"unknown stream", "fill fails"} {
			t.Run(guardName(o)+"/"+cause, func(t *testing.T) {
				p, sd, d := openGuarded(t, o)
				keep, err := p.Alloc(4096)
				require.NoError(t, err)
				before := p.Stats()
				s := device.Stream(0)
				if cause == "unknown stream" {
					s = device.Stream(0x1234) // never created: the simulated device refuses it
				} else {
					sd.FailNth(device.CallMemsetD8Async, 1, nil)
				}
				for _, size := range []uint64{1000, 64 * miB} {
					_, err := p.AllocOn(size, s)
					require.Error(t, err)
					checkStep(t, p, d)
					require.Equal(t, look(before), look(p.Stats()), "after a failed request of %d bytes: %v", size, err)
					if cause == "fill fails" {
						sd.FailNth(device.CallMemsetD8Async, 1, nil)
					}
				}
				sd.ClearFaults()
				require.NoError(t, p.Free(keep))
				_, err = p.Trim()
				require.NoError(t, err)
				st := p.Stats()
				require.Zero(t, st.Active)
				require.Zero(t, st.Allocations)
			})
		}
	}
}
