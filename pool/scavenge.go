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
// cuMemGetInfo; below the floor, it takes the pool's lock and returns up
// to scavengeStep bytes (64 MiB; at least one whole handle), those under
// the largest free blocks first (vmmHeap.release), and when the heap
// alone has too little, the per-P caches' blocks too. So memory goes back
// at up to 6.4 GiB/s, and a process that starts after this one went idle
// finds a few GiB within the second.
//
// # Cost
//
// Above the floor: one cuMemGetInfo per wake, about 2.5 µs on an H200,
// 0.025% of one CPU, under the pool's lock (held for that call alone). Below it: the pool's lock for one step,
// a walk of the index (about 10 ns per block) plus the driver's time for
// what it returns: 32 one-page handles at most (about 30 µs each to unmap
// and release on an H200, 1 ms in all, a tenth of the period), or one or
// two large handles (under 0.2 ms). Callers wait for the lock that long
// at most, once per period, and only while the device is short of
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
	// scavengeStep: bytes returned per wake at most, so that a step holds
	// the pool's lock for about 1 ms at worst (see Cost above).
	scavengeStep = 64 << 20
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
				p.mu.Lock()
				if !p.closed {
					_, _ = p.scavengeLocked()
				}
				p.mu.Unlock()
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

// scavengeLocked is one step of the scavenger: if the device's free
// memory is below FreeFloorFraction × total, return up to scavengeStep
// bytes of unused memory (the shortfall, if less), the per-P caches'
// blocks too if the heap alone has not enough. It returns the bytes
// returned. Pool lock held.
func (p *Pool) scavengeLocked() (uint64, error) {
	free, total, err := p.dev.MemGetInfo()
	if err != nil {
		return 0, err
	}
	floor := uint64(p.opts.FreeFloorFraction * float64(total))
	if free >= floor {
		return 0, nil
	}
	want := min(floor-free, scavengeStep)
	n, err := p.releaseUnused(want)
	if err != nil || n >= want || p.cache == nil {
		p.c.scavenged += n
		return n, err
	}
	p.flushCaches()
	m, err := p.releaseUnused(want - n)
	n += m
	p.c.scavenged += n
	return n, err
}
