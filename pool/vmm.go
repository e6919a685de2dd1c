package pool

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/tlsf"
)

// vmmHeap is one virtual address range [base, base+vsize) reserved with
// cuMemAddressReserve. The index sees [base, end) as one region that grows
// at its end; every page (one allocation granule, 2 MiB on an H200) below
// end is mapped to its own physical allocation (cuMemCreate + cuMemMap) or
// is a hole: a page released because it lay wholly under free blocks,
// mapped again when a block that covers it is allocated. Pages at or above
// end are never mapped.
//
// One physical allocation per page costs a cuMemCreate and a cuMemMap per
// granule when growing (access is granted once per contiguous run with
// cuMemSetAccess), and buys release at the finest granularity the driver
// allows: cuMemUnmap must cover whole mappings.
type vmmHeap struct {
	dev     *counted
	x       *tlsf.Index
	gran    uint64 // bytes per page
	base    uint64
	vsize   uint64
	end     uint64             // top of the index's region; base when none yet
	handles []device.MemHandle // by page; valid where mapped
	mapped  []bool             // by page
	nMapped uint64             // pages mapped
	holes   uint64             // unmapped pages below end
	// orphans are physical allocations unmapped or never mapped whose
	// cuMemRelease failed: still the pool's, counted as reserved, and
	// released again at the next release or Close.
	orphans []device.MemHandle
	// stray pages are mapped, without access, by a mapping that failed
	// and could not be undone (cuMemUnmap failed too). They count as
	// mapped (reserved) and, below end, as holes; they are unmapped before
	// the heap next maps, releases or closes.
	stray  []bool // by page
	nStray uint64
	// spares are physical allocations unmapped by recycle and kept for the
	// next mapping: moving a page costs cuMemUnmap and cuMemMap instead of
	// also cuMemRelease and cuMemCreate. They count as reserved.
	spares []device.MemHandle
	// note, when set (history on), is told of every run of pages mapped
	// or unmapped: address and bytes (history.go).
	note func(addr, size uint64, mapped bool)
	// peers are other devices granted access to every mapping (peers.go).
	peers []int
}

func newVMMHeap(dev *counted, x *tlsf.Index, vsize, total uint64) (*vmmHeap, error) {
	gran, err := dev.AllocationGranularity()
	if err != nil {
		return nil, err
	}
	if vsize == 0 {
		// Twice the device: address space is cheap (the GPU's is 2^49
		// bytes), and fragmentation of it must not end a pool that still
		// has physical memory to map.
		vsize = 2 * total
	}
	vsize = roundUp(vsize, gran)
	base, err := dev.AddressReserve(vsize, gran)
	if err != nil {
		return nil, fmt.Errorf("pool: reserving %d bytes of address space: %w", vsize, err)
	}
	pages := vsize / gran
	return &vmmHeap{
		dev: dev, x: x, gran: gran, base: uint64(base), vsize: vsize, end: uint64(base),
		handles: make([]device.MemHandle, pages),
		mapped:  make([]bool, pages),
		stray:   make([]bool, pages),
	}, nil
}

func (h *vmmHeap) reserved() uint64 {
	return (h.nMapped + uint64(len(h.orphans)+len(h.spares))) * h.gran
}
func (h *vmmHeap) granularity() uint64 { return h.gran }
func (h *vmmHeap) spare() uint64       { return uint64(len(h.spares)) * h.gran }

func (h *vmmHeap) need(size uint64) uint64 {
	var tail uint64
	if h.end > h.base {
		if last, err := h.x.Last(h.base); err == nil && last.Free {
			tail = last.Size
		}
	}
	if tail >= size {
		return 0
	}
	return roundUp(size-tail, h.gran)
}

// grow maps up to want bytes of new pages at end (at least need), grants
// access, and extends the index's region.
func (h *vmmHeap) grow(need, want uint64) error {
	room := h.base + h.vsize - h.end
	if need > h.vsize {
		return fmt.Errorf("%w: %d bytes exceed the virtual range of %d bytes", ErrTooLarge, need, h.vsize)
	}
	if need > room {
		return errNoRoom // the range is used up to its end
	}
	want = min(max(want, need), room)
	if err := h.unmapStrays(); err != nil {
		return err
	}
	first := (h.end - h.base) / h.gran
	n, err := h.mapRun(first, want/h.gran, need/h.gran)
	if err != nil {
		return err
	}
	added := n * h.gran
	if h.end == h.base {
		err = h.x.AddRegion(h.base, added)
	} else {
		err = h.x.GrowRegion(h.base, added)
	}
	if err != nil { // not reached: the range is ours alone
		h.unmapRun(first, n)
		return err
	}
	h.end += added
	return nil
}

// mapRun maps up to n pages from page first (at least min of them, else
// none): a physical allocation (a spare, else a new one) and a mapping per
// page, then access for the whole run. It returns how many it mapped.
func (h *vmmHeap) mapRun(first, n, least uint64) (uint64, error) {
	var done uint64
	var err error
	for ; done < n; done++ {
		p := first + done
		var mh device.MemHandle
		spare := len(h.spares) > 0
		if spare {
			mh = h.spares[len(h.spares)-1]
			h.spares = h.spares[:len(h.spares)-1]
		} else if mh, err = h.dev.MemCreate(h.gran); err != nil {
			break
		}
		if err = h.dev.MemMap(uintptr(h.pageAddr(p)), h.gran, mh); err != nil {
			if spare {
				h.spares = append(h.spares, mh)
			} else {
				h.releaseHandle(mh)
			}
			break
		}
		h.handles[p] = mh
		h.mapped[p] = true
		h.nMapped++
	}
	if h.note != nil && done > 0 {
		h.note(h.pageAddr(first), done*h.gran, true)
	}
	if err != nil && done < least {
		h.unmapOrStray(first, done)
		return 0, err
	}
	if done == 0 {
		return 0, err
	}
	if aerr := h.setAccess(uintptr(h.pageAddr(first)), done*h.gran); aerr != nil {
		h.unmapOrStray(first, done)
		return 0, aerr
	}
	return done, nil
}

// unmapOrStray undoes a mapping of pages [first, first+n) that has no
// access yet; if the driver refuses, the pages stay mapped as strays.
func (h *vmmHeap) unmapOrStray(first, n uint64) {
	if h.unmapRun(first, n) == nil {
		return
	}
	for p := first; p < first+n; p++ {
		h.stray[p] = true
	}
	h.nStray += n
}

// runs returns the maximal runs of pages in [first, end) whose flag is
// want, as (first page, count) pairs in address order.
func runs(flags []bool, first, end uint64, want bool) [][2]uint64 {
	var out [][2]uint64
	for p := first; p < end; {
		if flags[p] != want {
			p++
			continue
		}
		q := p
		for q < end && flags[q] == want {
			q++
		}
		out = append(out, [2]uint64{p, q - p})
		p = q
	}
	return out
}

// unmapStrays unmaps the stray pages. Those below end stay holes.
func (h *vmmHeap) unmapStrays() error {
	if h.nStray == 0 {
		return nil
	}
	for _, r := range runs(h.stray, 0, uint64(len(h.stray)), true) {
		if err := h.unmapRun(r[0], r[1]); err != nil {
			return err
		}
		for p := r[0]; p < r[0]+r[1]; p++ {
			h.stray[p] = false
		}
		h.nStray -= r[1]
	}
	return nil
}

// unmapRun unmaps pages [first, first+n), all mapped, and releases their
// physical memory. It fails only when the unmap fails, and then changes
// nothing; a page whose release fails is unmapped all the same and its
// handle kept as an orphan.
func (h *vmmHeap) unmapRun(first, n uint64) error {
	return h.unmap(first, n, false)
}

// unmap unmaps pages [first, first+n), all mapped, and releases their
// physical memory, or keeps it as spares.
func (h *vmmHeap) unmap(first, n uint64, keep bool) error {
	if n == 0 {
		return nil
	}
	err := h.dev.MemUnmap(uintptr(h.pageAddr(first)), n*h.gran)
	if err != nil {
		return err // still mapped: keep accounting them
	}
	for p := first; p < first+n; p++ {
		if keep {
			h.spares = append(h.spares, h.handles[p])
		} else {
			h.releaseHandle(h.handles[p])
		}
		h.handles[p] = 0
		h.mapped[p] = false
		h.nMapped--
	}
	if h.note != nil {
		h.note(h.pageAddr(first), n*h.gran, false)
	}
	return nil
}

// releaseHandle releases a physical allocation mapped nowhere, keeping it
// as an orphan if the driver refuses.
func (h *vmmHeap) releaseHandle(mh device.MemHandle) {
	if err := h.dev.MemRelease(mh); err != nil {
		h.orphans = append(h.orphans, mh)
	}
}

// releaseOrphans releases the orphans again and returns the bytes
// released and the errors of those that stay.
func (h *vmmHeap) releaseOrphans() (uint64, error) {
	var errs []error
	kept := h.orphans[:0]
	for _, mh := range h.orphans {
		if err := h.dev.MemRelease(mh); err != nil {
			errs = append(errs, err)
			kept = append(kept, mh)
		}
	}
	released := uint64(len(h.orphans)-len(kept)) * h.gran
	h.orphans = kept
	return released, errors.Join(errs...)
}

func (h *vmmHeap) pageAddr(p uint64) uint64 { return h.base + p*h.gran }

// pages returns the pages that block b touches.
func (h *vmmHeap) pages(b tlsf.Block) (first, end uint64) {
	return (b.Addr - h.base) / h.gran, (b.Addr + b.Size - h.base + h.gran - 1) / h.gran
}

func (h *vmmHeap) unbackedTail() uint64 {
	if h.holes == 0 || h.end == h.base {
		return 0
	}
	if last, err := h.x.Last(h.base); err == nil && last.Free {
		return h.unbacked(last)
	}
	return 0
}

func (h *vmmHeap) unbacked(b tlsf.Block) uint64 {
	if h.holes == 0 {
		return 0
	}
	var n uint64
	first, end := h.pages(b)
	for p := first; p < end; p++ {
		if !h.mapped[p] || h.stray[p] {
			n++
		}
	}
	return n * h.gran
}

// back maps the holes under block b, run by run.
func (h *vmmHeap) back(b tlsf.Block) error {
	if h.holes == 0 {
		return nil
	}
	if err := h.unmapStrays(); err != nil {
		return err
	}
	first, end := h.pages(b)
	var mappedNow [][2]uint64
	for _, hole := range runs(h.mapped, first, end, false) {
		p, q := hole[0], hole[0]+hole[1]
		if _, err := h.mapRun(p, q-p, q-p); err != nil {
			for _, r := range mappedNow {
				if h.unmapRun(r[0], r[1]) == nil {
					h.holes += r[1]
				} // else the run stays mapped: backed, no longer holes
			}
			return err
		}
		h.holes -= q - p
		mappedNow = append(mappedNow, hole)
	}
	return nil
}

// release unmaps mapped pages that lie wholly inside free blocks, those of
// the largest free blocks first (they are the least likely to be cut up
// and reused soon), until limit bytes are released. With keep, it keeps
// their physical memory as spares for the next mapping instead, and
// reports the bytes so moved.
func (h *vmmHeap) release(limit uint64, keep bool) (uint64, error) {
	if err := h.unmapStrays(); err != nil {
		return 0, err
	}
	var released uint64
	if !keep {
		var errs []error
		for len(h.spares) > 0 && released < limit {
			mh := h.spares[len(h.spares)-1]
			h.spares = h.spares[:len(h.spares)-1]
			if err := h.dev.MemRelease(mh); err != nil {
				h.orphans = append(h.orphans, mh)
				errs = append(errs, err)
				continue
			}
			released += h.gran
		}
		if err := errors.Join(errs...); err != nil {
			return released, err
		}
	}
	type run struct{ first, n, blockSize uint64 }
	var free []run
	var top uint64 = ^uint64(0)
	if keep && h.end > h.base {
		// Moving pages out of the free top of the heap would be undone at
		// once: a growth is about to cover it.
		if last, err := h.x.Last(h.base); err == nil && last.Free {
			top = last.Addr
		}
	}
	h.x.Walk(func(b tlsf.Block) bool {
		if !b.Free || b.Addr == top {
			return true
		}
		first := (b.Addr - h.base + h.gran - 1) / h.gran
		end := (b.Addr + b.Size - h.base) / h.gran
		for _, r := range runs(h.mapped, first, end, true) {
			free = append(free, run{r[0], r[1], b.Size})
		}
		return true
	})
	slices.SortStableFunc(free, func(a, b run) int { return cmp.Compare(b.blockSize, a.blockSize) })
	if !keep {
		n, err := h.releaseOrphans()
		released += n
		if err != nil {
			return released, err
		}
	}
	for _, r := range free {
		if released >= limit {
			break
		}
		// Whole pages covering what is left to release; limit may be
		// math.MaxUint64 (release all), so do not round up past it.
		n := r.n
		if left := limit - released; left < n*h.gran {
			n = (left + h.gran - 1) / h.gran
		}
		// Release the top of the run: the bottom may be cut off first.
		orphans := len(h.orphans)
		if err := h.unmap(r.first+r.n-n, n, keep); err != nil {
			return released, err
		}
		h.holes += n
		released += (n - uint64(len(h.orphans)-orphans)) * h.gran
	}
	return released, nil
}

func (h *vmmHeap) close() error {
	var errs []error
	if err := h.unmapStrays(); err != nil {
		errs = append(errs, err)
	}
	// Strays may lie above end: look at every page.
	for _, r := range runs(h.mapped, 0, uint64(len(h.mapped)), true) {
		if err := h.unmapRun(r[0], r[1]); err != nil {
			errs = append(errs, err)
		}
	}
	for _, mh := range h.spares {
		h.releaseHandle(mh)
	}
	h.spares = nil
	if _, err := h.releaseOrphans(); err != nil {
		errs = append(errs, err)
	}
	if err := h.dev.AddressFree(uintptr(h.base), h.vsize); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// check verifies the page accounting: mapped pages counted, holes below
// end counted, nothing mapped at or above end, and every allocated block
// of the index backed.
func (h *vmmHeap) check() error {
	var mapped, holes, strays uint64
	top := (h.end - h.base) / h.gran
	for p, m := range h.mapped {
		if h.stray[p] {
			strays++
			if !m {
				return fmt.Errorf("pool: stray page %d not mapped", p)
			}
		}
		if m {
			mapped++
			if uint64(p) >= top && !h.stray[p] {
				return fmt.Errorf("pool: page %d mapped above the heap's end", p)
			}
		}
		if uint64(p) < top && (!m || h.stray[p]) {
			holes++
		}
	}
	if mapped != h.nMapped || holes != h.holes || strays != h.nStray {
		return fmt.Errorf("pool: %d pages mapped, %d holes and %d strays by walk, %d, %d and %d counted",
			mapped, holes, strays, h.nMapped, h.holes, h.nStray)
	}
	var bad error
	h.x.Walk(func(b tlsf.Block) bool {
		if !b.Free {
			first, end := h.pages(b)
			for p := first; p < end; p++ {
				if !h.mapped[p] || h.stray[p] {
					bad = fmt.Errorf("pool: allocated block %#x lies on unmapped or stray page %d", b.Addr, p)
					return false
				}
			}
		}
		return true
	})
	return bad
}
