package tlsf

import (
	"fmt"
	"math/bits"

	"github.com/gpumem/tlsf/internal/addrmap"
)

// MaxSize is the largest block, region or request in bytes: 2^48 (256 TiB).
// A 141 GB GPU needs 2^38; the headroom covers the 49-bit virtual address
// space of current GPUs. Requests above it fail with ErrTooLarge.
const MaxSize = 1 << 48

// Defaults of Config.
const (
	// DefaultGranularity is 256 bytes, the alignment cudaMalloc guarantees.
	DefaultGranularity = 256
	// DefaultSLLog2 gives 32 second-level lists per power of two: at most
	// 1/32 (3.1%) internal fragmentation from good-fit rounding.
	DefaultSLLog2 = 5
	// MaxSLLog2: one uint64 SL bitmap per first-level index holds at most
	// 64 lists.
	MaxSLLog2 = 6
)

// Config sets an Index's size classes. The zero value gives the defaults.
type Config struct {
	// Granularity is the minimum block size and the alignment of every
	// block, in bytes: a power of two from 1 to 2^40 (default 256).
	Granularity uint64
	// SLLog2 is log2 of the number of second-level lists per power of
	// two, 1 to MaxSLLog2 (default 5: 32 lists). More lists mean less
	// rounding waste (below 1/2^SLLog2 of a block) and more empty lists.
	SLLog2 uint
	// Wilderness keeps the top block of each region, while it is free,
	// out of the size-class lists, in a list of its own that a search
	// takes a block from only when no size-class list at or above the
	// request's holds one: the wilderness preservation heuristic (Korn
	// and Vo, "In search of a better malloc", USENIX 1985; Wilson et al.,
	// "Dynamic storage allocation: a survey and critical review", 1995,
	// §3.5; dlmalloc's top chunk). For a region that grows at its end
	// (GrowRegion: a pool's virtual heap), the free top then stays whole,
	// and a request that finds no other block takes it together with the
	// growth, instead of a small request splitting it and the next large
	// one finding neither room there nor a top to grow from. Searching the
	// wilderness list costs O(regions) where it is reached (the first of
	// its blocks that fits); one region: O(1). Default false: every free
	// block in the list of its size. Index.SetWilderness changes it later.
	Wilderness bool
}

// nilRec marks a missing link between block records; allocMark, in
// prevFree, marks an allocated block.
const (
	nilRec    = ^uint32(0)
	allocMark = nilRec - 1
)

// block is the out-of-band record of one block: 32 bytes, two to a cache
// line. Links are indexes into Index.blocks, not pointers, so the garbage
// collector scans none of them. A block's region is found from its address
// when needed (rarely: only the top block of a region needs it).
type block struct {
	addr     uint64
	size     uint64
	prevPhys uint32 // the block just below in the same region, or nilRec
	nextPhys uint32 // the block just above in the same region, or nilRec
	prevFree uint32 // free-list neighbours while free; allocMark while allocated
	nextFree uint32 // while allocated, the block's tag (Tag)
}

func (bk *block) free() bool { return bk.prevFree != allocMark }

// Block describes one block: Size bytes at Addr, free or allocated.
//
// ID names the block's record while the block is allocated: a small
// integer below MaxID(), unique among allocated blocks and reused after
// Free, so callers can keep per-allocation data in a slice indexed by it
// instead of a map. It means nothing for free blocks.
type Block struct {
	Addr uint64
	Size uint64
	ID   uint32
	Free bool
}

// Index is a TLSF index over regions of an abstract address space.
// It is not safe for concurrent use.
type Index struct {
	mapping
	gran  uint64
	numFL uint
	wild  bool // Config.Wilderness

	flBitmap uint64 // bit fl set: some list (fl, ·) is non-empty
	// The lists are laid out for the largest configuration, 64 first-level
	// by 64 second-level indexes (16 KiB of heads), whatever SLLog2 is:
	// with list(fl, sl) = fl<<6 | sl and indexes masked to the array sizes,
	// the compiler proves every access in bounds and checks none.
	slBitmap [64]uint64      // [fl] bit sl set: list (fl, sl) is non-empty
	heads    [64 * 64]uint32 // [list(fl, sl)]: first free block of the list

	blocks []block     // every record, live or spare
	spare  []uint32    // recycled record indexes
	live   addrmap.Map // allocated block start → record
	reg    regionSet   // regions by base address

	allocated   uint64 // bytes in allocated blocks
	total       uint64 // bytes in all regions
	allocBlocks int
	freeBlocksN int
}

// New returns an empty Index (no regions) with the given size classes.
// It fails with ErrBadConfig when a field is out of range.
func New(cfg Config) (*Index, error) {
	if cfg.Granularity == 0 {
		cfg.Granularity = DefaultGranularity
	}
	if cfg.SLLog2 == 0 {
		cfg.SLLog2 = DefaultSLLog2
	}
	if bits.OnesCount64(cfg.Granularity) != 1 || cfg.Granularity > 1<<40 {
		return nil, fmt.Errorf("%w: granularity %d is not a power of two from 1 to 2^40", ErrBadConfig, cfg.Granularity)
	}
	if cfg.SLLog2 > MaxSLLog2 {
		return nil, fmt.Errorf("%w: SLLog2 %d above %d", ErrBadConfig, cfg.SLLog2, MaxSLLog2)
	}
	g := uint(bits.TrailingZeros64(cfg.Granularity))
	if g+cfg.SLLog2 > 47 {
		return nil, fmt.Errorf("%w: granularity × second-level lists exceeds MaxSize", ErrBadConfig)
	}
	x := &Index{
		mapping: mapping{granLog2: g, slLog2: cfg.SLLog2, smallSize: 1 << (g + cfg.SLLog2), granMask: cfg.Granularity - 1},
		gran:    cfg.Granularity,
		wild:    cfg.Wilderness,
	}
	fl, _ := x.insert(MaxSize)
	x.numFL = fl + 1
	for i := range x.heads {
		x.heads[i] = nilRec
	}
	x.live.Init(g)
	return x, nil
}

// Granularity returns the minimum block size and alignment in bytes.
func (x *Index) Granularity() uint64 { return x.gran }

// SecondLevelLists returns the number of second-level lists per power of
// two.
func (x *Index) SecondLevelLists() int { return 1 << x.slLog2 }

// RoundUp returns the block size an allocation of size bytes receives:
// size rounded up to the lower bound of its size class (mapping search).
// It fails like Alloc for a zero size or one above MaxSize.
func (x *Index) RoundUp(size uint64) (uint64, error) {
	if err := x.checkSize(size); err != nil {
		return 0, err
	}
	return x.roundUp(size), nil
}

func (x *Index) checkSize(size uint64) error {
	if size == 0 {
		return ErrInvalidSize
	}
	if size > MaxSize {
		return fmt.Errorf("%w: %d bytes, the maximum is %d", ErrTooLarge, size, uint64(MaxSize))
	}
	return nil
}

// Alloc allocates a block of at least size bytes, aligned to the
// granularity, in O(1) (TLSF §4: mapping search, find suitable block,
// split). The block's Size is size rounded up to its size class (see
// RoundUp), and a later Alloc of the same size after freeing it always
// succeeds.
//
// Errors: ErrInvalidSize (size 0), ErrTooLarge (size > MaxSize),
// ErrNoSpace (no free block large enough).
func (x *Index) Alloc(size uint64) (Block, error) {
	if size-1 >= MaxSize { // size == 0 wraps around
		return Block{}, x.checkSize(size)
	}
	r := x.roundUp(size)
	b, i := x.findSuitable(r, r)
	if b == nilRec {
		return Block{}, ErrNoSpace
	}
	// popHead, splitTail and markAllocated, by hand: this is the hot path.
	bk := &x.blocks[b]
	next := bk.nextFree
	x.heads[i&4095] = next
	if next != nilRec {
		x.blocks[next].prevFree = nilRec
	} else {
		x.clearBit(i>>6, i&63)
	}
	if bk.size > r {
		x.link(x.cut(b, r))
		bk = &x.blocks[b] // cut may have moved the records
	}
	bk.prevFree, bk.nextFree = allocMark, 0 // tag 0
	x.freeBlocksN--
	x.allocBlocks++
	x.allocated += bk.size
	x.live.Put(bk.addr, uint64(b))
	return Block{Addr: bk.addr, Size: bk.size, ID: b}, nil
}

// AllocAligned is Alloc with the block's address a multiple of align
// bytes, a power of two. An align at or below the granularity is Alloc.
// Above it, the search asks for align−granularity more bytes so that any
// block found can be cut at an aligned address; the cut-off head stays
// free.
//
// Errors: those of Alloc, and ErrBadAlignment (align 0, not a power of
// two, or above MaxSize).
func (x *Index) AllocAligned(size, align uint64) (Block, error) {
	if align == 0 || align&(align-1) != 0 || align > MaxSize {
		return Block{}, fmt.Errorf("%w: %d", ErrBadAlignment, align)
	}
	if align <= x.gran {
		return x.Alloc(size)
	}
	if err := x.checkSize(size); err != nil {
		return Block{}, err
	}
	r := x.roundUp(size)
	need := r + align - x.gran // ≤ 2^49: no overflow
	if need > MaxSize {
		return Block{}, ErrNoSpace
	}
	b, i := x.findSuitable(x.roundUp(need), need)
	if b == nilRec {
		return Block{}, ErrNoSpace
	}
	x.popHead(b, i)
	if a := (x.blocks[b].addr + align - 1) &^ (align - 1); a != x.blocks[b].addr {
		// Cut the head [addr, a) off and return it to the free lists. Its
		// lower neighbour is allocated (no two free blocks are adjacent),
		// so it needs no merge.
		head := b
		b = x.cut(head, a-x.blocks[head].addr)
		x.link(head)
	}
	x.splitTail(b, r)
	return x.markAllocated(b), nil
}

// Free frees the allocated block starting at addr and merges it with its
// free physical neighbours (TLSF §4: block_merge_prev, block_merge_next),
// in O(1). It returns the block as it was allocated (address, size, ID).
//
// Errors: ErrDoubleFree (addr, a multiple of the granularity, lies in
// free space: freed already), ErrUnknownAddress (outside every region,
// not a multiple of the granularity, or inside an allocated block but not
// its start). Finding which of the two applies walks the region once;
// correct frees never do.
func (x *Index) Free(addr uint64) (Block, error) {
	r, ok := x.live.Take(addr)
	if !ok {
		return Block{}, x.classifyBadAddress(addr)
	}
	return x.freeRecord(uint32(r), addr), nil
}

// Detach removes the allocated block starting at addr from the address
// table and returns it, still allocated: the first half of Free, for a
// caller that must look at the block (its ID) before deciding to free it
// with FreeDetached, or to put it back with Attach. Until then the index
// is not consistent (Check fails, Lookup and Free do not find the block);
// the caller does one or the other before any other call. One probe of
// the address table, as Free; Lookup followed by Free makes two.
//
// Errors: as Free.
func (x *Index) Detach(addr uint64) (Block, error) {
	r, ok := x.live.Take(addr)
	if !ok {
		return Block{}, x.classifyBadAddress(addr)
	}
	return Block{Addr: addr, Size: x.blocks[uint32(r)].size, ID: uint32(r)}, nil
}

// Attach puts block b, detached by Detach, back in the address table: it
// undoes Detach. b must be the Block that Detach returned and not yet
// attached or freed: Attach checks nothing (it is on the pool's free path),
// and any other block corrupts the index (Check then fails) or panics.
func (x *Index) Attach(b Block) { x.live.Put(b.Addr, uint64(b.ID)) }

// FreeDetached frees block b, detached by Detach, and merges it with its
// free neighbours, as Free does, in O(1). As for Attach, b must be the
// Block Detach returned, not yet attached or freed; nothing is checked.
func (x *Index) FreeDetached(b Block) { x.freeRecord(b.ID, b.Addr) }

// freeRecord frees allocated record b at addr, already out of the address
// table, and merges it (block_merge_prev, block_merge_next).
func (x *Index) freeRecord(b uint32, addr uint64) Block {
	bk := &x.blocks[b] // no record is added below: the pointers stay valid
	freed := Block{Addr: addr, Size: bk.size, ID: b}
	x.allocated -= bk.size
	x.allocBlocks--
	x.freeBlocksN++
	bk.prevFree = nilRec // free, not yet listed

	if p := bk.prevPhys; p != nilRec { // block_merge_prev
		if pk := &x.blocks[p]; pk.free() {
			x.unlink(p)
			x.absorb(p, pk, b, bk)
			b, bk = p, pk
		}
	}
	if n := bk.nextPhys; n != nilRec { // block_merge_next
		if nk := &x.blocks[n]; nk.free() {
			x.unlink(n)
			x.absorb(b, bk, n, nk)
		}
	}
	// link, by hand: this is the hot path.
	fl, sl := x.listFor(bk)
	i := listIndex(fl, sl)
	head := x.heads[i]
	bk.prevFree, bk.nextFree = nilRec, head
	if head != nilRec {
		x.blocks[head].prevFree = b
	}
	x.heads[i] = b
	x.slBitmap[fl&63] |= 1 << (sl & 63)
	x.flBitmap |= 1 << (fl & 63)
	return freed
}

// Lookup returns the allocated block that starts at addr.
// Errors: ErrDoubleFree or ErrUnknownAddress, as for Free.
func (x *Index) Lookup(addr uint64) (Block, error) {
	b, ok := x.live.Get(addr)
	if !ok {
		return Block{}, x.classifyBadAddress(addr)
	}
	return x.public(uint32(b)), nil
}

// Tag returns the tag of the allocated block whose ID is id: 32 bits
// its caller keeps with the block (SetTag), 0 from its allocation on,
// and 0 for an ID that names no allocated block. The tag lives in the
// block's record, in a link only free blocks use and on the cache line
// that the block's allocation and free touch anyway, so that per-block
// state costs no other memory access (package pool's state of each block
// in a slice of its own took 0.4–2.9% more instructions and 5–15% more L1
// data misses on its warm replays). In O(1).
func (x *Index) Tag(id uint32) uint32 {
	if int(id) >= len(x.blocks) || x.blocks[id].prevFree != allocMark {
		return 0
	}
	return x.blocks[id].nextFree
}

// SetTag sets the tag of the allocated block whose ID is id (Tag); for
// an ID that names no allocated block it does nothing and reports false.
// In O(1).
func (x *Index) SetTag(id, tag uint32) bool {
	if int(id) >= len(x.blocks) || x.blocks[id].prevFree != allocMark {
		return false
	}
	x.blocks[id].nextFree = tag
	return true
}

// MaxID bounds the IDs of allocated blocks: every ID is below it. It
// grows as the index holds more blocks.
func (x *Index) MaxID() uint32 { return uint32(len(x.blocks)) }

func (x *Index) public(b uint32) Block {
	bk := &x.blocks[b]
	return Block{Addr: bk.addr, Size: bk.size, ID: b, Free: bk.free()}
}

// findSuitable returns the first block of the smallest non-empty list
// whose class lower bound is at least size (a class boundary), with that
// list's index listIndex(fl, sl), or nilRec (TLSF §3.3: two find-first-set
// operations). Where that list is the wilderness list, whose blocks may
// be of any size, the block is the first of it with at least need bytes,
// moved to its head, or nilRec.
func (x *Index) findSuitable(size, need uint64) (b uint32, list uint) {
	fl, sl := x.insert(size)
	slMap := x.slBitmap[fl&63] & (^uint64(0) << (sl & 63))
	if slMap == 0 {
		// fl+1 ≤ numFL ≤ 63 here: numFL is at most 49.
		flMap := x.flBitmap & (^uint64(0) << ((fl + 1) & 63))
		if flMap == 0 {
			return nilRec, 0
		}
		fl = uint(bits.TrailingZeros64(flMap))
		if fl == wildFL {
			return x.fitWild(need), wildList
		}
		slMap = x.slBitmap[fl&63]
	}
	list = listIndex(fl, uint(bits.TrailingZeros64(slMap)))
	return x.heads[list], list
}

// markAllocated turns free record b (out of the lists) into an allocated
// block.
func (x *Index) markAllocated(b uint32) Block {
	bk := &x.blocks[b]
	bk.prevFree, bk.nextFree = allocMark, 0 // tag 0
	x.freeBlocksN--
	x.allocBlocks++
	x.allocated += bk.size
	x.live.Put(bk.addr, uint64(b))
	return Block{Addr: bk.addr, Size: bk.size, ID: b}
}

// splitTail cuts free record b (out of the lists) down to size bytes and
// puts the remainder, if any, in the free lists (block_split).
func (x *Index) splitTail(b uint32, size uint64) {
	if x.blocks[b].size > size {
		x.link(x.cut(b, size))
	}
}

// cut splits record b at offset bytes into b = [addr, addr+offset) and a
// new free record for the rest, which it returns. Neither is in a list.
func (x *Index) cut(b uint32, offset uint64) uint32 {
	n := x.newRecord()
	bk := &x.blocks[b] // after newRecord: the slice may have moved
	x.blocks[n] = block{
		addr:     bk.addr + offset,
		size:     bk.size - offset,
		prevPhys: b,
		nextPhys: bk.nextPhys,
		prevFree: nilRec,
		nextFree: nilRec,
	}
	if bk.nextPhys != nilRec {
		x.blocks[bk.nextPhys].prevPhys = n
	} else {
		x.setLast(bk.addr, n)
	}
	bk.nextPhys = n
	bk.size = offset
	x.freeBlocksN++
	return n
}

// absorb merges record n, the free upper neighbour of record b, out of the
// lists, into b, and recycles n's record. bk and nk point at the records.
func (x *Index) absorb(b uint32, bk *block, n uint32, nk *block) {
	bk.size += nk.size
	next := nk.nextPhys
	bk.nextPhys = next
	if next != nilRec {
		x.blocks[next].prevPhys = b
	} else {
		x.setLast(bk.addr, b)
	}
	x.freeBlocksN--
	x.spare = append(x.spare, n)
}

func (x *Index) newRecord() uint32 {
	if k := len(x.spare); k > 0 {
		r := x.spare[k-1]
		x.spare = x.spare[:k-1]
		return r
	}
	if uint64(len(x.blocks)) >= uint64(allocMark) { // uint64: int(allocMark) overflows a 32-bit int
		panic("tlsf: more than 2^32-2 block records")
	}
	x.blocks = append(x.blocks, block{})
	return uint32(len(x.blocks) - 1)
}

// The wilderness list (Config.Wilderness) is list (wildFL, wildSL), which
// no size maps to (sizes map to first-level indexes below numFL ≤ 49), so
// that the bitmaps' find-first-set reaches it after every size-class list.
const (
	wildFL, wildSL = 63, 63
	wildList       = wildFL<<6 | wildSL
)

// listFor returns the list of free record bk: the wilderness list for the
// top block of a region under Config.Wilderness, else the list its size
// maps to (mapping insert). A listed block's top-ness never changes while
// it is listed: every cut and merge unlinks the blocks it changes first.
func (x *Index) listFor(bk *block) (fl, sl uint) {
	if x.wild && bk.nextPhys == nilRec {
		return wildFL, wildSL
	}
	return x.insert(bk.size)
}

// fitWild returns the first block of the wilderness list with at least
// need bytes, moved to the list's head (so that popHead takes it), or
// nilRec. O(blocks in the list): one per region at most.
func (x *Index) fitWild(need uint64) uint32 {
	for b := x.heads[wildList]; b != nilRec; b = x.blocks[b].nextFree {
		if x.blocks[b].size >= need {
			if x.heads[wildList] != b {
				x.unlink(b)
				x.link(b)
			}
			return b
		}
	}
	return nilRec
}

// link pushes free record b on the head of its list (listFor: mapping
// insert, or the wilderness list).
func (x *Index) link(b uint32) {
	bk := &x.blocks[b]
	fl, sl := x.listFor(bk)
	i := listIndex(fl, sl)
	head := x.heads[i]
	bk.prevFree, bk.nextFree = nilRec, head
	if head != nilRec {
		x.blocks[head].prevFree = b
	}
	x.heads[i] = b
	x.slBitmap[fl&63] |= 1 << (sl & 63)
	x.flBitmap |= 1 << (fl & 63)
}

// unlink removes free record b from its list. Only a list's head needs the
// list's index, computed as link does (listFor).
func (x *Index) unlink(b uint32) {
	bk := &x.blocks[b]
	prev, next := bk.prevFree, bk.nextFree
	if next != nilRec {
		x.blocks[next].prevFree = prev
	}
	if prev != nilRec {
		x.blocks[prev].nextFree = next
	} else {
		fl, sl := x.listFor(bk)
		x.heads[listIndex(fl, sl)] = next
		if next == nilRec {
			x.clearBit(fl, sl)
		}
	}
	bk.prevFree, bk.nextFree = nilRec, nilRec
}

// popHead removes free record b, the head of list i.
func (x *Index) popHead(b uint32, i uint) {
	bk := &x.blocks[b]
	next := bk.nextFree
	x.heads[i&4095] = next
	if next != nilRec {
		x.blocks[next].prevFree = nilRec
	} else {
		x.clearBit(i>>6, i&63)
	}
	bk.nextFree = nilRec
}

// listIndex is the index in heads of list (fl, sl), below 4096.
func listIndex(fl, sl uint) uint { return (fl<<6 | sl) & 4095 }

// clearBit clears list (fl, sl)'s bit, now that it is empty, and fl's bit
// if no list of fl is left.
func (x *Index) clearBit(fl, sl uint) {
	m := x.slBitmap[fl&63] &^ (1 << (sl & 63))
	x.slBitmap[fl&63] = m
	if m == 0 {
		x.flBitmap &^= 1 << (fl & 63)
	}
}

// setLast records rec as the top block of the region containing addr.
func (x *Index) setLast(addr uint64, rec uint32) {
	s, _ := x.reg.find(addr)
	x.reg.slots[s].last = rec
}

// classifyBadAddress says why addr is not an allocated block's start.
func (x *Index) classifyBadAddress(addr uint64) error {
	s, ok := x.reg.find(addr)
	if !ok {
		return fmt.Errorf("%w: %#x is outside every region", ErrUnknownAddress, addr)
	}
	if addr%x.gran != 0 {
		return fmt.Errorf("%w: %#x is not a multiple of the granularity", ErrUnknownAddress, addr)
	}
	for b := x.reg.slots[s].first; b != nilRec; b = x.blocks[b].nextPhys {
		bk := &x.blocks[b]
		if addr < bk.addr+bk.size {
			if bk.free() {
				return fmt.Errorf("%w: %#x lies in free block [%#x, %#x)", ErrDoubleFree, addr, bk.addr, bk.addr+bk.size)
			}
			return fmt.Errorf("%w: %#x is inside allocated block [%#x, %#x)", ErrUnknownAddress, addr, bk.addr, bk.addr+bk.size)
		}
	}
	return fmt.Errorf("%w: %#x", ErrUnknownAddress, addr) // not reached while invariants hold
}
