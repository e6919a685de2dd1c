package pool

import (
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/gpumem/tlsf/device"
)

// passthrough sends every request to the driver, keeping only what
// statistics and error checks need: the live allocations and a bounded
// memory of recent frees (to tell a double free from a foreign pointer).
type passthrough struct {
	live     map[uintptr]ptAlloc
	freed    map[uintptr]struct{}
	reserved uint64
	// stuck holds pitch allocations refused by the cap whose cuMemFree
	// failed: still the pool's, counted as reserved, freed again at the
	// next free and at Close.
	stuck map[uintptr]uint64
}

// maxFreedMemory bounds the freed-pointer memory; past it, a double free
// of an old pointer is reported as ErrUnknownPointer.
const maxFreedMemory = 1 << 16

func newPassthrough() *passthrough {
	return &passthrough{live: map[uintptr]ptAlloc{}, freed: map[uintptr]struct{}{}, stuck: map[uintptr]uint64{}}
}

// ptAlloc is a live allocation of a passthrough pool.
type ptAlloc struct {
	size    uint64 // driver bytes (pitch × height for pitch)
	counted uint64 // the bytes statistics count it at (Pool.blockSize)
}

// admits reports whether size bytes more of reserved memory fit the
// device's total memory and the cap (admit, with no error made).
func (t *passthrough) admits(p *Pool, size uint64) bool {
	capped, limit, _ := p.cap() // its error is always nil
	return size <= p.total && !(capped && (size > limit || t.reserved+size > limit))
}

// admit checks the cap for bytes more of reserved memory: nil where
// admits, else the out-of-memory error, counted. Where pitch probes whose
// cuMemFree failed (stuck) hold reserved memory the request needs, it
// frees them first: nothing else would while nothing is allocated.
func (t *passthrough) admit(p *Pool, size uint64) error {
	if !t.admits(p, size) && len(t.stuck) > 0 {
		_ = t.freeStuck(p) // those it cannot free stay, counted
	}
	if t.admits(p, size) {
		return nil
	}
	return t.refuse(p, size)
}

// refuse counts and returns the out-of-memory error of a request of size
// bytes that admits refuses.
func (t *passthrough) refuse(p *Pool, size uint64) error {
	p.c.ooms++
	capped, limit, _ := p.cap()
	switch {
	case size > p.total:
		// As a pooled backend says it (Pool.hopeless): the driver's error.
		return p.oomError(size, fmt.Errorf("a block of %s exceeds the device's total memory: %w", sizeString(size), device.ErrOutOfMemory))
	case capped && size > limit:
		return fmt.Errorf("%w: a block of %s exceeds the cap", p.oomError(size, nil), sizeString(size))
	default:
		return fmt.Errorf("%w: it would take reserved memory past the cap", p.oomError(size, nil))
	}
}

func (t *passthrough) alloc(p *Pool, size uint64, s device.Stream) (uintptr, error) {
	if p.opts.OnOutOfMemory != nil {
		// The out-of-memory hook, then one more try (observe.go).
		capped, limit, err := p.cap()
		if err != nil {
			return 0, err
		}
		free, _, err := p.dev.MemGetInfo()
		if err != nil {
			return 0, err
		}
		hopeless := (capped && size > limit) || size > p.total // as hopeless() in the pool
		if !hopeless && p.hooks < maxOOMHooks && ((capped && t.reserved+size > limit) || size > free) {
			if err := p.runOOMHook(size); err != nil {
				return 0, err
			}
		}
	}
	if err := t.admit(p, size); err != nil {
		return 0, err
	}
	ptr, err := p.dev.MemAlloc(size)
	if err != nil {
		return 0, t.driverError(p, size, err)
	}
	t.noteAlloc(p, ptr, size, p.blockSize(size, s))
	return ptr, nil
}

func (t *passthrough) allocPitch(p *Pool, width, height uint64) (uintptr, uint64, error) {
	// A pitch is at least the width: where even width × height is past
	// the cap, the request fails before the driver allocates anything.
	if err := t.admit(p, width*height); err != nil {
		return 0, 0, err
	}
	ptr, pitch, err := p.dev.MemAllocPitch(width, height, 4)
	if err != nil {
		return 0, 0, t.driverError(p, width*height, err)
	}
	size := pitch * height
	if !t.admits(p, size) {
		// The driver's pitch took it past the cap: freed before the error
		// is made, so that the free memory the error reports is the
		// device's without it.
		if p.dev.MemFree(ptr) != nil {
			t.stuck[ptr] = size
			t.reserved += size
			p.noteReserved()
		}
		return 0, 0, t.refuse(p, size)
	}
	// Counted at its size class, as a pooled backend aligns it on a GPU's
	// 512-byte pitch unit (AllocAligned). (On a device whose unit is 256
	// bytes or less, a pooled pitch allocation is a best-fit block,
	// counted at 256-byte rounding.)
	_, r := p.x.SizeClass(size)
	t.noteAlloc(p, ptr, size, r)
	return ptr, pitch, nil
}

func (t *passthrough) driverError(p *Pool, size uint64, err error) error {
	if isOOM(err) {
		p.c.ooms++
		return p.oomError(size, err)
	}
	return fmt.Errorf("pool: passthrough allocation of %d bytes: %w", size, err)
}

// noteAlloc records a live allocation of size driver bytes at ptr, which
// statistics count at r bytes (the block a pooled backend would give it).
func (t *passthrough) noteAlloc(p *Pool, ptr uintptr, size, r uint64) {
	t.live[ptr] = ptAlloc{size, r}
	delete(t.freed, ptr)
	t.reserved += size
	c := &p.c
	c.allocs++
	c.bySize[sizeBucket(r)]++
	c.allocated += r
	c.active += r
	c.allocations++
	p.notePeaks()
	p.noteReserved()
}

// free frees ptr, last used on stream s. It synchronizes s first: the
// driver's cuMemFree waits for the GPU too, but the pool does not lean on
// that (the simulated device reports it as a violation).
func (t *passthrough) free(p *Pool, ptr uintptr, s device.Stream) error {
	live, ok := t.live[ptr]
	if !ok {
		// Inside a live allocation first: the driver may have reused a
		// freed pointer's address for a larger allocation below it.
		for a, n := range t.live {
			if ptr > a && uint64(ptr-a) < n.size {
				return fmt.Errorf("%w: %#x is inside the allocation at %#x", ErrUnknownPointer, ptr, a)
			}
		}
		if _, was := t.freed[ptr]; was {
			return fmt.Errorf("%w: %#x", ErrDoubleFree, ptr)
		}
		return fmt.Errorf("%w: %#x", ErrUnknownPointer, ptr)
	}
	if err := p.dev.StreamSynchronize(s); err != nil && !streamGone(err) { // a destroyed stream: see streams.go
		return fmt.Errorf("pool: passthrough free of %#x on stream %#x: %w", ptr, uintptr(s), err)
	}
	if err := p.dev.MemFree(ptr); err != nil {
		return fmt.Errorf("pool: passthrough free of %#x: %w", ptr, err)
	}
	delete(t.live, ptr)
	if len(t.freed) >= maxFreedMemory {
		clear(t.freed)
	}
	t.freed[ptr] = struct{}{}
	t.reserved -= live.size
	c := &p.c
	c.frees++
	c.allocated -= live.counted
	c.active -= live.counted
	c.allocations--
	_ = t.freeStuck(p) // counted as reserved until it succeeds
	return nil
}

// freeStuck frees the stuck allocations it can and returns the first
// error.
func (t *passthrough) freeStuck(p *Pool) error {
	var first error
	for _, ptr := range slices.Sorted(maps.Keys(t.stuck)) {
		if err := p.dev.MemFree(ptr); err != nil {
			first = cmp.Or(first, err)
			continue
		}
		t.reserved -= t.stuck[ptr]
		delete(t.stuck, ptr)
	}
	return first
}

func (t *passthrough) close(p *Pool) error {
	errs := []error{t.freeStuck(p)}
	for _, ptr := range slices.Sorted(maps.Keys(t.live)) {
		if err := p.dev.MemFree(ptr); err != nil {
			errs = append(errs, err)
		}
		t.reserved -= t.live[ptr].size
		delete(t.live, ptr)
	}
	return errors.Join(errs...)
}
