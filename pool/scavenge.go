package pool

// The background scavenger: returning unused device memory when the GPU
// runs low, whether or not the pool is being called.
//
// # Goal
//
// With FreeFloorFraction f > 0, the device's free memory (cuMemGetInfo)
// should not stay below f × total while this pool holds memory it does
// not use: another process needs it. The check on locked frees
// (afterLockedFree, every ReleaseCheckInterval of them) cannot meet that
// goal alone: a pool that is idle, or whose traffic stays in its per-P
// caches, never reaches it. So, like the Go runtime's background
// scavenger (mgcscavenge.go), a goroutine wakes on its own and returns
// memory until the goal is met or nothing unused is left.
//
// # Pace
//
// The scavenger wakes every scavengePeriod (10 ms). Each wake makes one
// cuMemGetInfo; below the floor, it takes the pool's lock and returns the
// shortfall, scavengeStep bytes (64 MiB) at a time, those under the
// largest free blocks first (vmmHeap.release), and when the heap alone has
// too little, the per-P caches' blocks too, until the wake has made
// scavengeCalls driver calls (a cuMemUnmap over several mappings counted
// once per mapping: Pool.driverWork). The bound is on driver work, not
// bytes: the driver's cost is per handle and mapping (vmm.go), so a wake
// returns 64 MiB of one-page handles (a pool capped by bytes) or up to 4 GiB of
// 128 MiB handles (an uncapped pool's growths). So memory goes back at
// 6.4 GiB/s to 400 GiB/s, and a process that starts after this one went
// idle finds tens of GiB within the second.
//
// # Cost
//
// Above the floor: one cuMemGetInfo per wake, about 2.5 µs on an H200,
// 0.025% of one CPU, under the pool's lock (held for that call alone).
// Below it: the pool's lock for one wake, a walk of the index per 64 MiB
// (about 10 ns per block) plus the driver's time for at most
// scavengeCalls calls: 32 one-page handles (about 30 µs each to unmap and
// release on an H200, 1 ms in all, a tenth of the period), or 32 handles
// of 128 MiB (about 75 µs each, 2.4 ms). Callers wait for the lock that
// long at most, once per period, and only while the device is short of
// memory.
//
// The scavenger runs only with FreeFloorFraction > 0 (and not
// NoScavenger) and stops at Close.
// Tests drive it deterministically through scavengeLocked, one step at a
// time.

import (
	"sync"
	"time"
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
)

// scavenger is the background goroutine's handle.
type scavenger struct {
	stop chan struct{}
	done chan struct{}
	once sync.Once
}

// startScavenger starts the background scavenger if FreeFloorFraction is
// set (pooled backends only).
func (p *Pool) startScavenger() {
	if p.opts.FreeFloorFraction <= 0 || p.pt != nil || p.opts.NoScavenger {
		return
	}
	sc := &scavenger{stop: make(chan struct{}), done: make(chan struct{})}
	p.scav = sc
	go func() {
		defer close(sc.done)
		t := time.NewTicker(scavengePeriod)
		defer t.Stop()
		for {
			select {
			case <-sc.stop:
				return
			case <-t.C:
				p.lockAside()
				if !p.closed {
					_, _ = p.scavengeLocked()
				}
				p.unlockAside()
			}
		}
	}()
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
	want := floor - free
	start := p.driverWork()
	var n uint64
	flushed := p.cache == nil
	// Frees pending on streams whose events completed, and with several
	// streams the caches' blocks once flushed (giveBack), go back to the
	// index before releasing: an idle pool polls no other way. Pending
	// frees still queued stay (the poll does not wait for their events).
	_ = p.pollPending(false)
	for n < want && p.driverWork()-start < scavengeCalls {
		m, err := p.releaseUnused(min(want-n, scavengeStep))
		n += m
		if err != nil {
			p.c.scavenged += n
			return n, err
		}
		if m == 0 {
			if flushed {
				break
			}
			p.flushCaches()
			_ = p.pollPending(false)
			flushed = true
		}
	}
	p.c.scavenged += n
	return n, nil
}
