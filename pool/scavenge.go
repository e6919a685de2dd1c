package pool

// The background scavenger: returning unused device memory when another
// process needs it, whether or not the pool is being called.
//
// # Goal
//
// Two rules, each for a case the other misses:
//
//   - FreeFloorFraction f > 0: the device's free memory (cuMemGetInfo)
//     should not stay below f × total while this pool holds memory it
//     does not use. The check on locked frees (afterLockedFree, every
//     ReleaseCheckInterval of them) cannot meet that goal alone: a pool
//     that is idle, or whose traffic stays in its per-P caches, never
//     reaches it.
//   - IdleRelease (default 500 ms, on unless negative): a pool that made
//     no request or free for that long returns all its unused memory
//     once another process has started or grown since (what others hold
//     on the device rose by idleOthersGrowth, 64 MiB, past the least
//     they held since New or the last release; a CUDA context alone
//     holds more). A floor returns only up to f × total, and a process
//     started after this one went idle asks in one request for more than
//     that as often as not (half a GPU). Its failed request leaves no
//     trace this pool could see, but its context does: so the idle pool
//     gives back everything it does not use, whatever the newcomer
//     wants. A pool alone on its GPU keeps its memory through a pause,
//     and one whose neighbours hold what they held at its last release
//     too: a neighbour that started before this pool did, or before its
//     last release, and fails requests without growing, is served only
//     by a floor (FreeFloorFraction) or Trim; so is one that left and
//     was replaced within 10 s while this pool worked without growing
//     (the least is taken at this pool's own looks, when it grows, every
//     idleLowPeriod while busy, and while idle). "Others" is what the device
//     can tell: it counts this process's memory outside the pool too
//     (cudaMalloc'd workspaces, NCCL's buffers, modules loaded late), so
//     64 MiB of that makes the next pause a release, once. A pool never
//     used keeps InitialFraction's reserve: it is waiting, not idle.
//
// So, like the Go runtime's background scavenger (mgcscavenge.go), a
// goroutine wakes on its own and returns memory.
//
// # Pace
//
// The floor: the scavenger wakes every scavengePeriod (10 ms); each wake makes one cuMemGetInfo; below the floor, it
// returns the shortfall, scavengeStep bytes (64 MiB) at a time, those
// under the largest free blocks first (vmmHeap.release), and when the
// heap alone has too little, the per-P caches' blocks too, until the wake
// has made scavengeCalls driver calls (a cuMemUnmap over several mappings
// counted once per mapping: Pool.driverWork). The bound is on driver
// work, not bytes: the driver's cost is per handle and mapping (vmm.go),
// so a wake returns 64 MiB of one-page handles (a pool capped by bytes)
// or up to 4 GiB of 128 MiB handles (an uncapped pool's growths). So
// memory goes back at 6.4 GiB/s to 400 GiB/s.
//
// Idle: without a floor the scavenger wakes every idleCheckPeriod (100
// ms), and every scavengePeriod while it releases. Each wake compares the
// pool's count of requests and frees with the last wake's
// (Pool.activity: two counters, and two per P where the caches are on).
// Once it has not changed for IdleRelease, and the pool holds unused
// memory after a poll of its pending frees, the wake looks at the device
// (one cuMemGetInfo, at most every idleCheckPeriod); where others grew
// as above, it returns all of the pool's unused memory, idleCalls (512)
// driver calls' work per wake, until none is left or the pool is used
// again. A release goes at up to 51 GiB/s of one-page handles and 3 TiB/s
// of 128 MiB ones, the driver's time aside (on an H200 about 30 µs per
// one-page handle to unmap and release, 75 µs per 128 MiB one: 100 GiB
// takes 1.5 s of it in one-page handles, 60 ms in 128 MiB ones).
// Measured on the simulated H200 with its modelled driver time
// (BenchmarkNewcomerWait, medians of ten, 2026-12-07): a job that
// filled the device to 92% and freed it all, then went idle, let a
// newcomer's request for half the device succeed 656 ms after its first
// try (718 ms for 85%), 154 ms where it had been idle for 2 s already;
// 1.85 s where the idle job's cap (MaxBytes) had it map one-page
// handles.
//
// # Cost
//
// The floor, above it: one cuMemGetInfo per wake, about 2.5 µs on an
// H200, 0.025% of one CPU, under the pool's lock (held for that call
// alone). Below it: the pool's lock for one wake, a walk of the index
// per 64 MiB (about 10 ns per block) plus the driver's time for at most
// scavengeCalls calls: 32 one-page handles (about 30 µs each to unmap and
// release on an H200, 1 ms in all, a tenth of the period), or 32 handles
// of 128 MiB (about 75 µs each, 2.4 ms). Callers wait for the lock that
// long at most, once per period, and only while the device is short of
// memory.
//
// Idle: a busy pool pays the pool's lock for the two counters' read (and
// each P's cache lock for its two), tens of ns a wake, 10 wakes a
// second; where the lock is biased toward the goroutine using the pool
// (bias.go), the wake's lock also costs a process-wide barrier
// (membarrier: about 2 µs, and an interrupt to each CPU running one of
// the process's threads), and one cuMemGetInfo every 10 s (idleLowPeriod). An idle pool
// holding unused memory: one cuMemGetInfo per 100 ms, for as long as it
// stays idle. A release holds the lock of a pool
// no caller uses for up to idleCalls calls a wake (about 8 ms of
// one-page handles on an H200, 19 ms of 128 MiB ones), and the time to
// synchronize streams that freed memory (cuStreamSynchronize, as every
// release); a caller that comes back waits for that wake at most, then
// maps memory again as on a cold start.
//
// The scavenger runs unless NoScavenger is set, or FreeFloorFraction is
// 0 and IdleRelease negative, and stops at Close, or at its next wake
// once the pool is dropped unclosed (it holds the pool weakly). Tests
// drive it
// deterministically through scavengeLocked and idleReleaseLocked, one
// wake at a time.

import (
	"math"
	"sync"
	"time"
	"weak"
)

const (
	// scavengePeriod: a wake every 10 ms finds a shortage within 10 ms for
	// 100 cuMemGetInfo calls a second (see Cost above).
	scavengePeriod = 10 * time.Millisecond
	// scavengeStep: bytes asked of the heap at a time within a wake.
	scavengeStep = 64 << 20
	// scavengeCalls: driver calls per wake, after which the wake stops
	// (it may pass the bound by one step's calls), so that a wake holds
	// the pool's lock for a few ms at worst (see Cost above).
	scavengeCalls = 64
	// idleCheckPeriod: while idle, the device's free memory is read at
	// most this often (10 cuMemGetInfo a second, 25 µs of an H200 host's
	// time) until a release begins.
	idleCheckPeriod = 100 * time.Millisecond
	// idleCalls: driver calls per wake of an idle pool's release (see
	// Idle above): 8 times scavengeCalls, as no caller waits for the lock.
	idleCalls = 8 * scavengeCalls
	// idleOthersGrowth: how much more others must hold than the least
	// they held since New or the last release before an idle pool gives
	// its memory back: less than any CUDA context (hundreds of MiB on an
	// H100 or H200, 526 MiB on the H200 of 2026-12), more than the
	// driver's own allocations of a process at work (streams, events,
	// modules: a few MiB).
	idleOthersGrowth = 64 << 20
	// idleLowPeriod: while the pool is busy, the scavenger looks at the
	// device this often (one cuMemGetInfo, 2.5 µs on an H200), so that a
	// neighbour that left while the pool worked without growing lowers
	// the least others held. Jobs come and go minutes apart; a warm
	// replay of a few seconds makes no such call.
	idleLowPeriod = 10 * time.Second
)

// scavenger is the background goroutine's handle.
type scavenger struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startScavenger starts the background scavenger of a pooled backend,
// unless NoScavenger is set or neither FreeFloorFraction nor IdleRelease
// applies. The goroutine holds the pool through a weak pointer: a pool
// dropped without Close stops it at its next wake (its device memory is
// not returned: only Close does that).
func (p *Pool) startScavenger() {
	if p.pt != nil || p.opts.NoScavenger || (p.opts.FreeFloorFraction <= 0 && p.opts.IdleRelease < 0) {
		return
	}
	sc := &scavenger{stop: make(chan struct{}), done: make(chan struct{})}
	p.scav = sc
	wp := weak.Make(p)
	period := p.wakePeriod()
	go func() {
		defer close(sc.done)
		t := time.NewTicker(period)
		defer t.Stop()
		for {
			select {
			case <-sc.stop:
				return
			case now := <-t.C:
				p := wp.Value()
				if p == nil {
					return
				}
				if next := p.wake(now); next != period {
					period = next
					t.Reset(period)
				}
			}
		}
	}()
}

// wake is one wake of the scavenger at time now, under the pool's lock;
// it returns the period until the next.
func (p *Pool) wake(now time.Time) time.Duration {
	p.lockAside()
	defer p.unlockAside()
	if !p.closed {
		p.wakeLocked(now)
	}
	return p.wakePeriod()
}

// wakePeriod is scavengePeriod where the floor applies or an idle
// release is under way, else idleCheckPeriod. Pool lock held, or New.
func (p *Pool) wakePeriod() time.Duration {
	if p.opts.FreeFloorFraction > 0 || p.idle.releasing {
		return scavengePeriod
	}
	return idleCheckPeriod
}

// wakeLocked is one wake of the scavenger at time now: FreeFloorFraction's
// rule, then IdleRelease's. Errors are dropped: the next wake tries
// again, and the pool's callers see the driver's state for themselves.
// Pool lock held.
func (p *Pool) wakeLocked(now time.Time) {
	if p.opts.FreeFloorFraction > 0 {
		_, _ = p.scavengeLocked()
	}
	_, _ = p.idleReleaseLocked(now)
}

// halt stops the scavenger and waits for it to exit. Safe to call more
// than once; the caller must not hold the pool's lock (the goroutine may
// be waiting for it).
func (sc *scavenger) halt() {
	if sc == nil {
		return
	}
	sc.once.Do(func() { close(sc.stop) })
	<-sc.done
}

// driverWork is the driver calls the pool has made, a cuMemUnmap over m
// mappings counted as m calls (vmmHeap.unmapWork): the scavenger's pace.
func (p *Pool) driverWork() uint64 {
	w := p.dev.counts().Total()
	if h := p.vmm; h != nil {
		w += h.unmapWork
	}
	return w
}

// scavengeLocked is one wake of the scavenger: if the device's free
// memory is below FreeFloorFraction × total, return unused memory up to
// the shortfall, scavengeStep bytes at a time, pending frees whose
// streams passed them (a poll: an event recorded on each stream with
// frees not yet sealed, a synchronization where that fails, and an event
// query per batch) and the per-P caches' blocks
// too if the heap alone has not enough, until about scavengeCalls driver
// calls' work is done (driverWork). It returns the bytes returned. Pool
// lock held.
func (p *Pool) scavengeLocked() (uint64, error) {
	prev := p.dev.enter(PathScavenge)
	defer p.dev.leave(prev)
	free, total, err := p.dev.MemGetInfo()
	if err != nil {
		return 0, err
	}
	floor := uint64(p.opts.FreeFloorFraction * float64(total))
	if free >= floor {
		return 0, nil
	}
	n, _, err := p.scavengeUpTo(floor-free, scavengeCalls)
	return n, err
}

// scavengeUpTo returns up to want bytes of unused memory, scavengeStep
// bytes at a time, until about calls driver calls' work is done
// (driverWork): pending frees whose streams passed them first (a poll:
// an event recorded on each stream with frees not yet sealed, a
// synchronization where that fails, and an event query per batch), the
// per-P caches' blocks too once the heap alone has no more. It returns
// the bytes returned (counted in ScavengedBytes) and whether nothing
// unused was left to return. Pool lock held; the caller entered
// PathScavenge.
func (p *Pool) scavengeUpTo(want, calls uint64) (n uint64, exhausted bool, err error) {
	start := p.driverWork()
	flushed := p.cache == nil
	// Frees pending on streams whose events completed, and with several
	// streams the caches' blocks once flushed (giveBack), go back to the
	// index before releasing: an idle pool polls no other way. Pending
	// frees still queued stay (the poll does not wait for their events).
	_ = p.pollPending(false)
	for n < want && p.driverWork()-start < calls {
		var m uint64
		m, err = p.releaseUnused(min(want-n, scavengeStep))
		n += m
		if err != nil {
			break
		}
		if m == 0 {
			if flushed {
				exhausted = true
				break
			}
			p.flushCaches()
			_ = p.pollPending(false)
			flushed = true
		}
	}
	p.c.scavenged += n
	return n, exhausted, err
}

// idleWatch is the scavenger's view of the pool's activity and of the
// other processes on its device, for IdleRelease. Pool lock held.
type idleWatch struct {
	ops       uint64    // requests and frees seen at the last wake (activity)
	since     time.Time // the wake that saw ops change
	checked   time.Time // the last look at the device
	othersLow uint64    // the least others held (bytes) since New or the last release
	seen      seenFree  // the pool's last look (Pool.seen) taken into othersLow
	trigger   uint64    // what others held when the release began
	releasing bool      // a release began and has more to return
}

// activity counts the pool's allocation requests under its lock (failed
// ones too: a caller retrying a request is not idle), its frees, and the
// per-P caches' allocations and frees. Pool lock held.
func (p *Pool) activity() uint64 {
	return p.full.reqs + p.c.frees + p.cache.sum(func(pc *pcache) uint64 { return pc.allocs + pc.frees })
}

// idleReleaseLocked is IdleRelease's rule at a wake at time now. Once the
// pool, used at least once, has made no request or free for IdleRelease
// it looks, at most every idleCheckPeriod, at what it holds unused
// (reserved, less the blocks in use and the frees still pending after a
// poll) and, where there is some, at what others hold on the device
// (othersNow). Where that grew by idleOthersGrowth past the least it was
// since New or the last release (a process started, or a neighbour
// grew), the pool returns all its unused memory, idleCalls driver calls'
// work per wake, until none is left or the pool is used again. While the
// pool is busy, the looks its own growths take (Pool.seen) lower the
// least too, and so does a look of the scavenger's every idleLowPeriod:
// a neighbour that left while the pool worked, and another that comes,
// count. It returns the bytes returned at this wake. Pool lock held.
func (p *Pool) idleReleaseLocked(now time.Time) (uint64, error) {
	if p.opts.IdleRelease <= 0 {
		return 0, nil
	}
	w := &p.idle
	// Wakes come a few µs early or late: half a period of slack, so that
	// a check due at a wake is not put off to the next.
	const slack = scavengePeriod / 2
	if s := p.seen; s.ok && s != w.seen {
		w.seen = s
		w.othersLow = min(w.othersLow, p.total-min(p.total, s.free+s.reserved))
	}
	if ops := p.activity(); ops != w.ops || w.since.IsZero() {
		if w.since.IsZero() {
			w.checked = now
		}
		w.ops, w.since, w.releasing = ops, now, false
		if ops == 0 || now.Sub(w.checked) < idleLowPeriod-slack {
			return 0, nil
		}
		// Busy for idleLowPeriod since the last look: one more, so that a
		// neighbour that left while the pool worked lowers the least.
		w.checked = now
		_, err := p.othersNow()
		return 0, err
	}
	if w.ops == 0 || now.Sub(w.since) < p.opts.IdleRelease-slack {
		return 0, nil // never used (InitialFraction's reserve stays), or not idle long enough
	}
	if !w.releasing {
		if now.Sub(w.checked) < idleCheckPeriod-slack {
			return 0, nil
		}
		w.checked = now
		prev := p.dev.enter(PathScavenge)
		_ = p.pollPending(false) // frees whose streams are done count as unused
		p.dev.leave(prev)
		r := p.reserved()
		if r-min(r, p.activeNow()) == 0 {
			return 0, nil
		}
		others, err := p.othersNow()
		if err != nil || others < w.othersLow+idleOthersGrowth {
			return 0, err
		}
		w.releasing, w.trigger = true, others
	}
	prev := p.dev.enter(PathScavenge)
	defer p.dev.leave(prev)
	n, exhausted, err := p.scavengeUpTo(math.MaxUint64, idleCalls)
	switch {
	case err != nil:
		w.releasing = false // looked at again after idleCheckPeriod
	case exhausted:
		w.releasing = false
		if p.c.pendingBlocks == 0 {
			// Done: the next release waits for others to grow again
			// (looks the pool took before count no more). Frees still
			// pending keep the old mark, so that they go back once
			// their streams pass them.
			w.othersLow, w.seen = w.trigger, p.seen
		}
	}
	return n, err
}

// othersNow returns what others hold on the device in bytes: total less
// free (cuMemGetInfo) less the pool's reserved memory, other processes'
// memory and contexts, and this process's context and its memory outside
// the pool. It lowers idleWatch.othersLow to it. Pool lock held.
func (p *Pool) othersNow() (uint64, error) {
	prev := p.dev.enter(PathScavenge)
	defer p.dev.leave(prev)
	free, total, err := p.dev.MemGetInfo()
	if err != nil {
		return 0, err
	}
	others := total - min(total, free+p.reserved())
	p.idle.othersLow = min(p.idle.othersLow, others)
	return others, nil
}
