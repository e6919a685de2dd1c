package pool

import (
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/cpu"
)

// The pool's lock, biased toward one goroutine.
//
// A program that allocates from one goroutine (a training loop, a trace
// replay, a C thread through the C ABI) takes the pool's lock for each
// operation with nobody else asking for it. A sync.Mutex costs two
// locked instructions per hold (TryLock's compare-and-swap, Unlock's
// add). biasMutex takes both out of the case of one goroutine, as
// biased locking does in Java VMs (Kawachiya, Koseki and Onodera, "Lock
// reservation", OOPSLA 2002), with the fence pairing of membarrier(2)'s
// man page in place of a revocation at a safe point.
//
// Once two streaks of biasStreak acquisitions that found mu free ended
// with the same goroutine (reopen), the lock is biased toward it: the
// gate holds its identity (its g's address, from thread-local storage:
// curg). That goroutine then opens a
// section (enter) instead of locking: it stores 1 to busy and checks
// that the gate still names it; leaving stores 0. Both stores are plain
// (a MOV on amd64), so a section costs no locked instruction. Only the
// owner opens sections, and it runs one at a time, so sections exclude
// each other. The owner may be preempted inside one, or parked by a GC
// assist where the section allocates; whoever waits for it then spins
// (yielding) until it runs again. A section makes no system call and
// calls neither the driver nor a caller's code: it leaves and locks
// first. A panic inside one (a bug: the pool's code runs there) leaves
// busy at 1, and the next holder other than the owner spinning, as the
// sync.Mutex before left the lock held.
//
// Any other goroutine locks mu and then shuts the gate, so that no new
// section opens. A section already past its check may still be running;
// its store to busy may even sit in its CPU's store buffer, unseen,
// while its read of the gate passed it (x86 lets a load pass an earlier
// store). So the holder first makes every thread of the process execute
// a full memory barrier (processBarrier: membarrier(2)'s
// MEMBARRIER_CMD_PRIVATE_EXPEDITED, one system call, about 2 µs on the
// development VM) and only then waits for busy to read 0. After the
// barrier, either the section's store is visible to the holder, which
// waits for it to leave, or the section's second read comes after the
// barrier and sees the gate shut. The owner locking mu itself needs
// neither (it is in no section). A holder other than the owner drops the
// bias (a second goroutine wants the lock: the pool is shared), except
// the pool's own look-asides (lockAside: Stats, the scavenger's wakes),
// which shut the gate for their hold and open it again.
//
// The bias comes back after two such streaks, a length that doubles at
// each drop within biasDropSpan of the last (up to biasMaxStreak), so
// that goroutines that take turns pay for a barrier every million
// acquisitions at most once the length has grown (about 14 drops); a
// drop after a quiet biasDropSpan starts again from biasStreak. Each
// look-aside of a biased pool pays a barrier too: Stats, and the
// scavenger's wake (10 a second; 100 with a floor set). A goroutine's
// identity may be reused once it exits, by a goroutine that then counts
// as the owner: harmless, as at most one live goroutine has it.
//
// Only on Linux on amd64 (biasable) and not under the race detector,
// which cannot see the order the sections rely on: elsewhere the lock is
// a sync.Mutex and a streak count. The process registers for the barrier
// once, in a goroutine the first bias starts (barrierReady), the lock
// biased only from a streak after that. If membarrier is refused (Linux
// before 4.14, a seccomp filter), the lock is never biased. If the barrier fails
// after it registered, the holder falls back to stopping the world
// (runtime.ReadMemStats: every goroutine stops at a safe point, so
// every thread has passed a barrier), drops the bias even for a
// look-aside, and bias is off for the rest of the process.
//
// Measured in BenchmarkBiasMutex; the replays' figures are in
// Pool.freeOn's comment.
type biasMutex struct {
	mu sync.Mutex
	// Under mu.
	owner   uintptr // the goroutine biased toward, 0 for none
	last    uintptr // the goroutine that ended the last streak, while unbiased
	streak  uint32  // acquisitions in a row that found mu free
	need    uint32  // the streak that biases the lock; 0 until the first Unlock sets biasStreak
	dropped time.Time
	// biases and drops count the lock's biases and drops, for tests.
	biases, drops uint64

	// On a cache line of their own: every operation reads gate (enter)
	// before it takes mu, and under contention, with gate beside mu's
	// word, that read and the CAS after it would move the line twice.
	// (With gate there and TryLock and Unlock called rather than
	// inlined, BenchmarkSmallParallel, locked, 2 to 16 goroutines, made
	// 10–16% fewer pairs a second than the sync.Mutex before.)
	_ cpu.CacheLinePad
	// gate is the owner's identity (curg) while it may open sections, 0
	// while none may: no bias, or mu's holder keeps sections out.
	// Written under mu, read by enter.
	gate uintptr
	// busy is 1 while the owner is in a section: stored by it alone
	// (biasEnter, storeRelease), read by mu's holder.
	busy uint32
	_    cpu.CacheLinePad
}

const (
	biasStreak    = 64
	biasMaxStreak = 1 << 20
	biasDropSpan  = time.Second
)

// enter opens a section: true when the lock is biased toward the
// calling goroutine and no holder keeps sections out. The caller then has
// the lock's protection until it calls leave, which it must before any
// blocking call, driver call or caller's code; false leaves nothing held.
func (m *biasMutex) enter() bool {
	if atomic.LoadUintptr(&m.gate) == 0 {
		return false
	}
	return biasEnter(&m.gate, &m.busy)
}

// leave closes the section enter opened.
func (m *biasMutex) leave() { storeRelease(&m.busy, 0) }

// relock turns a section (biased) into mu held; with biased false, mu is
// held already. The pool's state may have changed in between, as after
// any Lock.
func (m *biasMutex) relock(biased bool) {
	if biased {
		m.leave()
		m.Lock()
	}
}

// Lock locks mu, then keeps sections out; a caller other than the owner
// drops the bias.
func (m *biasMutex) Lock() {
	contended := !m.mu.TryLock() // a Lock that waits ends the streak
	if contended {
		m.mu.Lock()
	}
	m.held(false, contended)
}

// lockContended is Lock after a TryLock that found mu held (no second
// TryLock): the acquisition ends the streak.
func (m *biasMutex) lockContended() {
	m.mu.Lock()
	m.held(false, true)
}

// TryLock is Lock if mu is free (which may then wait for the owner's
// section to end), and false at once if not.
func (m *biasMutex) TryLock() bool {
	if !m.mu.TryLock() {
		return false
	}
	m.tried()
	return true
}

// tried is TryLock's work once mu.TryLock succeeded, and unlocking
// Unlock's before mu.Unlock: AllocOn and freeOn write TryLock and
// Unlock out as these and mu's own, which then inline into them as
// sync.Mutex's did. Under contention every call in the holder's way
// lengthens each hold: with TryLock and Unlock called,
// BenchmarkSmallParallel (locked, 2 to 16 goroutines) made 10–16% fewer
// pairs a second than with the sync.Mutex before.
func (m *biasMutex) tried() {
	if m.owner != 0 {
		m.shut(false)
	} else {
		m.streak++
	}
}

// unlocking: see tried.
func (m *biasMutex) unlocking() {
	if m.owner != 0 || m.streak >= m.need {
		m.reopen()
	}
}

// lockAside is Lock for the pool's look-asides: the bias survives it.
func (m *biasMutex) lockAside() {
	m.mu.Lock()
	m.held(true, false)
}

// held is what a holder does once mu is locked: shut the gate if the
// lock is biased, else count the streak. A streak counts acquisitions
// that found mu free (no identity per acquisition: a curg call each
// cost the unbiased lock 1.5 ns); reopen checks whose they were.
func (m *biasMutex) held(aside, contended bool) {
	switch {
	case m.owner != 0:
		m.shut(aside)
	case contended:
		if m.streak != 0 { // mostly 0 under contention: no store to mu's cache line, which waiters read
			m.streak = 0
		}
	case !aside:
		m.streak++
	}
}

// Unlock opens the gate to the owner again (or biases the lock after a
// long enough streak), then unlocks mu.
func (m *biasMutex) Unlock() {
	m.unlocking()
	m.mu.Unlock()
}

// reopen is Unlock's case of a bias, or of a streak that may make one.
// A streak of need uncontended acquisitions biases the lock toward the
// goroutine that ends it if the streak before ended with it too: two
// goroutines taking turns may pass for one (each streak ending with the
// same one of them), and then pay for a drop, a barrier of about 2 µs,
// at most every need acquisitions, need doubling at each such drop.
func (m *biasMutex) reopen() {
	if m.need == 0 { // the zero value's
		m.need = biasStreak
	}
	if m.owner == 0 && m.streak >= m.need {
		m.streak = 0
		if me := curg(); me != m.last {
			m.last = me // the next streak tells
		} else if biasable {
			m.bias()
		}
	}
	if m.owner != 0 {
		atomic.StoreUintptr(&m.gate, m.owner)
	}
}

// shut keeps sections out while mu is held, the lock biased: see
// biasMutex.
func (m *biasMutex) shut(aside bool) {
	o := m.owner
	atomic.StoreUintptr(&m.gate, 0)
	me := curg()
	if o == me { // the owner: in no section
		return
	}
	m.revoke()
	if aside && !biasBroken.Load() {
		return
	}
	m.owner, m.last = 0, 0
	m.drops++
	now := time.Now()
	if now.Sub(m.dropped) > biasDropSpan {
		m.need = biasStreak
	} else {
		m.need = min(2*m.need, biasMaxStreak)
	}
	m.dropped = now
}

// revoke waits, the gate shut, for the owner's section to end.
func (m *biasMutex) revoke() {
	if err := processBarrier(); err != nil {
		biasBroken.Store(true)
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms) // stops the world: a barrier on every thread
	}
	for i := 0; atomic.LoadUint32(&m.busy) != 0; i++ {
		if i >= 64 {
			runtime.Gosched() // the owner was preempted mid-section
		}
	}
}

// bias biases the lock toward m.last, once the process barrier is known
// to work (barrierReady).
func (m *biasMutex) bias() {
	if biasBroken.Load() || !barrierReady() {
		return // asked again a streak later: three loads
	}
	m.owner = m.last
	m.biases++
}

// biasBroken: the process barrier failed once; no lock is biased again.
var biasBroken atomic.Bool

// registerBarrier registers the process for processBarrier, once; it
// blocks for as long as the kernel takes.
var registerBarrier = sync.OnceValue(registerProcessBarrier)

// barrierAsked: barrierReady started the registration. barrierOK:
// registerBarrier returned nil.
var barrierAsked, barrierOK atomic.Bool

// barrierReady reports whether the process is registered for
// processBarrier. The first call starts the registration in a goroutine
// of its own and reports false, as every call does until it succeeded:
// in a process with more than one thread, membarrier(2)'s registration
// waits for an RCU grace period, 11–30 ms on the H100 machine's 16-core
// host (17–53 µs on the 2-core development VM; 2026-12-08), which, made
// by the first bias under the lock, a process's first allocations paid:
// the cold replay of lstm on that H100 took 2.4–5.8 µs per operation,
// against 1.0–1.6 with the code before the biased lock (six processes
// each, tlsf-stress replay, bench/replay-h100/2026-12-08). The lock then
// stays unbiased until a streak after the registration ended.
func barrierReady() bool {
	if barrierOK.Load() {
		return true
	}
	if !barrierAsked.Load() && barrierAsked.CompareAndSwap(false, true) {
		go registerBarrierNow()
	}
	return false
}

// registerBarrierNow registers the process for processBarrier and
// records the outcome for barrierReady; true if it worked. A refusal
// marks the barrier broken (biasBroken), so that no lock asks again.
func registerBarrierNow() bool {
	if registerBarrier() != nil {
		biasBroken.Store(true)
		return false
	}
	barrierOK.Store(true)
	return true
}
