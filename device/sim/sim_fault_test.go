package sim

import (
	"errors"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSimFailNth(t *testing.T) {
	s := New(Config{Capacity: 64 * simMiB})
	_, err := s.MemAlloc(1) // calls before FailNth do not count towards n
	require.NoError(t, err)
	s.FailNth(device.CallMemAlloc, 2, device.ErrOutOfMemory)
	s.FailNth(device.CallMemAlloc, 4, nil)

	_, err = s.MemAlloc(4096)
	require.NoError(t, err, "1st from now")
	used := s.Used()
	_, err = s.MemAlloc(4096)
	require.ErrorIs(t, err, device.ErrOutOfMemory, "2nd from now")
	assert.Contains(t, err.Error(), "cuMemAlloc")
	assert.Contains(t, err.Error(), "injected")
	assert.Equal(t, used, s.Used(), "an injected failure has no side effects")
	_, err = s.MemAlloc(4096)
	require.NoError(t, err, "3rd")
	_, err = s.MemAlloc(4096)
	assert.ErrorIs(t, err, device.ErrInjected, "4th, nil error means ErrInjected")
	_, err = s.MemAlloc(4096)
	require.NoError(t, err, "faults fire once")
	counts := s.Counts()
	assert.Equal(t, uint64(6), counts[device.CallMemAlloc], "injected failures count")
	simCheck(t, s)

	assert.Panics(t, func() { s.FailNth(device.CallMemAlloc, 0, nil) })
	assert.Panics(t, func() { s.FailNth(device.NumCalls, 1, nil) })
}

func TestSimInjectedFailuresChangeNothing(t *testing.T) {
	// Every kind of call, failed by injection, leaves the Sim as it was.
	s := New(Config{Capacity: 64 * simMiB, Granularity: 64 << 10, Shadow: true})
	g := uint64(64 << 10)
	va, hs := simMapped(t, s, g, 2)
	p, err := s.MemAlloc(4096)
	require.NoError(t, err)
	st, err := s.StreamCreate()
	require.NoError(t, err)
	e, err := s.EventCreate()
	require.NoError(t, err)
	require.NoError(t, s.HoldStream(st))
	require.NoError(t, s.MemsetD32Async(p, 5, 1, st))
	require.NoError(t, s.EventRecord(e, st))
	buf := make([]byte, 4)
	ap, err := s.MemAllocAsync(4096, 0)
	require.NoError(t, err)

	calls := map[device.Call]func() error{
		device.CallMemGetInfo:          func() error { _, _, err := s.MemGetInfo(); return err },
		device.CallMemAlloc:            func() error { _, err := s.MemAlloc(4096); return err },
		device.CallMemFree:             func() error { return s.MemFree(p) },
		device.CallMemAllocPitch:       func() error { _, _, err := s.MemAllocPitch(64, 2, 4); return err },
		device.CallAddressReserve:      func() error { _, err := s.AddressReserve(g, 0); return err },
		device.CallAddressFree:         func() error { return s.AddressFree(va, 2*g) },
		device.CallMemCreate:           func() error { _, err := s.MemCreate(g); return err },
		device.CallMemRelease:          func() error { return s.MemRelease(hs[0]) },
		device.CallMemMap:              func() error { return s.MemMap(va, g, hs[0]) },
		device.CallMemUnmap:            func() error { return s.MemUnmap(va, g) },
		device.CallMemSetAccess:        func() error { return s.MemSetAccess(va, g) },
		device.CallStreamCreate:        func() error { _, err := s.StreamCreate(); return err },
		device.CallStreamDestroy:       func() error { return s.StreamDestroy(st) },
		device.CallStreamSynchronize:   func() error { return s.StreamSynchronize(st) },
		device.CallStreamWaitEvent:     func() error { return s.StreamWaitEvent(0, e) },
		device.CallEventCreate:         func() error { _, err := s.EventCreate(); return err },
		device.CallEventDestroy:        func() error { return s.EventDestroy(e) },
		device.CallEventRecord:         func() error { return s.EventRecord(e, 0) },
		device.CallEventQuery:          func() error { _, err := s.EventQuery(e); return err },
		device.CallEventSynchronize:    func() error { return s.EventSynchronize(e) },
		device.CallMemsetD32:           func() error { return s.MemsetD32(va, 1, 1) },
		device.CallMemsetD32Async:      func() error { return s.MemsetD32Async(va, 1, 1, 0) },
		device.CallMemcpyDtoH:          func() error { return s.MemcpyDtoH(buf, va) },
		device.CallMemAllocAsync:       func() error { _, err := s.MemAllocAsync(4096, 0); return err },
		device.CallMemFreeAsync:        func() error { return s.MemFreeAsync(ap, 0) },
		device.CallMemPoolTrimTo:       func() error { return s.MemPoolTrimTo(0) },
		device.CallMemPoolGetAttribute: func() error { _, err := s.MemPoolGetAttribute(device.MemPoolReservedMemCurrent); return err },
		device.CallMemPoolSetAttribute: func() error { return s.MemPoolSetAttribute(device.MemPoolReleaseThreshold, 1) },
		device.CallMemsetD8Async:       func() error { return s.MemsetD8Async(va+1, 1, 3, 0) },
		device.CallCtxEnablePeerAccess: func() error { return s.EnablePeerAccess(0) },
		device.CallMemcpyDtoDAsync:     func() error { return s.MemcpyDtoDAsync(va, va+uintptr(g), 4, 0) },
	}
	require.Len(t, calls, int(device.NumCalls))
	for c := range device.NumCalls {
		t.Run(c.String(), func(t *testing.T) {
			before, used := s.Stats(), s.Used()
			s.FailNth(c, 1, device.ErrNoDevice)
			err := calls[c]()
			require.ErrorIs(t, err, device.ErrNoDevice)
			assert.Contains(t, err.Error(), c.String())
			assert.Equal(t, before, s.Stats())
			assert.Equal(t, used, s.Used())
			simCheck(t, s)
		})
	}
	assert.Empty(t, s.Violations())
}

// simRatePattern runs n MemAlloc/MemFree pairs on s and returns which
// allocations failed.
func simRatePattern(t *testing.T, s *Device, n int) []bool {
	t.Helper()
	out := make([]bool, n)
	for i := range out {
		p, err := s.MemAlloc(4096)
		if err != nil {
			require.ErrorIs(t, err, device.ErrOutOfMemory)
			out[i] = true
			continue
		}
		require.NoError(t, s.MemFree(p))
	}
	return out
}

func TestSimFailRate(t *testing.T) {
	const n = 400
	run := func(seed uint64, extra bool) []bool {
		s := New(Config{Capacity: 64 * simMiB, Seed: seed})
		s.FailRate(device.CallMemAlloc, 0.3, device.ErrOutOfMemory)
		if extra {
			// Faults on another kind draw from another stream and do
			// not change MemAlloc's.
			s.FailRate(device.CallMemGetInfo, 0.5, nil)
			for range 17 {
				_, _, _ = s.MemGetInfo()
			}
		}
		return simRatePattern(t, s, n)
	}
	a, b := run(42, false), run(42, true)
	assert.Equal(t, a, b, "same seed, same failures")
	c := run(43, false)
	assert.NotEqual(t, a, c, "another seed, other failures")
	failed := 0
	for _, f := range a {
		if f {
			failed++
		}
	}
	assert.InDelta(t, 0.3*n, failed, 0.1*n, "about 30%% fail")

	// Processes on one GPU draw from their own streams.
	s := New(Config{Capacity: 64 * simMiB, Seed: 42})
	p := s.NewProcess()
	p.FailRate(device.CallMemAlloc, 0.3, device.ErrOutOfMemory)
	assert.NotEqual(t, a, simRatePattern(t, p, n))
	assert.Equal(t, make([]bool, 10), simRatePattern(t, s, 10), "faults are per process")

	// p = 1 fails all, p = 0 stops, ClearFaults clears.
	s.FailRate(device.CallMemAlloc, 1, nil)
	_, err := s.MemAlloc(1)
	assert.ErrorIs(t, err, device.ErrInjected)
	s.FailRate(device.CallMemAlloc, 0, nil)
	_, err = s.MemAlloc(1)
	assert.NoError(t, err)
	s.FailRate(device.CallMemAlloc, 1, nil)
	s.FailNth(device.CallMemFree, 1, nil)
	s.ClearFaults()
	q, err := s.MemAlloc(1)
	require.NoError(t, err)
	require.NoError(t, s.MemFree(q))

	assert.Panics(t, func() { s.FailRate(device.CallMemAlloc, 1.5, nil) })
	assert.Panics(t, func() { s.FailRate(device.CallMemAlloc, -0.1, nil) })
}

func TestSimHookSeesInjectedCalls(t *testing.T) {
	s := New(Config{})
	var seen []device.Call
	s.SetHook(func(c device.Call) { seen = append(seen, c) })
	s.FailNth(device.CallStreamCreate, 1, nil)
	_, err := s.StreamCreate()
	assert.True(t, errors.Is(err, device.ErrInjected))
	assert.Equal(t, []device.Call{device.CallStreamCreate}, seen)
}

func TestSimDeterministic(t *testing.T) {
	// The same configuration and the same calls give the same addresses,
	// handles, failures, violations and simulated time.
	type trace struct {
		ptrs       []uint64
		errs       []string
		violations []string
		time       int64
		counts     device.Counts
	}
	run := func() trace {
		s := New(Config{Capacity: 32 * simMiB, Granularity: 64 << 10, Seed: 7, Shadow: true})
		s.FailRate(device.CallMemCreate, 0.2, device.ErrOutOfMemory)
		var tr trace
		note := func(v uint64, err error) {
			tr.ptrs = append(tr.ptrs, v)
			if err != nil {
				tr.errs = append(tr.errs, err.Error())
			}
		}
		st, err := s.StreamCreate()
		note(uint64(st), err)
		require.NoError(t, s.HoldStream(st))
		var live []uintptr
		for i := range 60 {
			size := uint64(1 + (i*7919)%(1<<20))
			p, err := s.MemAlloc(size)
			note(uint64(p), err)
			if err == nil {
				live = append(live, p)
				note(0, s.MemsetD32Async(p, uint32(i), 1, st))
			}
			if i%3 == 2 && len(live) > 0 {
				note(0, s.MemFree(live[0]))
				live = live[1:]
			}
			h, err := s.MemCreate(64 << 10)
			note(uint64(h), err)
			if err == nil {
				note(0, s.MemRelease(h))
			}
		}
		tr.violations = s.Violations()
		tr.time = int64(s.SimTime())
		tr.counts = s.Counts()
		return tr
	}
	a, b := run(), run()
	assert.Equal(t, a, b)
	assert.NotEmpty(t, a.violations, "frees of memory with held work are reported")
	assert.NotEmpty(t, a.errs, "some MemCreate calls failed")
}
