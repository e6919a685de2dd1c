package pool

// What a user watches an allocator with: the out-of-memory hook and
// message, log events (Options.Logger), and Size. History and snapshots
// are in history.go and snapshot.go.

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gpumem/tlsf/tlsf"
)

// retryAfterHook runs Options.OnOutOfMemory without the pool's lock, then
// the out-of-memory path once more: flush the caches (the hook's frees
// may have landed there), wait for pending frees, search (moving pages a
// block lacks), move what the request needs, search and grow. It reports done when that settled the request, with
// its block or a final error other than out-of-memory. Pool lock held on
// entry and on return, even if the hook panics.
func (p *Pool) retryAfterHook(size, align uint64) (b tlsf.Block, err error, done bool) {
	if p.hooks >= maxOOMHooks {
		return tlsf.Block{}, nil, false // fails as without a hook
	}
	// What the pool mapped while the hook ran (without the lock) is not
	// this request's doing: allocMiss's baseline is what reserved memory
	// is after the hook less what this request itself had mapped by then,
	// its own growth, of which whatever the window released (a Trim, a
	// release of another request) went first, being unused. (Counted in a
	// local: a request of the hook's sets missStart anew meanwhile. A net
	// change would take a release of this request's growth followed by a
	// growth of the hook's as no change, and release the hook's memory.)
	before := p.reserved()
	own, released := before-min(before, p.missStart), p.c.releasedBytes
	if err := p.runOOMHook(size); err != nil {
		return tlsf.Block{}, err, true
	}
	own -= min(own, p.c.releasedBytes-released)
	after := p.reserved()
	p.missStart = after - min(after, own)
	p.c.retries++
	p.flushCaches()
	_ = p.pollPending(true)
	if b, err := p.searchRecycling(size, align); err == nil || !retryable(err) {
		return b, err, true
	}
	if _, rerr := p.releaseFor(size, align); rerr != nil {
		return tlsf.Block{}, fmt.Errorf("pool: releasing unused memory: %w", rerr), true
	}
	if b, err := p.search(size, align); err == nil {
		return b, nil, true
	}
	b, err = p.growAndSearch(size, align)
	if err == nil || !retryable(err) {
		return b, p.growError(size, err), true
	}
	return tlsf.Block{}, nil, false
}

// maxOOMHooks bounds the calls of Options.OnOutOfMemory running at once
// (Pool.hooks): a hook that allocates from the pool, and fails, would
// otherwise call itself until the goroutine's stack ran out. Beyond it a
// failing request fails as without a hook. The count is of every
// goroutine's calls (the pool cannot tell a hook's own request from
// another goroutine's), so it is far above the goroutines a program
// runs in its hooks at once; 1024 recursive calls, each an out-of-memory
// path, take a few MiB of stack.
const maxOOMHooks = 1024

// runOOMHook calls Options.OnOutOfMemory with the pool's lock released,
// and takes it again, even if the hook panics. Callers check maxOOMHooks
// first. Errors: ErrClosed (the hook, or another goroutine meanwhile,
// closed the pool).
func (p *Pool) runOOMHook(size uint64) error {
	hook := p.opts.OnOutOfMemory
	size = p.requested(size)
	asked, pitched := p.asked, p.pitched // another goroutine's request may take the lock meanwhile
	p.asked, p.pitched = 0, false
	defer func() { p.asked, p.pitched = asked, pitched }()
	// Calls made while the lock is free (the hook's own, other
	// goroutines') are not this request's out-of-memory path.
	path := Path(p.dev.path.Load())
	p.dev.leave(PathOther)
	p.hooks++
	p.mu.Unlock()
	func() {
		defer func() {
			p.mu.Lock()
			p.hooks--
			p.dev.leave(path)
		}()
		hook(size)
	}()
	if p.closed {
		return ErrClosed
	}
	return nil
}

// requested returns the caller's request for a block of size bytes: the
// request a cache refill allocates its class's size for (Pool.asked), else
// size; in guard mode less the red zone the layer added to it (every
// request there but AllocPitch's, Pool.pitched, comes through the layer).
// Pool lock held.
func (p *Pool) requested(size uint64) uint64 {
	if p.asked != 0 {
		size = p.asked
	}
	if d := p.dbg; d != nil && !p.pitched {
		size -= min(d.guard, size)
	}
	return size
}

// oomError builds ErrOutOfMemory's message for a request of size bytes:
// the request, allocated and reserved bytes, the cap, the largest block
// the pool could allocate now and the device's free memory, as this
// request's growth attempt read it or else, in a pool with a heap, the
// pool's last cuMemGetInfo did (the message says so, and that the
// largest block assumes the device still has that much free, or, on a
// device the pool found full, no new memory past the limit it keeps
// there: share.go; within the cap either way): a request failed without
// a look at the device (at the cap, or at a full device's limit) makes
// no driver call for its message. (It used to give the largest block
// from the memory the pool held alone: 0 bytes for a pool 124 MiB below
// its cap that then served 120 MiB at once.) A passthrough pool asks the
// driver: its failures are the driver's own. Pool lock held.
func (p *Pool) oomError(size uint64, cause error) error {
	size = p.requested(size)
	free, total := p.seen.now(p.reserved()), p.total
	when := ""
	if !p.seen.ok { // no growth attempt read it during this request
		if seen, ok := p.dev.seenFree(); ok && p.pt == nil {
			free, when = seen.now(p.reserved()), " at the pool's last look, with what the pool mapped or released since"
		} else {
			free, total, _ = p.dev.MemGetInfo()
		}
	}
	limit := "no cap"
	var terms []string // what the largest block assumes
	if capped, c := p.capFrom(free); capped {
		limit = "cap " + sizeString(c)
		terms = append(terms, "within the cap")
	}
	largest, held := p.largestAllocatable(free)
	if when != "" {
		terms = append(terms, "if the device still has the free memory of the last look")
		if p.full.on {
			// A full device (share.go): without a look, no new memory
			// past its limit.
			largest, held = p.largestAllocatable(p.full.limit - min(p.full.limit, p.reserved()))
			terms[len(terms)-1] = "without a new look at the full device"
		}
	}
	if held {
		// share.go: a job that wants more than its cap fails fast.
		left := recyclePressureAllocs - (p.c.allocs - (p.pressure - 1))
		terms = append(terms, fmt.Sprintf("moving pages from under free blocks only within %.0f%% of the cap for %d more allocations, as one failed", recycleLiveFraction*100, left))
	}
	largest = p.largestRequest(largest)
	allocated := p.c.allocated
	if d := p.dbg; d != nil {
		allocated, largest = d.lessRed(allocated, largest)
	}
	if len(terms) > 0 {
		terms[0] = " (" + terms[0]
		terms[len(terms)-1] += ")"
	}
	space := ""
	if p.pt == nil {
		space = fmt.Sprintf("; the index's largest free block: %s of address space", sizeString(p.x.LargestFree()))
	}
	msg := fmt.Sprintf("request of %s; allocated %s, reserved %s (%s); largest block that could be allocated %s%s%s; device free %s of %s%s",
		sizeString(size), sizeString(allocated), sizeString(p.reserved()), limit,
		sizeString(largest), strings.Join(terms, ", "), space, sizeString(free), sizeString(total), when)
	p.logOOM(size, free, largest)
	if isOOM(cause) {
		return fmt.Errorf("%w: %s: %w", ErrOutOfMemory, msg, cause)
	}
	return fmt.Errorf("%w: %s", ErrOutOfMemory, msg)
}

// largestAllocatable returns about the largest block the pool could
// allocate now, given the device's free memory: a free block whose
// unbacked pages could be mapped within the cap and the device's free
// memory, or new memory (within the same), and, in a VMM pool, with
// pages moved from under other free blocks where the out-of-memory path
// would move them for a block that size (Pool.mayRecycle). Exact but for
// size classes (oomError rounds it: largestRequest) and pages of a handle
// mapped whole (moved whole), and for where the request lands: the pool
// places it by its own placement among up to placeCandidates blocks, and
// may take a block whose own movable pages the figure counted as backing
// another one (a randomized test found 2 such failures in 300 seeds of 5
// failures each, against most seeds before the figure was taken from a
// block's bottom and rounded to a class). It also reports whether a recent failure held the
// figure down (Pool.mayRecycle moving pages only within
// recycleLiveFraction of the cap then). Pool lock held.
func (p *Pool) largestAllocatable(free uint64) (uint64, bool) {
	headroom := free
	if capped, limit := p.capFrom(free); capped {
		headroom = min(headroom, limit-min(limit, p.reserved()))
	}
	if p.pt != nil {
		return headroom, false
	}
	h := p.vmm
	if h == nil {
		return max(p.x.LargestFree(), headroom/chunkGranularity*chunkGranularity), false
	}
	k := (headroom + h.spare()) / h.gran
	best := h.largestAllocatable(k, nil)
	most, unheld := p.mostRecycled()
	if max(most, unheld) <= best {
		return best, false
	}
	movable, n := h.movablePages()
	if n == 0 {
		return best, false
	}
	moved := h.largestAllocatable(k+n, movable)
	return max(best, min(most, moved)), min(unheld, moved) > max(best, most)
}

// movablePages marks the pages the out-of-memory path could move: those
// of whole mappings under free blocks (vmmHeap.eachFreeMapping), strays
// not included; it returns the marks, indexed by page (kept in the heap
// between calls: out-of-memory errors come thousands a second under
// contention), and their number. Pool lock held.
func (h *vmmHeap) movablePages() ([]bool, uint64) {
	if h.movable == nil {
		h.movable = make([]bool, len(h.mapped))
	}
	movable := h.movable
	clear(movable)
	var n uint64
	h.eachFreeMapping(^uint64(0), func(s, k, _ uint64, _ bool) {
		for pg := s; pg < s+k; pg++ {
			if !h.stray[pg] {
				movable[pg] = true
				n++
			}
		}
	})
	return movable, n
}

// largestAllocatable returns the longest piece from the bottom of a free
// block (the free top of the range extended to its end), where the index
// places a block, whose unbacked pages number at most k. With movable (movablePages), its pages count as unbacked too: k
// then includes them all, and a piece uses up those it lies on, which no
// longer back another piece.
func (h *vmmHeap) largestAllocatable(k uint64, movable []bool) uint64 {
	var best uint64
	top := h.base + h.vsize
	scan := func(a, end uint64) {
		first, last := (a-h.base)/h.gran, (end-h.base+h.gran-1)/h.gran
		standbyEnd := (h.end-h.base)/h.gran + h.standby
		unbacked := func(pg uint64) bool {
			return pg >= standbyEnd || !h.mapped[pg] || h.stray[pg] || (movable != nil && movable[pg])
		}
		// The index allocates a free block's bottom: a piece starts at a.
		var holes uint64
		for j := first; j < last; j++ {
			if unbacked(j) {
				holes++
			}
			if holes > k {
				break
			}
			best = max(best, min(end, h.pageAddr(j+1))-a)
		}
	}
	tail := h.end // start of the free space at the top of the range
	h.x.Walk(func(b tlsf.Block) bool {
		if !b.Free {
			return true
		}
		if b.Addr+b.Size == h.end {
			tail = b.Addr
			return true
		}
		scan(b.Addr, b.Addr+b.Size)
		return true
	})
	if tail < top {
		scan(tail, top)
	}
	return best
}

// Size returns the usable size in bytes of the live allocation at ptr:
// its block's size (at least what was requested, as Stats count it:
// Pool.blockSize; for AllocPitch, the block of pitch × height bytes, at
// least that), or, in a passthrough pool, what the driver allocated
// (pitch × height for AllocPitch); in guard mode (Options.Guard), the
// size requested, since the red zone follows it. Safe for concurrent use;
// it takes the pool's lock.
//
// Errors: ErrUnknownPointer (not a pointer the pool returned, or inside
// an allocation), ErrDoubleFree (freed already), ErrClosed.
func (p *Pool) Size(ptr uintptr) (uint64, error) {
	p.lockAside()
	defer p.unlockAside()
	if p.closed {
		return 0, ErrClosed
	}
	if p.pt != nil {
		if a, ok := p.pt.live[ptr]; ok {
			return a.size, nil
		}
		if _, ok := p.pt.freed[ptr]; ok {
			return 0, fmt.Errorf("%w: %#x", ErrDoubleFree, ptr)
		}
		return 0, fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	}
	if ptr%indexGranularity != 0 {
		return 0, fmt.Errorf("%w: %#x is not %d-byte aligned", ErrUnknownPointer, ptr, indexGranularity)
	}
	if d := p.dbg; d != nil && d.guard > 0 {
		// The caller's bytes end where the red zone starts.
		d.mu.Lock()
		db, ok := d.live[ptr]
		d.mu.Unlock()
		if ok && !db.pitch {
			return db.size, nil
		}
	}
	b, err := p.x.Lookup(uint64(ptr))
	if err != nil {
		return 0, p.translate(uint64(ptr), err)
	}
	switch st := p.state(b.ID); {
	case st == stateLive:
		return b.Size, nil
	case st == stateCached && p.cache.handedOut(p.owner(b), b.Addr):
		return b.Size, nil
	}
	return 0, fmt.Errorf("%w: %#x", ErrDoubleFree, ptr)
}

// handedOut reports whether cache owner handed out the block at addr (it
// is live), rather than holding it free. Pool lock held.
func (c *cacheSet) handedOut(owner uint32, addr uint64) bool {
	if int(owner) >= len(c.ps) {
		return false
	}
	pc := &c.ps[owner]
	pc.lockWait()
	_, ok := pc.live.Get(addr)
	pc.unlock()
	return ok
}

// Log events (Options.Logger): growth and release at Debug, Trim at
// Info, out of memory at Warn; sizes in bytes. Pool lock held: a handler
// must not call the pool, nor panic (a free's start-over logs with the
// lock held and not deferred).

func (p *Pool) logEvent(level slog.Level, msg string, attrs ...slog.Attr) {
	l := p.opts.Logger
	if l == nil || !l.Enabled(context.Background(), level) {
		return
	}
	attrs = append(attrs, slog.Uint64("reserved", p.reserved()), slog.Uint64("allocated", p.c.allocated))
	l.LogAttrs(context.Background(), level, msg, attrs...)
}

// noteGrow records a growth that added n bytes of reserved memory.
func (p *Pool) noteGrow(n uint64) {
	p.logEvent(slog.LevelDebug, "tlsf pool: grew", slog.Uint64("bytes", n), slog.String("backend", p.backend.String()))
}

// noteRelease records a release of n bytes to the driver.
func (p *Pool) noteRelease(n uint64) {
	p.logEvent(slog.LevelDebug, "tlsf pool: released", slog.Uint64("bytes", n))
}

func (p *Pool) logTrim(n uint64, err error) {
	attrs := []slog.Attr{slog.Uint64("bytes", n)}
	if err != nil {
		attrs = append(attrs, slog.String("error", err.Error()))
	}
	p.logEvent(slog.LevelInfo, "tlsf pool: trim", attrs...)
}

func (p *Pool) logOOM(size, free, largest uint64) {
	p.logEvent(slog.LevelWarn, "tlsf pool: out of memory", slog.Uint64("request", size),
		slog.Uint64("device_free", free), slog.Uint64("largest_allocatable", largest))
}
