package sim

// Fault injection: making chosen driver calls fail, for tests of a pool's
// out-of-memory and error paths.
//
// A fault is decided after the call is counted and before it does
// anything, so an injected failure has no side effects: only the counter
// and the overhead's simulated time move. Two kinds:
//   - FailNth: the n-th call of a kind from now fails. Several may be
//     pending for one kind.
//   - FailRate: each call of a kind fails with probability p. Each kind
//     draws from its own PCG stream seeded from Config.Seed, the
//     process's index and the kind, so the failures depend only on the
//     seed and on the sequence of calls of that kind (not on calls of
//     other kinds, nor on other processes).

import (
	"fmt"
	"math/rand/v2"
	"slices"

	"github.com/gpumem/tlsf/device"
)

// simFaults is one process's injected faults; guarded by the GPU's mutex.
type simFaults struct {
	nth  [device.NumCalls][]simNth
	rate [device.NumCalls]simRate
	rng  [device.NumCalls]*rand.Rand
}

// simNth fails the call whose count reaches at.
type simNth struct {
	at  uint64
	err error
}

type simRate struct {
	p   float64
	err error
}

func (f *simFaults) init(seed uint64, proc int) {
	for c := range device.NumCalls {
		f.rng[c] = rand.New(rand.NewPCG(seed, uint64(proc)<<32|uint64(c)))
	}
}

// inject returns the injected error for the call of kind c that is the
// count-th of its kind, or nil.
func (f *simFaults) inject(c device.Call, count uint64) error {
	var err error
	if r := f.rate[c]; r.p > 0 && f.rng[c].Float64() < r.p {
		err = r.err
	}
	if i := slices.IndexFunc(f.nth[c], func(n simNth) bool { return n.at == count }); i >= 0 {
		err = f.nth[c][i].err
		f.nth[c] = slices.Delete(f.nth[c], i, i+1)
	}
	if err == nil {
		return nil
	}
	return fmt.Errorf("device: sim %s: injected fault: %w", c, err)
}

// FailNth makes the n-th call of kind c from now fail with an error
// wrapping err (ErrInjected if err is nil); n = 1 is the next call. The
// failing call does nothing but count. Calls count whether they succeed or
// not. It panics if n is 0 or c is not a Call kind.
func (s *Device) FailNth(c device.Call, n uint64, err error) {
	if n == 0 || c < 0 || c >= device.NumCalls {
		panic(fmt.Sprintf("device: sim FailNth(%v, %d): want a Call kind and n >= 1", c, n))
	}
	if err == nil {
		err = device.ErrInjected
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	s.faults.nth[c] = append(s.faults.nth[c], simNth{at: s.counts[c] + n, err: err})
}

// FailRate makes each later call of kind c fail with probability p (0 to
// 1; 0 stops it) with an error wrapping err (ErrInjected if err is nil).
// The draws come from a PRNG seeded by Config.Seed: the same seed and
// the same sequence of calls of kind c give the same failures. It panics
// if c is not a Call kind or p is not in [0, 1].
func (s *Device) FailRate(c device.Call, p float64, err error) {
	if c < 0 || c >= device.NumCalls || !(p >= 0 && p <= 1) {
		panic(fmt.Sprintf("device: sim FailRate(%v, %v): want a Call kind and 0 <= p <= 1", c, p))
	}
	if err == nil {
		err = device.ErrInjected
	}
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	s.faults.rate[c] = simRate{p: p, err: err}
}

// ClearFaults removes every fault FailNth and FailRate set on this
// process. The PRNG streams continue where they were.
func (s *Device) ClearFaults() {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	s.faults.nth = [device.NumCalls][]simNth{}
	s.faults.rate = [device.NumCalls]simRate{}
}
