package pool

import "github.com/gpumem/tlsf/tlsf"

// heap is where a pooled Pool's memory comes from: the VMM heap (one
// virtual range, physical pages mapped on demand) or chunks (cuMemAlloc).
// It adds address space to the pool's index and backs it with device
// memory. The pool calls it with its lock held.
type heap interface {
	// need returns by how many bytes the heap must grow for a block of
	// size bytes (a size-class boundary) to fit.
	need(size uint64) uint64
	// grow adds at least need bytes, and up to want bytes, of backed space
	// to the index. On error nothing changed.
	grow(need, want uint64) error
	// unbackedTail returns the bytes of the free block at the top of the
	// heap that are not backed: a block grown into takes them too.
	unbackedTail() uint64
	// unbacked returns how many bytes of block b are not backed by device
	// memory (VMM pages released earlier); back backs them. On error
	// nothing changed.
	unbacked(b tlsf.Block) uint64
	back(b tlsf.Block) error
	// release returns device memory that lies wholly under free blocks,
	// about limit bytes of it (at least limit where that much is free;
	// math.MaxUint64: all), and reports how many bytes it returned. It
	// prefers memory under the largest free blocks. With keep, a VMM heap
	// unmaps the memory but keeps it for its next mapping (reserved does
	// not change; the chunk heap releases regardless). The caller has made
	// sure no GPU work still uses freed blocks. On error, what was released
	// so far stays released and accounted.
	release(limit uint64, keep bool) (uint64, error)
	// reserved is the device memory the heap holds, in bytes.
	reserved() uint64
	// spare is the part of reserved held but not mapped (a VMM heap's
	// spares): the next mappings take it before asking the driver.
	spare() uint64
	// granularity is the unit in which the heap takes memory, in bytes.
	granularity() uint64
	// close returns everything to the driver.
	close() error
}

func roundUp(n, to uint64) uint64 { return (n + to - 1) / to * to }
