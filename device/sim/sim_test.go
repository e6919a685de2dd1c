package sim

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/devicetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const simMiB = 1 << 20

// simCheck fails the test if s's invariants are broken.
func simCheck(t testing.TB, s *Device) {
	t.Helper()
	require.NoError(t, s.Check())
}

func TestSimConformance(t *testing.T) {
	s := New(Config{Shadow: true})
	devicetest.Run(t, s)
	simCheck(t, s)
	assert.Empty(t, s.Violations())
	assert.Zero(t, s.Used(), "the suite frees everything")
	assert.Zero(t, s.LiveAllocations())
	st := s.Stats()
	assert.Zero(t, st.Reservations)
	assert.Zero(t, st.Streams)
	assert.Zero(t, st.Events)
}

func TestSimConformanceNoVMM(t *testing.T) {
	s := New(Config{Shadow: true, NoVMM: true, Capacity: 1 << 30})
	devicetest.Run(t, s)
	simCheck(t, s)
	assert.Zero(t, s.Used())
}

func TestSimConformanceSmallGranularity(t *testing.T) {
	s := New(Config{Shadow: true, Granularity: 64 << 10, Capacity: 256 * simMiB})
	devicetest.Run(t, s)
	simCheck(t, s)
}

func TestSimDefaults(t *testing.T) {
	s := New(Config{})
	assert.Equal(t, "Simulated H200", s.Name())
	assert.Equal(t, 0, s.Ordinal())
	assert.True(t, s.VMMSupported())
	g, err := s.AllocationGranularity()
	require.NoError(t, err)
	assert.Equal(t, uint64(2<<20), g)
	assert.Equal(t, uint64(32), s.TexturePitchAlignment())
	free, total, err := s.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(150754820096), total)
	assert.Equal(t, uint64(143771)*simMiB, total)
	assert.Equal(t, total, free)

	c := New(Config{Name: "x", Ordinal: 3, Capacity: 1 << 30, Granularity: 1 << 16, TexturePitchAlignment: 512, PitchAlignment: 256})
	assert.Equal(t, "x", c.Name())
	assert.Equal(t, 3, c.Ordinal())
	assert.Equal(t, uint64(512), c.TexturePitchAlignment())
	_, pitch, err := c.MemAllocPitch(300, 2, 4)
	require.NoError(t, err)
	assert.Equal(t, uint64(512), pitch)

	assert.Panics(t, func() { New(Config{Granularity: 3 << 20}) })
	assert.Panics(t, func() { New(Config{PitchAlignment: 500}) })
	assert.Panics(t, func() { New(Config{Granularity: 256}) })
}

func TestSimLinear(t *testing.T) {
	s := New(Config{Capacity: 64 * simMiB})
	p, err := s.MemAlloc(1)
	require.NoError(t, err)
	assert.Equal(t, uintptr(0x7f00_0000_0000), p, "the first allocation is at the base of the window")
	assert.Equal(t, uint64(512), s.Used(), "capacity is consumed in 512-byte units")
	q, err := s.MemAlloc(513)
	require.NoError(t, err)
	assert.Equal(t, p+512, q, "allocations pack lowest-first")
	assert.Equal(t, uint64(512+1024), s.Used())
	free, _, err := s.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, 64*simMiB-uint64(1536), free)
	simCheck(t, s)

	start, size, ok := s.Owner(q + 100)
	assert.True(t, ok)
	assert.Equal(t, q, start)
	assert.Equal(t, uint64(513), size)
	_, _, ok = s.Owner(q + 513)
	assert.False(t, ok, "the rounding slack belongs to no allocation")

	// Freed ranges are reused lowest first.
	require.NoError(t, s.MemFree(p))
	r, err := s.MemAlloc(200)
	require.NoError(t, err)
	assert.Equal(t, p, r)

	cases := []struct {
		name string
		ptr  uintptr
	}{
		{"interior", q + 512},
		{"unknown", 0x1000},
		{"slack", q + 600},
	}
	for _, c := range cases {
		assert.ErrorIs(t, s.MemFree(c.ptr), device.ErrInvalidValue, c.name)
	}
	assert.NoError(t, s.MemFree(0), "null does nothing, as the driver answers it")
	require.NoError(t, s.MemFree(q))
	assert.ErrorIs(t, s.MemFree(q), device.ErrInvalidValue, "double free")
	require.NoError(t, s.MemFree(r))
	assert.Zero(t, s.Used())
	simCheck(t, s)

	_, err = s.MemAlloc(0)
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	_, err = s.MemAlloc(64*simMiB + 1)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	_, err = s.MemAlloc(^uint64(0))
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	big, err := s.MemAlloc(64 * simMiB)
	require.NoError(t, err, "the whole capacity can be allocated")
	_, err = s.MemAlloc(1)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	require.NoError(t, s.MemFree(big))
	simCheck(t, s)
}

func TestSimPitch(t *testing.T) {
	s := New(Config{Capacity: 64 * simMiB})
	cases := []struct {
		name          string
		width, height uint64
		elem          uint32
		pitch         uint64
		err           error
	}{
		{"width 4", 4, 1, 4, 512, nil},
		{"width 2052", 2052, 3, 8, 2560, nil},
		{"width 16000", 16000, 2, 16, 16384, nil},
		{"width 0", 0, 1, 4, 0, device.ErrInvalidValue},
		{"height 0", 4, 0, 4, 0, device.ErrInvalidValue},
		{"element 2", 4, 1, 2, 0, device.ErrInvalidValue},
		{"element 32", 4, 1, 32, 0, device.ErrInvalidValue},
		{"width overflows", ^uint64(0) - 3, 1, 4, 0, device.ErrInvalidValue},
		{"product overflows", 1 << 40, 1 << 30, 4, 0, device.ErrInvalidValue},
		{"too big", 1 << 20, 65, 4, 0, device.ErrOutOfMemory},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before := s.Used()
			p, pitch, err := s.MemAllocPitch(c.width, c.height, c.elem)
			if c.err != nil {
				assert.ErrorIs(t, err, c.err)
				assert.Equal(t, before, s.Used(), "a failed call changes nothing")
				return
			}
			require.NoError(t, err)
			assert.Equal(t, c.pitch, pitch)
			assert.Equal(t, before+pitch*c.height, s.Used())
			_, size, ok := s.Owner(p)
			assert.True(t, ok)
			assert.Equal(t, pitch*c.height, size)
			require.NoError(t, s.MemFree(p))
		})
	}
	simCheck(t, s)
}

func TestSimNoVMM(t *testing.T) {
	s := New(Config{NoVMM: true})
	assert.False(t, s.VMMSupported())
	_, err := s.AllocationGranularity()
	assert.ErrorIs(t, err, device.ErrNotSupported)
	_, err = s.AddressReserve(2*simMiB, 0)
	assert.ErrorIs(t, err, device.ErrNotSupported)
	_, err = s.MemCreate(2 * simMiB)
	assert.ErrorIs(t, err, device.ErrNotSupported)
	assert.ErrorIs(t, s.MemMap(0x7f00_0000_0000, 2*simMiB, 1), device.ErrNotSupported)
	assert.ErrorIs(t, s.MemUnmap(0x7f00_0000_0000, 2*simMiB), device.ErrNotSupported)
	assert.ErrorIs(t, s.MemSetAccess(0x7f00_0000_0000, 2*simMiB), device.ErrNotSupported)
	assert.ErrorIs(t, s.MemRelease(1), device.ErrNotSupported)
	assert.ErrorIs(t, s.AddressFree(0x7f00_0000_0000, 2*simMiB), device.ErrNotSupported)
	counts := s.Counts()
	assert.Equal(t, uint64(7), counts.Total(), "failed calls are counted")
}

func TestSimTwoProcesses(t *testing.T) {
	a := New(Config{Capacity: 16 * simMiB, Shadow: true})
	b := a.NewProcess()
	assert.Equal(t, a.Name(), b.Name())

	pa, err := a.MemAlloc(10 * simMiB)
	require.NoError(t, err)
	free, total, err := b.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(16*simMiB), total)
	assert.Equal(t, uint64(6*simMiB), free, "a's allocation lowers b's free memory")

	_, err = b.MemAlloc(7 * simMiB)
	assert.ErrorIs(t, err, device.ErrOutOfMemory, "a's allocation makes b's fail")
	_, err = b.MemCreate(8 * simMiB)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	pb, err := b.MemAlloc(6 * simMiB)
	require.NoError(t, err)
	assert.NotEqual(t, pa, pb, "processes have disjoint address windows")

	// Pointers of one process mean nothing in the other.
	assert.ErrorIs(t, b.MemFree(pa), device.ErrInvalidValue)
	assert.ErrorIs(t, b.MemsetD32(pa, 1, 1), device.ErrIllegalAddress)
	_, _, ok := b.Owner(pa)
	assert.False(t, ok)
	s, err := a.StreamCreate()
	require.NoError(t, err)
	assert.ErrorIs(t, b.StreamSynchronize(s), device.ErrInvalidValue)

	assert.Equal(t, uint64(10*simMiB), a.Used())
	assert.Equal(t, uint64(6*simMiB), b.Used())
	simCheck(t, a)
	simCheck(t, b)

	require.NoError(t, a.MemFree(pa))
	free, _, err = b.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(10*simMiB), free)
	require.NoError(t, b.MemFree(pb))
	require.NoError(t, a.StreamDestroy(s))
}

func TestSimOccupy(t *testing.T) {
	s := New(Config{Capacity: 16 * simMiB})
	require.NoError(t, s.Occupy(12*simMiB))
	free, _, err := s.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(4*simMiB), free)
	assert.ErrorIs(t, s.Occupy(5*simMiB), device.ErrOutOfMemory)
	_, err = s.MemAlloc(5 * simMiB)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Zero(t, s.Used(), "Occupy is not the process's use")

	p := s.NewProcess()
	p.Vacate(12 * simMiB) // any process of the GPU may vacate
	free, _, err = s.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, uint64(16*simMiB), free)
	assert.Panics(t, func() { s.Vacate(1) })
	simCheck(t, s)
}

// Each process's context holds Config.ContextBytes of the shared
// capacity from its creation until its Close, as a CUDA context does; a
// context that does not fit takes what is free.
func TestSimContextsHoldMemory(t *testing.T) {
	s := New(Config{Capacity: 16 * simMiB, ContextBytes: 4 * simMiB})
	free := func(d *Device) uint64 {
		f, _, err := d.MemGetInfo()
		require.NoError(t, err)
		return f
	}
	assert.Equal(t, uint64(12*simMiB), free(s))
	p := s.NewProcess()
	assert.Equal(t, uint64(8*simMiB), free(s), "two contexts")
	assert.Zero(t, s.Used(), "a context is not the process's use")
	_, err := p.MemAlloc(9 * simMiB)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	simCheck(t, s)
	h, err := p.MemAlloc(7 * simMiB)
	require.NoError(t, err)
	q := s.NewProcess() // 1 MiB free: its context takes that
	assert.Zero(t, free(s))
	require.NoError(t, q.Close())
	assert.Equal(t, uint64(simMiB), free(s), "a closed context's memory is free again")
	require.NoError(t, p.MemFree(h))
	require.NoError(t, p.Close())
	assert.Equal(t, uint64(12*simMiB), free(s))
	simCheck(t, s)
}

func TestSimHookBetweenInfoAndAlloc(t *testing.T) {
	// Another process grabs memory between the pool's MemGetInfo and its
	// allocation: the allocation must fail cleanly.
	s := New(Config{Capacity: 16 * simMiB})
	other := s.NewProcess()
	var seen []device.Call
	s.SetHook(func(c device.Call) {
		seen = append(seen, c)
		if c == device.CallMemAlloc {
			_, err := other.MemAlloc(8 * simMiB)
			require.NoError(t, err)
		}
	})
	free, _, err := s.MemGetInfo()
	require.NoError(t, err)
	require.Equal(t, uint64(16*simMiB), free)
	_, err = s.MemAlloc(free)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Equal(t, []device.Call{device.CallMemGetInfo, device.CallMemAlloc}, seen)
	assert.Equal(t, uint64(8*simMiB), other.Used())
	assert.Zero(t, s.Used())
	s.SetHook(nil)
	_, err = s.MemAlloc(1)
	require.NoError(t, err)
	assert.Len(t, seen, 2, "hook removed")
}

func TestSimClose(t *testing.T) {
	s := New(Config{})
	p, err := s.MemAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, s.Close())
	require.NoError(t, s.Close(), "Close is idempotent")
	assert.ErrorIs(t, s.MemFree(p), device.ErrInvalidValue)
	_, _, err = s.MemGetInfo()
	assert.ErrorIs(t, err, device.ErrInvalidValue)
	assert.Equal(t, uint64(4096), s.Used(), "Close frees nothing")
	assert.Equal(t, 1, s.LiveAllocations())
}

func TestSimCounts(t *testing.T) {
	s := New(Config{Latency: &Latency{}})
	_, err := s.MemAlloc(0)
	require.Error(t, err)
	p, err := s.MemAlloc(1)
	require.NoError(t, err)
	require.NoError(t, s.MemFree(p))
	_, _, _ = s.MemGetInfo()
	c := s.Counts()
	assert.Equal(t, uint64(2), c[device.CallMemAlloc], "failed calls count")
	assert.Equal(t, uint64(1), c[device.CallMemFree])
	assert.Equal(t, uint64(4), c.Total())
	assert.Equal(t, map[string]uint64{"cuMemAlloc": 2, "cuMemFree": 1, "cuMemGetInfo": 1}, c.Map())
	assert.Zero(t, s.SimTime(), "an empty model costs nothing")
}

func TestSimLatency(t *testing.T) {
	l := H200Latency()
	us := time.Microsecond
	oh := 470 * time.Nanosecond
	cases := []struct {
		c    device.Call
		size uint64
		want time.Duration
	}{
		{device.CallMemAlloc, 1, oh + 40*us},
		{device.CallMemAlloc, 16 * simMiB, oh + 40*us},
		{device.CallMemAlloc, 136 * simMiB, oh + 49500*time.Nanosecond}, // halfway to 256 MiB
		{device.CallMemAlloc, 256 * simMiB, oh + 59*us},
		{device.CallMemAlloc, 2048 * simMiB, oh + 222*us},
		{device.CallMemAlloc, 3840 * simMiB, oh + 385*us}, // extrapolated
		{device.CallMemFree, 4096, oh + 35*us},
		{device.CallMemFree, 256 * simMiB, oh + 148*us},
		{device.CallMemFree, 2048 * simMiB, oh + 874*us},
		// VMM calls per handle of 2, 20 and 128 MiB: as measured on the
		// H200 (issue 11), overhead included.
		{device.CallMemCreate, 2 * simMiB, 11300 * time.Nanosecond},
		{device.CallMemCreate, 20 * simMiB, 11300 * time.Nanosecond},
		{device.CallMemCreate, 128 * simMiB, 14700 * time.Nanosecond},
		{device.CallMemRelease, 2 * simMiB, 12200 * time.Nanosecond},
		{device.CallMemRelease, 128 * simMiB, 56300 * time.Nanosecond},
		{device.CallMemMap, 2 * simMiB, 2500 * time.Nanosecond},
		{device.CallMemSetAccess, 2 * simMiB, 25600 * time.Nanosecond},
		{device.CallMemSetAccess, 20 * simMiB, 24600 * time.Nanosecond},
		{device.CallMemUnmap, 2 * simMiB, 18200 * time.Nanosecond},
		{device.CallEventQuery, 0, oh + 1*us},
		{device.CallMemsetD32, 3e9, oh + 2500*time.Nanosecond + time.Millisecond},
		{device.CallMemcpyDtoH, 25e6, oh + 8*us + time.Millisecond},
	}
	for _, c := range cases {
		assert.Equal(t, c.want, l.Of(c.c, c.size), "%v(%d)", c.c, c.size)
	}

	// Access and unmap over a range cost per mapping in it.
	v := New(Config{})
	base, err := v.AddressReserve(8*simMiB, 0)
	require.NoError(t, err)
	for i := range 4 {
		h, err := v.MemCreate(2 * simMiB)
		require.NoError(t, err)
		require.NoError(t, v.MemMap(base+uintptr(i)*2*simMiB, 2*simMiB, h))
		require.NoError(t, v.MemRelease(h))
	}
	require.NoError(t, v.MemSetAccess(base, 8*simMiB))
	require.NoError(t, v.MemUnmap(base, 8*simMiB))
	vb := v.SimTimeByCall()
	assert.Equal(t, oh+4*(25600*time.Nanosecond-oh), vb[device.CallMemSetAccess], "one call over four mappings")
	assert.Equal(t, oh+4*(18200*time.Nanosecond-oh), vb[device.CallMemUnmap])

	// The model is charged per call, failed calls paying the overhead only.
	s := New(Config{})
	p, err := s.MemAlloc(1 << 20)
	require.NoError(t, err)
	_, err = s.MemAlloc(0)
	require.Error(t, err)
	require.NoError(t, s.MemFree(p))
	by := s.SimTimeByCall()
	assert.Equal(t, 2*oh+40*us, by[device.CallMemAlloc])
	assert.Equal(t, oh+35*us, by[device.CallMemFree])
	assert.Equal(t, 3*oh+75*us, s.SimTime())

	assert.Panics(t, func() { Piecewise() })
	assert.Panics(t, func() { Piecewise(LatencyPoint{2, 1}, LatencyPoint{1, 1}) })
	one := Piecewise(LatencyPoint{10, 5})
	assert.Equal(t, time.Duration(5), one(1<<40))
	down := Piecewise(LatencyPoint{0, 10}, LatencyPoint{10, 0})
	assert.Equal(t, time.Duration(0), down(100), "never below zero")
}

func TestSimErrorsNameTheCall(t *testing.T) {
	s := New(Config{})
	err := s.MemFree(0x1234)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "cuMemFree")
	assert.Contains(t, err.Error(), "0x1234")
	assert.True(t, errors.Is(err, device.ErrInvalidValue))
}

func TestSimConcurrentProcesses(t *testing.T) {
	// Two processes hammer one small GPU; capacity accounting stays exact.
	a := New(Config{Capacity: 8 * simMiB, Shadow: true, Granularity: 64 << 10})
	procs := []*Device{a, a.NewProcess()}
	var wg sync.WaitGroup
	for i, p := range procs {
		for w := range 2 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for k := range 200 {
					size := uint64(1+(k*7919+w*31+i)%(512<<10)) &^ 3
					if size == 0 {
						size = 4
					}
					ptr, err := p.MemAlloc(size)
					if errors.Is(err, device.ErrOutOfMemory) {
						continue
					}
					if !assert.NoError(t, err) {
						return
					}
					assert.NoError(t, p.MemsetD32(ptr, uint32(k), size/4))
					if k%3 == 0 {
						h, err := p.MemCreate(64 << 10)
						if err == nil {
							assert.NoError(t, p.MemRelease(h))
						}
					}
					assert.NoError(t, p.MemFree(ptr))
				}
			}()
		}
	}
	wg.Wait()
	for _, p := range procs {
		simCheck(t, p)
		assert.Zero(t, p.Used())
	}
	free, total, err := a.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, total, free)
}

func ExampleNew() {
	s := New(Config{Capacity: 1 << 30, Shadow: true})
	p, _ := s.MemAlloc(4096)
	_ = s.MemsetD32(p, 0x01020304, 1024)
	buf := make([]byte, 4)
	_ = s.MemcpyDtoH(buf, p)
	_ = s.MemFree(p)
	counts := s.Counts()
	fmt.Printf("%#x %v %d\n", p, buf, counts.Total())
	// Output: 0x7f0000000000 [4 3 2 1] 4
}

func TestSimAddressSpaceExhausted(t *testing.T) {
	// More capacity than address window: the window runs out first.
	s := New(Config{Capacity: 8 << 40})
	_, err := s.MemAlloc(5 << 40)
	assert.ErrorIs(t, err, device.ErrOutOfMemory)
	assert.Zero(t, s.Used(), "a failed call changes nothing")
	simCheck(t, s)
}

func TestSimCheckDetectsCorruption(t *testing.T) {
	cases := []struct {
		name    string
		corrupt func(s *Device)
	}{
		{"process used", func(s *Device) { s.used++ }},
		{"GPU used", func(s *Device) { s.g.used++ }},
		{"region overlap", func(s *Device) { s.regions[1].start = s.regions[0].start + 1 }},
		{"linear charge", func(s *Device) { s.regions[0].ph.charge = 1 }},
		{"free list overlaps a region", func(s *Device) { s.va.free[0].lo = s.regions[0].start }},
		{"handle refcount", func(s *Device) {
			for _, ph := range s.handles {
				ph.maps++
			}
		}},
		{"mapping outside its reservation", func(s *Device) { s.regions[2].maps[0].start = s.regions[2].start - 1 }},
		{"contents unmerged", func(s *Device) {
			s.regions[0].ph.mem.segs = []simSeg{{0, 4, 1}, {4, 8, 1}}
		}},
		{"contents overlap", func(s *Device) {
			s.regions[0].ph.mem.segs = []simSeg{{0, 8, 1}, {4, 12, 2}}
		}},
		{"contents beyond the allocation", func(s *Device) {
			s.regions[0].ph.mem.segs = []simSeg{{0, 1 << 20, 1}}
		}},
		{"runnable work left queued", func(s *Device) {
			st := s.streams[0]
			st.queue = append(st.queue, &simItem{kind: simItemRecord, rec: &simRecord{}})
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := New(Config{Capacity: 64 * simMiB, Granularity: 64 << 10, Shadow: true})
			_, err := s.MemAlloc(4096)
			require.NoError(t, err)
			_, err = s.MemAlloc(4096)
			require.NoError(t, err)
			simMapped(t, s, 64<<10, 1)
			require.NoError(t, s.Check())
			c.corrupt(s)
			assert.Error(t, s.Check())
		})
	}
}

// With RealTime a call returns no sooner than its modelled duration; the
// model's time is charged as without it.
func TestRealTimeCallsTakeTheirModelledTime(t *testing.T) {
	s := New(Config{RealTime: true})
	start := time.Now()
	h, err := s.MemCreate(2 * simMiB)
	require.NoError(t, err)
	require.NoError(t, s.MemRelease(h))
	assert.GreaterOrEqual(t, time.Since(start), s.SimTime(), "at least the modelled time passed")
	assert.Equal(t, New(Config{}).lat.Of(device.CallMemCreate, 2*simMiB), s.SimTimeByCall()[device.CallMemCreate])
}
