package pool

// No stranded blocks (cache.go): blocks a P sheds go to the central
// lists, which any P's refill reads before the index, and back to the
// index before the heap grows; the cache of a P that stopped allocating
// is adopted by the P that finds it idle (or, with no P named, goes to
// the central lists).

import (
	"slices"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/tlsf"
	"github.com/stretchr/testify/require"
)

// cachedSmall allocates and frees n blocks of size bytes, so that they
// end up on the current P's cache, and returns the stats after.
func cachedSmall(t *testing.T, p *Pool, d testDevice, n int, size uint64) Stats {
	t.Helper()
	var ptrs []uintptr
	for range n {
		ptr, err := p.Alloc(size)
		require.NoError(t, err)
		ptrs = append(ptrs, ptr)
	}
	for _, ptr := range ptrs {
		require.NoError(t, p.Free(ptr))
	}
	checkStep(t, p, d)
	return p.Stats()
}

func TestIdleCachesDrainToTheCentralListsAndRefillOthers(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			d := onSim(sim.New(sim.Config{Capacity: giB}))
			p := openPool(t, d, Options{Backend: be, Cache: CacheOptions{Eager: true}})
			before := cachedSmall(t, p, d, 64, 4*kiB)
			require.Positive(t, before.Cached)

			// Two scans with no cached call between them: every cache is
			// idle (none is the scanner's own: self −1).
			p.mu.Lock()
			p.cache.drainIdle(-1)
			p.cache.drainIdle(-1)
			central := p.cache.centralBytes
			stacks := uint64(0)
			for i := range p.cache.ps {
				stacks += p.cache.ps[i].stackBytes
			}
			p.mu.Unlock()
			require.Zero(t, stacks, "idle caches are drained")
			require.Equal(t, before.Cached, central, "onto the central lists, within the cache budget")
			checkStep(t, p, d)
			s := p.Stats()
			require.Equal(t, before.Cached, s.Cached, "central lists count as cached")

			// A refill on this P takes them back: no new index space.
			ptr, err := p.Alloc(4 * kiB)
			require.NoError(t, err)
			s = p.Stats()
			require.Equal(t, before.IndexFree, s.IndexFree, "served from the central list")
			require.Equal(t, before.Grows, s.Grows)
			require.NoError(t, p.Free(ptr))
			checkStep(t, p, d)
		})
	}
}

func TestCentralBlocksGoBackBeforeTheHeapGrows(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	// 4 MiB up front; 2 MiB of small blocks end up cached, then on the
	// central lists; a 3 MiB request fits only if they come back.
	p := openPool(t, d, Options{Backend: BackendVMM, InitialFraction: 4.0 / 1024, Cache: CacheOptions{Eager: true, MaxSize: miB}})
	require.Equal(t, 4*miB, p.Stats().Reserved)
	before := cachedSmall(t, p, d, 32, 64*kiB)
	require.Positive(t, before.Cached)
	p.mu.Lock()
	p.cache.drainIdle(-1)
	p.cache.drainIdle(-1)
	p.mu.Unlock()
	big, err := p.Alloc(3 * miB)
	require.NoError(t, err)
	s := p.Stats()
	require.Equal(t, before.Grows, s.Grows, "no growth while cached blocks could serve")
	require.Equal(t, 4*miB, s.Reserved)
	require.Zero(t, s.Cached)
	require.NoError(t, p.Free(big))
	checkStep(t, p, d)
}

func TestFreeingABlockOnACentralListIsADoubleFree(t *testing.T) {
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Eager: true}})
	ptr, err := p.Alloc(4 * kiB)
	require.NoError(t, err)
	require.NoError(t, p.Free(ptr))
	p.mu.Lock()
	p.cache.drainIdle(-1)
	p.cache.drainIdle(-1)
	p.mu.Unlock()
	before := p.Stats()
	require.ErrorIs(t, p.Free(ptr), ErrDoubleFree)
	require.Equal(t, withoutCounters(before), withoutCounters(p.Stats()))
	checkStep(t, p, d)
}

// A goroutine that moved to another P finds its blocks as it left them:
// the stacks of a cache whose P stopped allocating go under the current
// P's (adoptIdle), at an idle scan and before the heap grows, rather
// than to the central lists and the index; and they are served newest
// first, from this P's stack or, should the goroutine move again, by a
// refill that takes them from another P's.
func TestAnIdlePsCacheIsAdoptedInOrder(t *testing.T) {
	for _, at := range []string{"idle scan", "before a growth"} {
		t.Run(at, func(t *testing.T) {
			p, d, before, class, _ := cachedForTwoPs(t)
			c := p.cache

			// Every cached block onto another P's stack, as if freed there
			// by a goroutine that then moved to this P. No require under
			// the pool's lock: a failure would leave it held.
			p.mu.Lock()
			self := procPin()
			procUnpin()
			other := (self + 1) % len(c.ps)
			stack := onStack(p, other, class, allCached(p), true)
			if at == "idle scan" {
				c.drainIdle(self)
			} else {
				c.reclaimOthersOn(self)
			}
			left := len(c.ps[other].stacks[class])
			adopted := slices.Clone(c.ps[self].stacks[class])
			central := c.centralBlocks
			p.mu.Unlock()
			require.Zero(t, left, "the idle cache is adopted")
			require.Equal(t, stack, adopted, "in its order")
			require.Zero(t, central)
			checkStep(t, p, d)
			s := p.Stats()
			require.Equal(t, before.Cached, s.Cached, "still cached")
			require.Equal(t, before.IndexFree, s.IndexFree)

			var got []uint64
			for range stack {
				ptr, err := p.Alloc(4 * kiB)
				require.NoError(t, err)
				got = append(got, uint64(ptr))
			}
			slices.Reverse(stack)
			require.Equal(t, stack, got, "the newest first, whichever P serves them")
			for _, a := range got {
				require.NoError(t, p.Free(uintptr(a)))
			}
			checkStep(t, p, d)
		})
	}
}

// cachedForTwoPs opens a VMM pool with blocks of 4 KiB cached (a refill's
// 16), skipping the test where GOMAXPROCS gives a single cache, and
// returns it, its device, its stats, and the blocks' class and bytes.
func cachedForTwoPs(t *testing.T) (*Pool, testDevice, Stats, int, uint64) {
	t.Helper()
	d := onSim(sim.New(sim.Config{Capacity: giB}))
	p := openPool(t, d, Options{Backend: BackendVMM, Cache: CacheOptions{Eager: true}})
	if len(p.cache.ps) < 2 {
		t.Skip("GOMAXPROCS 1: one cache")
	}
	before := cachedSmall(t, p, d, 8, 4*kiB)
	class, r := p.cache.classes.SizeClass(4 * kiB)
	return p, d, before, class, r
}

// allCached takes every cached block off its stack or list, still
// counted cached, in address order; the caller holds the pool's lock.
func allCached(p *Pool) []uint64 {
	stack := p.cache.takeAll(nil)
	slices.Sort(stack)
	return stack
}

// onStack pushes cached blocks taken off their stacks onto P i's stack
// of class (the last on top) and returns them; the caller holds the
// pool's lock. With idle, P i counts as idle since the last scan.
func onStack(p *Pool, i, class int, stack []uint64, idle bool) []uint64 {
	c := p.cache
	r := c.classes.Size(class)
	pc := &c.ps[i]
	pc.lockWait()
	for _, a := range stack {
		if b, err := p.x.Lookup(a); err == nil {
			p.setOwner(b, uint32(i))
		}
		pc.push(class, a)
		pc.stackBytes += r
		pc.stackBlocks++
	}
	pc.seen = pc.allocs + pc.frees
	if !idle {
		pc.seen++
	}
	pc.unlock()
	return stack
}

// A refill that takes blocks from another P's stack or a central list
// hands out the newest and leaves the next newest on top (the batch's
// last, pushed last); after an idle scan that adopted a stack holding the
// class, it serves that stack's newest without the index.
func TestRefillsServeOtherCachesNewestFirst(t *testing.T) {
	p, d, before, class, r := cachedForTwoPs(t)
	c := p.cache
	newestFirst := func(s []uint64) []uint64 {
		return append([]uint64{s[len(s)-1]}, s[:len(s)-1]...)
	}
	addrs := func(bs []tlsf.Block) []uint64 {
		var out []uint64
		for _, b := range bs {
			out = append(out, b.Addr)
		}
		return out
	}

	// Another P's stack (its owner active: not adopted).
	p.mu.Lock()
	self := procPin()
	procUnpin()
	other := (self + 1) % len(c.ps)
	stack := onStack(p, other, class, allCached(p), false)
	stolen := addrs(c.steal(self, class, len(stack), r))
	onStack(p, other, class, stack, false) // back: steal left them counted cached
	p.mu.Unlock()
	require.Equal(t, newestFirst(stack), stolen)
	checkStep(t, p, d)

	// A central list.
	p.mu.Lock()
	stack = allCached(p)
	for _, a := range stack {
		b, err := p.x.Lookup(a)
		if err == nil {
			p.setOwner(b, centralOwner)
			c.central[class] = append(c.central[class], cblock{a, b.ID})
			c.centralBytes += r
			c.centralBlocks++
		}
	}
	taken := addrs(c.takeCentral(class, len(stack), r))
	onStack(p, other, class, stack, false)
	p.mu.Unlock()
	require.Equal(t, newestFirst(stack), taken)
	checkStep(t, p, d)

	// An idle P's stack, adopted at the scan this refill runs. Pinned to
	// the refill, so that the goroutine cannot move to the other P
	// meanwhile (it may have moved since the first part).
	p.mu.Lock()
	self = procPin()
	other = (self + 1) % len(c.ps)
	stack = onStack(p, other, class, allCached(p), true)
	c.refills = idleScanEvery - 1
	ptr, err := c.refillLocked(4 * kiB)
	procUnpin()
	p.mu.Unlock()
	require.NoError(t, err)
	require.Equal(t, stack[len(stack)-1], uint64(ptr), "the adopted stack's newest")
	s := p.Stats()
	require.Equal(t, before.IndexFree, s.IndexFree, "no block from the index")
	require.NoError(t, p.Free(ptr))
	checkStep(t, p, d)
}
