package device

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestSimFailNth(t *testing.T) {
	s := NewSim(SimConfig{Capacity: 64 * simMiB})
	_, err := s.MemAlloc(1) // calls before FailNth do not count towards n
	require.NoError(t, err)
	s.FailNth(CallMemAlloc, 2, ErrOutOfMemory)
	s.FailNth(CallMemAlloc, 4, nil)

	_, err = s.MemAlloc(4096)
	require.NoError(t, err, "1st from now")
	used := s.Used()
	_, err = s.MemAlloc(4096)
	require.ErrorIs(t, err, ErrOutOfMemory, "2nd from now")
	assert.Contains(t, err.Error(), "cuMemAlloc")
	assert.Contains(t, err.Error(), "injected")
	assert.Equal(t, used, s.Used(), "an injected failure has no side effects")
	_, err = s.MemAlloc(4096)
	require.NoError(t, err, "3rd")
	_, err = s.MemAlloc(4096)
	assert.ErrorIs(t, err, ErrInjected, "4th, nil error means ErrInjected")
	_, err = s.MemAlloc(4096)
	require.NoError(t, err, "faults fire once")
	counts := s.Counts()
	assert.Equal(t, uint64(6), counts[CallMemAlloc], "injected failures count")
	simCheck(t, s)

	assert.Panics(t, func() { s.FailNth(CallMemAlloc, 0, nil) })
	assert.Panics(t, func() { s.FailNth(NumCalls, 1, nil) })
}

func TestSimInjectedFailuresChangeNothing(t *testing.T) {
	// Every kind of call, failed by injection, leaves the Sim as it was.
	s := NewSim(SimConfig{Capacity: 64 * simMiB, Granularity: 64 << 10, Shadow: true})
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

	calls := map[Call]func() error{
		CallMemGetInfo:          func() error { _, _, err := s.MemGetInfo(); return err },
		CallMemAlloc:            func() error { _, err := s.MemAlloc(4096); return err },
		CallMemFree:             func() error { return s.MemFree(p) },
		CallMemAllocPitch:       func() error { _, _, err := s.MemAllocPitch(64, 2, 4); return err },
		CallAddressReserve:      func() error { _, err := s.AddressReserve(g, 0); return err },
		CallAddressFree:         func() error { return s.AddressFree(va, 2*g) },
		CallMemCreate:           func() error { _, err := s.MemCreate(g); return err },
		CallMemRelease:          func() error { return s.MemRelease(hs[0]) },
		CallMemMap:              func() error { return s.MemMap(va, g, hs[0]) },
		CallMemUnmap:            func() error { return s.MemUnmap(va, g) },
		CallMemSetAccess:        func() error { return s.MemSetAccess(va, g) },
		CallStreamCreate:        func() error { _, err := s.StreamCreate(); return err },
		CallStreamDestroy:       func() error { return s.StreamDestroy(st) },
		CallStreamSynchronize:   func() error { return s.StreamSynchronize(st) },
		CallStreamWaitEvent:     func() error { return s.StreamWaitEvent(0, e) },
		CallEventCreate:         func() error { _, err := s.EventCreate(); return err },
		CallEventDestroy:        func() error { return s.EventDestroy(e) },
		CallEventRecord:         func() error { return s.EventRecord(e, 0) },
		CallEventQuery:          func() error { _, err := s.EventQuery(e); return err },
		CallEventSynchronize:    func() error { return s.EventSynchronize(e) },
		CallMemsetD32:           func() error { return s.MemsetD32(va, 1, 1) },
		CallMemsetD32Async:      func() error { return s.MemsetD32Async(va, 1, 1, 0) },
		CallMemcpyDtoH:          func() error { return s.MemcpyDtoH(buf, va) },
		CallMemAllocAsync:       func() error { _, err := s.MemAllocAsync(4096, 0); return err },
		CallMemFreeAsync:        func() error { return s.MemFreeAsync(ap, 0) },
		CallMemPoolTrimTo:       func() error { return s.MemPoolTrimTo(0) },
		CallMemPoolGetAttribute: func() error { _, err := s.MemPoolGetAttribute(MemPoolReservedMemCurrent); return err },
		CallMemPoolSetAttribute: func() error { return s.MemPoolSetAttribute(MemPoolReleaseThreshold, 1) },
	}
	require.Len(t, calls, int(NumCalls))
	for c := range NumCalls {
		t.Run(c.String(), func(t *testing.T) {
			before, used := s.Stats(), s.Used()
			s.FailNth(c, 1, ErrNoDevice)
			err := calls[c]()
			require.ErrorIs(t, err, ErrNoDevice)
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
func simRatePattern(t *testing.T, s *Sim, n int) []bool {
	t.Helper()
	out := make([]bool, n)
	for i := range out {
		p, err := s.MemAlloc(4096)
		if err != nil {
			require.ErrorIs(t, err, ErrOutOfMemory)
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
		s := NewSim(SimConfig{Capacity: 64 * simMiB, Seed: seed})
		s.FailRate(CallMemAlloc, 0.3, ErrOutOfMemory)
		if extra {
			// Faults on another kind draw from another stream and do
			// not change MemAlloc's.
			s.FailRate(CallMemGetInfo, 0.5, nil)
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
	s := NewSim(SimConfig{Capacity: 64 * simMiB, Seed: 42})
	p := s.NewProcess()
	p.FailRate(CallMemAlloc, 0.3, ErrOutOfMemory)
	assert.NotEqual(t, a, simRatePattern(t, p, n))
	assert.Equal(t, make([]bool, 10), simRatePattern(t, s, 10), "faults are per process")

	// p = 1 fails all, p = 0 stops, ClearFaults clears.
	s.FailRate(CallMemAlloc, 1, nil)
	_, err := s.MemAlloc(1)
	assert.ErrorIs(t, err, ErrInjected)
	s.FailRate(CallMemAlloc, 0, nil)
	_, err = s.MemAlloc(1)
	assert.NoError(t, err)
	s.FailRate(CallMemAlloc, 1, nil)
	s.FailNth(CallMemFree, 1, nil)
	s.ClearFaults()
	q, err := s.MemAlloc(1)
	require.NoError(t, err)
	require.NoError(t, s.MemFree(q))

	assert.Panics(t, func() { s.FailRate(CallMemAlloc, 1.5, nil) })
	assert.Panics(t, func() { s.FailRate(CallMemAlloc, -0.1, nil) })
}

func TestSimHookSeesInjectedCalls(t *testing.T) {
	s := NewSim(SimConfig{})
	var seen []Call
	s.SetHook(func(c Call) { seen = append(seen, c) })
	s.FailNth(CallStreamCreate, 1, nil)
	_, err := s.StreamCreate()
	assert.True(t, errors.Is(err, ErrInjected))
	assert.Equal(t, []Call{CallStreamCreate}, seen)
}

func TestSimDeterministic(t *testing.T) {
	// The same configuration and the same calls give the same addresses,
	// handles, failures, violations and simulated time.
	type trace struct {
		ptrs       []uint64
		errs       []string
		violations []string
		time       int64
		counts     Counts
	}
	run := func() trace {
		s := NewSim(SimConfig{Capacity: 32 * simMiB, Granularity: 64 << 10, Seed: 7, Shadow: true})
		s.FailRate(CallMemCreate, 0.2, ErrOutOfMemory)
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
