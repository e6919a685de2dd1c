package pool

import (
	"errors"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/gpumem/tlsf/device/sim"
)

// biasedOps counts what a biasMutex guards: plain increments, which a
// lock that let two holders in at once would lose.
type biasedOps struct {
	m biasMutex
	n uint64
}

// add increments n as the pool's fast paths take the lock: in a section
// when biased toward the caller, else under mu; every 16th time under mu
// for the owner too (its slow path).
func (o *biasedOps) add(i int) {
	biased := i%16 != 0 && o.m.enter()
	if !biased {
		o.m.Lock()
	}
	v := o.n
	if i%7 == 0 {
		runtime.Gosched() // a holder or section that stops midway
	}
	o.n = v + 1
	o.m.release(biased)
}

func requireBiasable(t *testing.T) {
	t.Helper()
	if !biasable || !registerBarrierNow() {
		t.Skip("no biased lock on this platform (biasable), or membarrier refused")
	}
}

// TestBiasMutexBiasesTowardOneGoroutine: a goroutine that ends two
// streaks of biasStreak acquisitions then enters sections without
// locking; the
// pool's look-asides keep the bias, another goroutine's Lock drops it,
// and the owner's own Lock keeps it.
func TestBiasMutexBiasesTowardOneGoroutine(t *testing.T) {
	requireBiasable(t)
	var o biasedOps
	for i := range 2 * biasStreak {
		require.False(t, o.m.enter(), "biased after %d acquisitions", i)
		o.m.Lock()
		o.m.Unlock()
	}
	require.True(t, o.m.enter())
	o.m.leave()

	o.m.Lock() // the owner's slow path: the bias stays
	require.Zero(t, o.m.gate, "the gate stays shut while mu is held")
	o.m.Unlock()
	require.True(t, o.m.enter())
	o.m.leave()

	done := make(chan struct{})
	go func() { // a look-aside (Stats, the scavenger): the bias stays
		o.m.lockAside()
		o.m.Unlock()
		close(done)
	}()
	<-done
	require.True(t, o.m.enter())
	o.m.leave()
	require.Equal(t, uint64(1), o.m.biases)
	require.Zero(t, o.m.drops)

	done = make(chan struct{})
	go func() { // another goroutine: the bias goes
		o.m.Lock()
		o.m.Unlock()
		close(done)
	}()
	<-done
	require.False(t, o.m.enter())
	require.Equal(t, uint64(1), o.m.drops)
	// It comes back after two streaks of biasStreak: the first drop (a
	// drop within biasDropSpan of the last would double them).
	for range 2 * biasStreak {
		o.m.Lock()
		o.m.Unlock()
	}
	require.True(t, o.m.enter())
	o.m.leave()
}

// TestBiasMutexExcludes: goroutines taking the lock in bursts of random
// length, so that the bias moves between them hundreds of times, some of
// them stopping in the middle of a section or a hold: no increment is
// lost.
func TestBiasMutexExcludes(t *testing.T) {
	requireBiasable(t)
	var o biasedOps
	const workers, rounds = 4, 400
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for range rounds {
				for i := range 1 + r.IntN(300) {
					o.add(i)
				}
				if w == 0 { // a look-aside now and then
					o.m.lockAside()
					o.m.Unlock()
				}
				o.m.Lock() // the next bias after biasStreak again, not a doubled streak
				o.m.need, o.m.dropped = 0, time.Time{}
				o.m.Unlock()
				runtime.Gosched()
			}
		})
	}
	wg.Wait()
	o.m.Lock()
	defer o.m.Unlock()
	total := uint64(0)
	for w := range workers {
		r := rand.New(rand.NewPCG(uint64(w), 1))
		for range rounds {
			total += uint64(1 + r.IntN(300))
		}
	}
	require.Equal(t, total, o.n, "increments lost: two holders at once")
	require.Greater(t, o.m.biases, uint64(20), "seldom biased: the test exercised the mutex alone")
	require.NotZero(t, o.m.drops)
	t.Logf("biases %d, drops %d", o.m.biases, o.m.drops)
}

// TestBiasMutexLitmus runs the owner's sections on one thread against a
// holder on another that shuts the gate, revokes and opens it again (a
// look-aside's steps) as fast as it can: the owner must never be inside
// a section while the holder holds. (The window the process barrier
// closes is a few nanoseconds wide: a review's tighter litmus of the same
// steps saw 7–16 overlaps in 300,000 without the barrier; this one
// checks exclusion, and rarely sees that window.)
func TestBiasMutexLitmus(t *testing.T) {
	requireBiasable(t)
	if runtime.GOMAXPROCS(0) < 2 || runtime.NumCPU() < 2 {
		t.Skip("needs two threads running at once")
	}
	var m biasMutex
	var inside atomic.Bool
	var both, sections atomic.Int64
	stop := make(chan struct{})
	owner := make(chan uintptr)
	var wg sync.WaitGroup
	wg.Go(func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		owner <- curg()
		for {
			select {
			case <-stop:
				return
			default:
			}
			for range 1000 {
				if m.enter() {
					sections.Add(1)
					inside.Store(true) // after the gate's second read: no help to the protocol
					for range 20 {
						runtime.KeepAlive(&m)
					}
					inside.Store(false)
					m.leave()
				}
			}
		}
	})
	g := <-owner
	func() { // shut's and reopen's steps for a look-aside, without mu
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		// At least 30,000 revokes, and on until the owner opened 1,000
		// sections (on a loaded machine its thread may not run at first;
		// CI once saw none in 30,000), for at most 10 s.
		deadline := time.Now().Add(10 * time.Second)
		for i := 0; i < 30000 || sections.Load() < 1000 && time.Now().Before(deadline); i++ {
			atomic.StoreUintptr(&m.gate, 0)
			m.revoke()
			if inside.Load() {
				both.Add(1)
			}
			atomic.StoreUintptr(&m.gate, g)
		}
	}()
	close(stop)
	wg.Wait()
	require.Zero(t, both.Load(), "a section ran while the lock was held (%d sections)", sections.Load())
	require.NotZero(t, sections.Load())
}

// TestBiasMutexBarrierFailure: a process barrier that fails falls back
// to stopping the world (no increment lost) and turns bias off.
func TestBiasMutexBarrierFailure(t *testing.T) {
	requireBiasable(t)
	saved := processBarrier
	processBarrier = func() error { return errors.New("membarrier: refused") }
	t.Cleanup(func() { processBarrier = saved; biasBroken.Store(false) })

	var o biasedOps
	for i := range 2 * biasStreak {
		o.add(16 * i) // under mu: two streaks
	}
	require.True(t, o.m.enter())
	entered := make(chan struct{})
	release := make(chan struct{})
	go func() { // the owner, in a section while another goroutine locks
		o.n++
		close(entered)
		<-release
		o.m.leave()
	}()
	<-entered
	locked := make(chan struct{})
	go func() {
		o.m.Lock()
		o.n++
		o.m.Unlock()
		close(locked)
	}()
	close(release)
	<-locked
	require.Equal(t, uint64(2*biasStreak+2), o.n)
	require.True(t, biasBroken.Load())
	for i := range 4 * biasStreak {
		o.add(16 * i)
	}
	require.False(t, o.m.enter(), "biased again after the barrier failed")
}

// TestPoolBiasedSections: a pool used by one goroutine serves its
// requests and frees in sections (no locked instruction), one used by
// several stays correct as the bias moves: Check passes and statistics
// add up.
func TestPoolBiasedSections(t *testing.T) {
	requireBiasable(t)
	p := openPool(t, onSim(sim.New(sim.Config{})), Options{Backend: BackendVMM, Cache: CacheOptions{Disable: true}})
	var live []uintptr
	for i := range 1000 {
		ptr, err := p.Alloc(uint64(1+i%37) << 12)
		require.NoError(t, err)
		live = append(live, ptr)
		if i%3 == 0 {
			require.NoError(t, p.Free(live[0]))
			live = live[1:]
		}
	}
	require.Equal(t, uint64(1), p.mu.biases)
	biased := p.mu.enter()
	require.True(t, biased, "one goroutine's pool not biased toward it")
	p.mu.leave()

	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			var mine []uintptr
			for i := range 3000 {
				ptr, err := p.Alloc(uint64(1+(i+w)%53) << 10)
				if err != nil {
					t.Error(err)
					return
				}
				mine = append(mine, ptr)
				if i%2 == 1 {
					if err := p.Free(mine[0]); err != nil {
						t.Error(err)
						return
					}
					mine = mine[1:]
				}
				if i%500 == 0 {
					runtime.Gosched()
				}
			}
			for _, ptr := range mine {
				if err := p.Free(ptr); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	for _, ptr := range live {
		require.NoError(t, p.Free(ptr))
	}
	require.NoError(t, p.Check())
	st := p.Stats()
	require.Zero(t, st.Allocated)
	require.Zero(t, st.Allocations)
}

// BenchmarkBiasMutex: one goroutine's hold of the pool's lock, biased
// (a section) and not (mu, as with several goroutines), against a
// sync.Mutex's TryLock and Unlock: the fast paths' cost around an empty
// operation.
func BenchmarkBiasMutex(b *testing.B) {
	// Registered first: a fresh process's biased case would run unbiased
	// until the registration (barrierReady) completed, 11–30 ms on a
	// 16-core host.
	_ = registerBarrierNow()
	var n uint64
	b.Run("sync.Mutex", func(b *testing.B) {
		var mu sync.Mutex
		for b.Loop() {
			if !mu.TryLock() {
				mu.Lock()
			}
			n++
			mu.Unlock()
		}
	})
	for _, biased := range []bool{true, false} {
		b.Run(map[bool]string{true: "biased", false: "unbiased"}[biased], func(b *testing.B) {
			var m biasMutex
			for b.Loop() {
				in := m.enter()
				if !in && !m.TryLock() {
					m.Lock()
				}
				n++
				if !biased {
					m.streak = 0 // as with goroutines taking turns
				}
				m.release(in)
			}
		})
	}
	_ = n
}

// release ends what enter (biased) or Lock/TryLock took. The pool's
// fast paths write the two cases out, so that each inlines; the tests
// use this.
func (m *biasMutex) release(biased bool) {
	if biased {
		m.leave()
		return
	}
	m.Unlock()
}

// fakeRegistration replaces the process's registration for the barrier
// with reg, as if the process had never registered, until the test ends.
func fakeRegistration(t *testing.T, reg func() error) {
	saved := registerBarrier
	registerBarrier = reg
	barrierAsked.Store(false)
	barrierOK.Store(false)
	t.Cleanup(func() {
		registerBarrier = saved
		biasBroken.Store(false)
		barrierAsked.Store(true)
		barrierOK.Store(registerBarrierNow())
	})
}

// streaks takes and releases o's lock n times on a goroutine of its own,
// failing the test if that takes 10 s (a Lock that waited for the
// registration would).
func streaks(t *testing.T, o *biasedOps, n int) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			o.m.Lock()
			o.m.Unlock()
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the streaks waited for the process's registration")
	}
}

// TestBiasDoesNotWaitForTheRegistration: the first bias starts the
// process's registration for the barrier in a goroutine of its own (it
// takes 11–30 ms on a 16-core host) and returns at once, the lock
// unbiased; the first streak to end after the registration completed
// biases it.
func TestBiasDoesNotWaitForTheRegistration(t *testing.T) {
	requireBiasable(t)
	release := make(chan struct{})
	var once sync.Once
	unblock := func() { once.Do(func() { close(release) }) }
	fakeRegistration(t, func() error { <-release; return nil })
	t.Cleanup(unblock) // before fakeRegistration's (cleanups run last first): the fake returns
	var o biasedOps
	streaks(t, &o, 2*biasStreak) // the second streak would bias
	require.True(t, barrierAsked.Load(), "the registration was not started")
	require.False(t, o.m.enter(), "biased before the process registered")
	require.Zero(t, o.m.biases)
	unblock()
	require.Eventually(t, barrierOK.Load, 10*time.Second, time.Millisecond)
	// The streak after: the goroutine that ends it must be the one that
	// ended the last (m.last), so this one runs two.
	streaks(t, &o, 2*biasStreak)
	require.Equal(t, uint64(1), o.m.biases, "not biased at the first streaks after the registration")
}

// TestBiasRegistrationRefused: where the process cannot register (a
// seccomp filter, Linux before 4.14), the lock is never biased, and the
// registration is tried once.
func TestBiasRegistrationRefused(t *testing.T) {
	requireBiasable(t)
	var tries atomic.Int32
	fakeRegistration(t, sync.OnceValue(func() error { tries.Add(1); return errors.New("membarrier: refused") }))
	var o biasedOps
	for range 8 {
		streaks(t, &o, 2*biasStreak)
	}
	require.Eventually(t, biasBroken.Load, 10*time.Second, time.Millisecond)
	streaks(t, &o, 4*biasStreak)
	require.False(t, o.m.enter())
	require.Zero(t, o.m.biases)
	require.Equal(t, int32(1), tries.Load())
	require.False(t, barrierOK.Load())
}
