package pool

import (
	"bytes"
	"errors"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestFreeOfZeroIsANoOp(t *testing.T) {
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}, History: 8})
				a, err := p.Alloc(4 * kiB)
				require.NoError(t, err)
				before := p.Stats()
				require.NoError(t, p.Free(0))
				require.NoError(t, p.FreeOn(0, 0x1234))
				require.Equal(t, before, p.Stats())
				checkStep(t, p, d)
				require.NoError(t, p.Free(a))
				require.NoError(t, p.Close())
				require.NoError(t, p.Free(0), "Free(0) after Close")
			})
		}
	}
}

func TestResetPeaksSetsPeaksToTheCurrentValues(t *testing.T) {
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				big, err := p.Alloc(64 * miB)
				require.NoError(t, err)
				small, err := p.Alloc(3 * miB)
				require.NoError(t, err)
				require.NoError(t, p.Free(big))
				_, err = p.Trim()
				require.NoError(t, err)
				s := p.Stats()
				require.GreaterOrEqual(t, s.AllocatedPeak, 67*miB)

				p.ResetPeaks()
				s = p.Stats()
				require.Equal(t, s.Allocated, s.AllocatedPeak)
				require.Equal(t, s.Active, s.ActivePeak)
				require.Equal(t, s.Allocations, s.AllocationsPeak)
				require.Equal(t, s.Reserved, s.ReservedPeak)
				checkStep(t, p, d)

				// Peaks rise again from there.
				again, err := p.Alloc(8 * miB)
				require.NoError(t, err)
				s2 := p.Stats()
				require.Equal(t, s.AllocatedPeak+sizeClass(8*miB), s2.AllocatedPeak)
				require.NoError(t, p.Free(again))
				require.NoError(t, p.Free(small))
				checkStep(t, p, d)
			})
		}
	}
}

func TestSizeGivesTheUsableSizeOfALiveBlock(t *testing.T) {
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				sizes := []uint64{1, 300, 4 * kiB, 1*miB - 1, 5*miB + 3}
				var ptrs []uintptr
				for _, n := range sizes {
					ptr, err := p.Alloc(n)
					require.NoError(t, err)
					ptrs = append(ptrs, ptr)
					got, err := p.Size(ptr)
					require.NoError(t, err)
					if be == BackendPassthrough {
						require.Equal(t, n, got, "passthrough: what the driver allocated")
					} else {
						require.Equal(t, blockSizeOf(p, n), got, "size of a %d-byte request", n)
					}
				}
				before := p.Stats()
				_, err := p.Size(ptrs[3] + 256)
				require.ErrorIs(t, err, ErrUnknownPointer, "interior pointer")
				_, err = p.Size(ptrs[3] + 1)
				require.ErrorIs(t, err, ErrUnknownPointer, "misaligned pointer")
				require.NoError(t, p.Free(ptrs[2]))
				_, err = p.Size(ptrs[2])
				require.True(t, errors.Is(err, ErrDoubleFree) || errors.Is(err, ErrUnknownPointer), "freed pointer: %v", err)
				require.Equal(t, liveState(before).Allocs, liveState(p.Stats()).Allocs)
				checkStep(t, p, d)
				require.NoError(t, p.Close())
				_, err = p.Size(ptrs[0])
				require.ErrorIs(t, err, ErrClosed)
			})
		}
	}
}

func TestAllocsBySizeCountsEveryAllocationInItsBucket(t *testing.T) {
	require.Equal(t, 0, SizeBucket(1))
	require.Equal(t, 8, SizeBucket(256))
	require.Equal(t, 9, SizeBucket(257))
	require.Equal(t, 20, SizeBucket(1*miB))
	require.Equal(t, 64, SizeBucket(1<<63+1))
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				want := map[int]uint64{}
				for i := range 100 {
					n := uint64(256 + 1000*i)
					ptr, err := p.Alloc(n)
					require.NoError(t, err)
					want[SizeBucket(sizeClass(n))]++
					require.NoError(t, p.Free(ptr))
				}
				ptr, _, err := p.AllocPitch(1000, 10)
				require.NoError(t, err)
				want[SizeBucket(sizeClass(1024*10))]++
				require.NoError(t, p.Free(ptr))
				s := p.Stats()
				var sum uint64
				for k, n := range s.AllocsBySize {
					require.Equal(t, want[k], n, "bucket %d", k)
					sum += n
				}
				require.Equal(t, s.Allocs, sum)
			})
		}
	}
}

func TestOnOutOfMemoryRunsBeforeTheFailureAndThePoolRetries(t *testing.T) {
	for _, be := range allBackends {
		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff), func(t *testing.T) {
				d := onSim(sim.New(sim.Config{Capacity: giB}))
				var held []uintptr
				var calls []uint64
				var p *Pool
				p = openPool(t, d, Options{Backend: be, MaxBytes: 64 * miB, Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff},
					OnOutOfMemory: func(req uint64) {
						calls = append(calls, req)
						// As a finalizer would: free memory, through the pool.
						for _, ptr := range held {
							require.NoError(t, p.Free(ptr))
						}
						held = nil
					}})
				for range 12 {
					ptr, err := p.Alloc(4 * miB)
					require.NoError(t, err)
					held = append(held, ptr)
				}
				small, err := p.Alloc(256 * kiB) // a cached size: the hook's frees may land in caches
				require.NoError(t, err)
				held = append(held, small)
				require.Empty(t, calls)

				// 32 MiB does not fit under the cap until the hook frees.
				ptr, err := p.Alloc(32 * miB)
				require.NoError(t, err)
				require.Equal(t, []uint64{32 * miB}, calls)
				checkStep(t, p, d)

				// A request the hook cannot cure fails, after one call, and
				// leaves the pool as it was.
				before := p.Stats()
				_, err = p.Alloc(48 * miB)
				require.ErrorIs(t, err, ErrOutOfMemory)
				require.Equal(t, []uint64{32 * miB, 48 * miB}, calls)
				require.Equal(t, liveState(before), liveState(p.Stats()))
				// One above the cap can never succeed: it fails at once,
				// without the hook.
				_, err = p.Alloc(128 * miB)
				require.ErrorIs(t, err, ErrOutOfMemory)
				require.Equal(t, []uint64{32 * miB, 48 * miB}, calls)
				require.Equal(t, liveState(before), liveState(p.Stats()))
				checkStep(t, p, d)
				require.NoError(t, p.Free(ptr))
			})
		}
	}
}

// A hook that allocates from the pool, and fails, calls itself again: as
// deep as maxOOMHooks, then the request fails without it (before, until
// the goroutine's stack ran out).
func TestAnOutOfMemoryHookThatAllocatesIsBounded(t *testing.T) {
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			var p *Pool
			depth, deepest := 0, 0
			p = openPool(t, d, Options{Backend: be, MaxBytes: 64 * miB, OnOutOfMemory: func(req uint64) {
				depth++
				deepest = max(deepest, depth)
				_, err := p.Alloc(req)
				require.ErrorIs(t, err, ErrOutOfMemory)
				depth--
			}})
			held, err := p.Alloc(48 * miB)
			require.NoError(t, err)
			before := p.Stats()
			_, err = p.Alloc(32 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			require.Equal(t, maxOOMHooks, deepest)
			require.Equal(t, before.Reserved, p.Stats().Reserved)
			checkStep(t, p, d)
			require.NoError(t, p.Free(held))
		})
	}
}

func TestOnOutOfMemoryMayCloseThePool(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	var p *Pool
	p = openPool(t, d, Options{MaxBytes: 64 * miB, OnOutOfMemory: func(uint64) { require.NoError(t, p.Close()) }})
	_, err := p.Alloc(48 * miB)
	require.NoError(t, err)
	_, err = p.Alloc(32 * miB)
	require.ErrorIs(t, err, ErrClosed)
}

// The message of a VMM pool that returned all its memory used to say
// "reserved 0 bytes ... largest free block 10.00 GiB" (address space).
func TestOutOfMemoryMessageDoesNotContradictItself(t *testing.T) {
	for _, be := range allBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
			p := openPool(t, d, Options{Backend: be})
			a, err := p.Alloc(2 * giB)
			require.NoError(t, err)
			require.NoError(t, p.Free(a))
			_, err = p.Trim()
			require.NoError(t, err)
			require.NoError(t, d.sd.Occupy(3*giB)) // another process
			_, err = p.Alloc(2 * giB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			msg := err.Error()
			require.Contains(t, msg, "request of 2.00 GiB")
			require.Contains(t, msg, "reserved 0 bytes")
			require.Contains(t, msg, "largest block that could be allocated 1.00 GiB", msg)
			require.Contains(t, msg, "device free 1.00 GiB")
			d.sd.Vacate(3 * giB)
			checkStep(t, p, d)
		})
	}
}

// A request failed at the cap without a look at the device used to
// report the largest block from the memory the pool held alone: 0 bytes
// for a pool with room below its cap, which the next request then used.
func TestOutOfMemoryMessageCountsRoomBelowTheCap(t *testing.T) {
	for _, be := range []Backend{BackendVMM, BackendChunks} {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
			p := openPool(t, d, Options{Backend: be, MaxBytes: giB})
			_, err := p.Alloc(900 * miB)
			require.NoError(t, err)
			_, err = p.Alloc(200 * miB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			msg := err.Error()
			require.Contains(t, msg, "cap 1.00 GiB", msg)
			require.Contains(t, msg, "at the pool's last look", "no look at the device for this request")
			require.Contains(t, msg, "(within the cap, if the device still has the free memory of the last look)", msg)
			mib := float64(largestInMessage(t, msg)) / float64(miB)
			assert.GreaterOrEqual(t, mib, 100.0, msg)
			assert.LessOrEqual(t, mib, 124.0, msg)
			_, err = p.Alloc(uint64(mib) * miB)
			require.NoError(t, err, "the size the message gave: %s", msg)
			checkStep(t, p, d)
		})
	}
}

// On a device the pool found full (share.go), a request beyond 90% of
// its cap fails without a look, whatever its size, for a while: its
// message must not offer the last look's free memory, which the pool
// will not ask for then.
func TestOutOfMemoryMessageAtAFullDevicesLimit(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: 4 * giB}))
	p := openPool(t, d, Options{MaxBytes: giB, Cache: CacheOptions{Disable: true}})
	_, err := p.Alloc(900 * miB)
	require.NoError(t, err)
	d.sd.FailRate(device.CallMemCreate, 1, device.ErrOutOfMemory) // the driver refuses: a full device
	_, err = p.Alloc(60 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	d.sd.ClearFaults()
	free, _, err := d.sd.MemGetInfo()
	require.NoError(t, err)
	require.NoError(t, d.sd.Occupy(free-50*miB))
	_, err = p.Alloc(90 * miB) // looks, finds 50 MiB: the next ones skip the look
	require.ErrorIs(t, err, ErrOutOfMemory)
	_, err = p.Alloc(30 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	msg := err.Error()
	require.Contains(t, msg, "is not asked again for", msg)
	require.Contains(t, msg, "largest block that could be allocated 0 bytes (within the cap, without a new look at the full device)", msg)
	d.sd.Vacate(free - 50*miB)
	checkStep(t, p, d)
}

func TestLoggerReceivesGrowthReleaseTrimAndOutOfMemory(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Logger: log, MaxBytes: 256 * miB})
	a, err := p.Alloc(64 * miB)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	_, err = p.Trim()
	require.NoError(t, err)
	_, err = p.Alloc(512 * miB)
	require.ErrorIs(t, err, ErrOutOfMemory)
	out := buf.String()
	for _, want := range []string{
		`level=DEBUG msg="tlsf pool: grew" bytes=`,
		`level=DEBUG msg="tlsf pool: released" bytes=`,
		`level=INFO msg="tlsf pool: trim" bytes=`,
		`level=WARN msg="tlsf pool: out of memory" request=536870912`,
	} {
		require.Contains(t, out, want)
	}
	require.Equal(t, 1, strings.Count(out, "out of memory"))
}

// A request larger than the device fails without a look at the device
// (hopeless): its message used to give the free memory of the pool's last
// look, before the growth that mapped 100 GiB, as free now, and a largest
// block the device no longer had. The figures now count what the pool
// mapped since the look.
func TestOutOfMemoryMessageCountsWhatThePoolMappedSinceItsLook(t *testing.T) {
	for _, be := range []Backend{BackendVMM, BackendChunks} {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: 16 * giB}))
			p := openPool(t, d, Options{Backend: be, NoScavenger: true})
			a, err := p.Alloc(10 * giB)
			require.NoError(t, err)
			_, err = p.Alloc(20 * giB)
			require.ErrorIs(t, err, ErrOutOfMemory)
			msg := err.Error()
			free, _, err := d.MemGetInfo()
			require.NoError(t, err)
			require.Contains(t, msg, "device free "+sizeString(free), msg)
			assert.LessOrEqual(t, largestInMessage(t, msg), free+p.Stats().Reserved-p.Stats().Allocated+giB/100, msg)
			require.NoError(t, p.Free(a))
			checkStep(t, p, d)
		})
	}
}

// largestInMessage returns the bytes an out-of-memory message gives as the
// largest block that could be allocated (sizeString's exact figure).
func largestInMessage(t *testing.T, msg string) uint64 {
	t.Helper()
	m := regexp.MustCompile(`largest block that could be allocated (?:[0-9.]+ [KMGT]iB \()?([0-9]+) bytes`).FindStringSubmatch(msg)
	require.NotNil(t, m, msg)
	n, err := strconv.ParseUint(m[1], 10, 64)
	require.NoError(t, err)
	return n
}
