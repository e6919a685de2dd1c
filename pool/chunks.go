package pool

import (
	"cmp"
	"errors"
	"maps"
	"slices"

	"github.com/gpumem/tlsf/tlsf"
)

// chunkHeap takes memory from cuMemAlloc in chunks, each a region of the
// index (blocks never merge across chunks), and frees chunks that become
// wholly free. Chunk sizes are multiples of chunkGranularity.
type chunkHeap struct {
	dev    *counted
	x      *tlsf.Index
	chunks map[uint64]uint64 // base → size in bytes
	total  uint64
	// note, when set (history on), is told of every chunk allocated or
	// freed: address and bytes (history.go).
	note func(addr, size uint64, allocated bool)
}

// chunkGranularity is 2 MiB: the driver backs cuMemAlloc with 2 MiB pages,
// so a smaller chunk would waste the rest of its page.
const chunkGranularity = 2 << 20

func newChunkHeap(dev *counted, x *tlsf.Index) *chunkHeap {
	return &chunkHeap{dev: dev, x: x, chunks: map[uint64]uint64{}}
}

func (h *chunkHeap) reserved() uint64    { return h.total }
func (h *chunkHeap) spare() uint64       { return 0 }
func (h *chunkHeap) granularity() uint64 { return chunkGranularity }

// need is the whole block: a new chunk is a new region.
func (h *chunkHeap) need(size uint64) uint64 {
	return roundUp(size, chunkGranularity)
}

// grow allocates one chunk of want bytes, or of need bytes if the driver
// cannot give want.
func (h *chunkHeap) grow(need, want uint64) error {
	size := max(want, need)
	ptr, err := h.dev.MemAlloc(size)
	if err != nil && size > need {
		size = need
		ptr, err = h.dev.MemAlloc(size)
	}
	if err != nil {
		return err
	}
	if err := h.x.AddRegion(uint64(ptr), size); err != nil {
		_ = h.dev.MemFree(ptr)
		return err
	}
	h.chunks[uint64(ptr)] = size
	h.total += size
	if h.note != nil {
		h.note(uint64(ptr), size, true)
	}
	return nil
}

func (h *chunkHeap) unbacked(tlsf.Block) uint64 { return 0 }
func (h *chunkHeap) unbackedTail() uint64       { return 0 }
func (h *chunkHeap) back(tlsf.Block) error      { return nil }

// release frees chunks with no allocated block, largest first, until
// limit bytes are released.
func (h *chunkHeap) release(limit uint64, _ bool) (uint64, error) {
	var released uint64
	bases := slices.Sorted(maps.Keys(h.chunks))
	slices.SortStableFunc(bases, func(a, b uint64) int { return cmp.Compare(h.chunks[b], h.chunks[a]) })
	for _, base := range bases {
		if released >= limit {
			break
		}
		size := h.chunks[base]
		if err := h.x.RemoveRegion(base); err != nil {
			continue // busy
		}
		if err := h.dev.MemFree(uintptr(base)); err != nil {
			_ = h.x.AddRegion(base, size) // still ours: keep serving it
			return released, err
		}
		delete(h.chunks, base)
		h.total -= size
		released += size
		if h.note != nil {
			h.note(base, size, false)
		}
	}
	return released, nil
}

func (h *chunkHeap) close() error {
	var errs []error
	for base, size := range h.chunks {
		if err := h.dev.MemFree(uintptr(base)); err != nil {
			errs = append(errs, err)
		}
		delete(h.chunks, base)
		h.total -= size
	}
	return errors.Join(errs...)
}
