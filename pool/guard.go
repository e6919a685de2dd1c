package pool

// Guard mode: a red zone after every block (Options.Guard).
//
// With Guard = g bytes, a request of n bytes takes a block of n + g bytes
// from the usual path (per-P cache or index, so the allocation pattern is
// the pool's own); bytes [n, n+g) of it are the red zone, filled with
// guardPattern on the allocation's stream (cuMemsetD8Async) before the
// pointer is returned. A free reads the red zone back (after
// synchronizing the freeing stream; cuMemcpyDtoH) and, if any byte
// changed, reports ErrCorrupted naming the block, its size and the first
// changed byte, and does not free it. Check reads every live block's red
// zone.
//
// What it catches: a kernel or copy that writes past the end of its
// block, up to g bytes past it, by the next free or Check. What it does
// not: reads past the end, writes further than g bytes, writes before the
// start, use after free. compute-sanitizer (device/nvtx) covers those;
// guard mode runs without it, on any GPU and on the simulated device,
// whose shadow memory keeps what was written (sim.Config.Shadow), so
// tests exercise it.
//
// Cost: a memset per allocation and a device-to-host copy plus, off the
// default stream, a stream synchronization per free. The memset is queued
// and the copy made under the pool's lock (so that a Close cannot unmap
// the block meanwhile): other goroutines' pool calls wait for the copy,
// which waits for the legacy default stream. It is a debugging mode. Without it the hot paths pay one predictable nil test (debug.go).

import (
	"fmt"

	"github.com/gpumem/tlsf/device"
)

// guardPattern is the byte a red zone holds: 0xFD, the "no man's land"
// fill of common debug heaps, chosen because kernels rarely write it (not
// 0, not 0xFF, not a small integer, not ASCII).
const guardPattern byte = 0xFD

// MaxGuard is the largest Options.Guard in bytes: 1 MiB, far past any
// plausible off-by-some overrun, and small enough that the red zone of a
// small block does not dominate reserved memory.
const MaxGuard = 1 << 20

// guardFill writes the red zone of a block of size bytes at ptr on stream s.
func (d *debugLayer) guardFill(ptr uintptr, size uint64, s device.Stream) error {
	if err := d.fill.MemsetD8Async(ptr+uintptr(size), guardPattern, d.guard, s); err != nil {
		return fmt.Errorf("pool: filling the red zone of %#x: %w", ptr, err)
	}
	return nil
}

// guardVerify reads the red zone of block b at ptr back and returns an
// ErrCorrupted error naming the first changed byte, nil if none changed,
// or the device's error. The caller has ordered the read after the
// block's last use (the stream synchronized).
func (d *debugLayer) guardVerify(ptr uintptr, b debugBlock) error {
	zone := make([]byte, d.guard)
	if err := d.p.dev.MemcpyDtoH(zone, ptr+uintptr(b.size)); err != nil {
		return fmt.Errorf("pool: reading the red zone of %#x: %w", ptr, err)
	}
	for i, v := range zone {
		if v != guardPattern {
			at := ptr + uintptr(b.size) + uintptr(i)
			return fmt.Errorf("%w: red zone overrun: block %#x of %d bytes: byte %#x (%d past the end) is %#02x, was %#02x",
				ErrCorrupted, ptr, b.size, at, i, v, guardPattern)
		}
	}
	return nil
}

// guardCheck verifies the red zone of every live block: Check's part.
// Streams blocks were allocated on are synchronized first so that their
// fills have landed. Pool lock held.
func (d *debugLayer) guardCheck() error {
	if d.guard == 0 {
		return nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	synced := map[device.Stream]bool{0: true}
	var first error
	var firstPtr uintptr
	n := 0
	for ptr, b := range d.live {
		if b.pitch {
			continue
		}
		if !synced[b.stream] {
			synced[b.stream] = true
			if err := d.p.dev.StreamSynchronize(b.stream); err != nil {
				return fmt.Errorf("pool: synchronizing stream %#x for a red-zone check: %w", uintptr(b.stream), err)
			}
		}
		if err := d.guardVerify(ptr, b); err != nil {
			n++
			// The lowest address first, so that reports are reproducible.
			if first == nil || ptr < firstPtr {
				first, firstPtr = err, ptr
			}
		}
	}
	if n > 1 {
		return fmt.Errorf("%w (and %d more blocks)", first, n-1)
	}
	if first != nil {
		return first
	}
	return nil
}
