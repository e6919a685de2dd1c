package pool

// Showing the pool's memory to compute-sanitizer (NVTX memory API).
//
// A pooled backend's blocks lie inside device memory the pool took in
// large pieces, so a memory checker that knows only the driver's
// allocations sees a write past a block's end, or into a freed block, as
// a valid access. The NVTX memory API (device/nvtx) tells the checker
// what the pool knows: each piece of device memory is a heap (usage: sub-
// allocator; type: virtual address), and each block handed out is a
// region of its heap, of the size the caller asked for. The checker then
// reports any access to a heap outside its live regions.
//
// Where the calls are made:
//   - heap register: when the pool gets a piece from the driver, a chunk
//     (cuMemAlloc) or a VMM pool's virtual range (cuMemAddressReserve),
//     in the counted device wrapper (counting.go);
//   - heap unregister: when it returns that piece (cuMemFree,
//     cuMemAddressFree): the checker forgets the heap's regions with it;
//   - region register and unregister: in the debug layer (debug.go), on
//     every allocation handed out (cache hits included) and every free,
//     before the block can be handed to anyone else.
//
// A passthrough pool makes no calls: the driver shows its allocations
// to the checker itself.
//
// Backends under compute-sanitizer 2025.3.1 (H200, driver 580): the
// chunks backend works: a store one byte past a block is reported ("Invalid
// __global__ write of size 1 bytes ... is 1 bytes after the nearest
// allocation at ... of size 1,000 bytes"), so is a store into a freed
// block, and --leak-check full reports a block never freed ("1000 bytes
// leaked in 1 allocations"). The tool refuses a VMM pool's heap, a
// cuMemAddressReserve range registered when it is reserved ("Warning: Call
// to nvtxMemHeapRegister failed: One or more of the parameters is
// invalid"), and then every region in it. So with a checker attached,
// BackendAuto chooses BackendChunks, and a pool made with BackendVMM
// makes no NVTX calls at all (the tool sees its memory as before: one
// mapped range, accesses inside it unchecked).

import (
	"slices"
	"sync"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/nvtx"
)

// memChecker is what the pool tells a memory checker: nvtx.Client, or a
// recording fake in tests. Handles are the checker's; 0 is none.
type memChecker interface {
	// HeapRegister shows [base, base+size) as a sub-allocator's heap and
	// returns its handle (0 if the checker refused it).
	HeapRegister(base uintptr, size uint64) uintptr
	// HeapUnregister forgets a heap and its regions.
	HeapUnregister(heap uintptr)
	// RegionRegister shows [ptr, ptr+size) of heap as in use.
	RegionRegister(heap, ptr uintptr, size uint64)
	// RegionUnregister forgets the region at ptr.
	RegionUnregister(ptr uintptr)
}

// openChecker returns the process's memory checker, or nil when no tool
// is attached (NVTX_INJECTION64_PATH unset, or the tool refused us). A
// variable so that tests can attach a fake.
var openChecker = func() memChecker {
	if c := nvtx.Default(); c != nil {
		return c
	}
	return nil
}

// openWatch returns a watch over the process's memory checker for the
// memory of dev, or nil.
func openWatch(dev device.Device) *memWatch {
	chk := openChecker()
	if chk == nil {
		return nil
	}
	w := &memWatch{chk: chk, run: func(f func()) { f() }}
	if c, ok := dev.(inContext); ok {
		w.run = func(f func()) { _ = c.InContext(f) }
	}
	return w
}

// inContext is implemented by devices that can run code with their
// context current (cuda.Device): the checker validates heaps against the
// current context, and refuses them without one.
type inContext interface {
	InContext(f func()) error
}

// memWatch tracks the pool's heaps for a memory checker, so that a
// region finds its heap. Its own mutex: heap calls come under the pool's
// lock, region calls from the debug layer without it.
type memWatch struct {
	chk   memChecker
	run   func(func()) // runs a checker call with the device's context current
	mu    sync.Mutex
	heaps []watchedHeap // sorted by base, disjoint
}

type watchedHeap struct {
	base   uintptr
	size   uint64
	handle uintptr
}

// mapped registers a piece of device memory as a heap.
func (w *memWatch) mapped(base uintptr, size uint64) {
	var h uintptr
	w.run(func() { h = w.chk.HeapRegister(base, size) })
	if h == 0 {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	i, _ := slices.BinarySearchFunc(w.heaps, base, func(e watchedHeap, b uintptr) int {
		switch {
		case e.base < b:
			return -1
		case e.base > b:
			return 1
		}
		return 0
	})
	w.heaps = slices.Insert(w.heaps, i, watchedHeap{base, size, h})
}

// unmapped unregisters the heap at base, if any, and returns its size
// (0: none).
func (w *memWatch) unmapped(base uintptr) uint64 {
	w.mu.Lock()
	i := w.find(base)
	if i < 0 || w.heaps[i].base != base {
		w.mu.Unlock()
		return 0
	}
	h, size := w.heaps[i].handle, w.heaps[i].size
	w.heaps = slices.Delete(w.heaps, i, i+1)
	w.mu.Unlock()
	w.run(func() { w.chk.HeapUnregister(h) })
	return size
}

// find returns the index of the heap holding ptr, or -1. Lock held.
func (w *memWatch) find(ptr uintptr) int {
	i, _ := slices.BinarySearchFunc(w.heaps, ptr, func(e watchedHeap, p uintptr) int {
		switch {
		case e.base+uintptr(e.size) <= p:
			return -1
		case e.base > p:
			return 1
		}
		return 0
	})
	if i < len(w.heaps) && w.heaps[i].base <= ptr && ptr-w.heaps[i].base < uintptr(w.heaps[i].size) {
		return i
	}
	return -1
}

// region registers a block of size bytes at ptr in its heap.
func (w *memWatch) region(ptr uintptr, size uint64) {
	w.mu.Lock()
	i := w.find(ptr)
	var h uintptr
	if i >= 0 {
		h = w.heaps[i].handle
	}
	w.mu.Unlock()
	if h != 0 {
		w.run(func() { w.chk.RegionRegister(h, ptr, size) })
	}
}

// unregion unregisters the block at ptr.
func (w *memWatch) unregion(ptr uintptr) {
	w.run(func() { w.chk.RegionUnregister(ptr) })
}
