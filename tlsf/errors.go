package tlsf

import "errors"

// Sentinel errors. Every error an Index returns wraps exactly one of these;
// test with errors.Is. An operation that returns an error changes nothing.
var (
	// ErrInvalidSize: a size of zero.
	ErrInvalidSize = errors.New("tlsf: invalid size")
	// ErrTooLarge: a requested size above MaxSize. (A size of at most
	// MaxSize never rounds past it: MaxSize is a size-class boundary.)
	ErrTooLarge = errors.New("tlsf: size too large")
	// ErrBadAlignment: an alignment that is zero, not a power of two, or
	// above MaxSize.
	ErrBadAlignment = errors.New("tlsf: bad alignment")
	// ErrNoSpace: no free block can hold the request. Not a misuse: the
	// caller may add or grow a region and try again.
	ErrNoSpace = errors.New("tlsf: no free block large enough")
	// ErrDoubleFree: the address is a multiple of the granularity inside a
	// region and lies in a free block: a block that was already freed (and
	// perhaps merged with its neighbours), or an address the index never
	// returned, which it cannot tell apart.
	ErrDoubleFree = errors.New("tlsf: double free")
	// ErrUnknownAddress: the address is outside every region, is not a
	// multiple of the granularity (wherever it lies, free space included),
	// or lies inside an allocated block but not at its start.
	ErrUnknownAddress = errors.New("tlsf: unknown address")
	// ErrRegionOverlap: a new or grown region would overlap another.
	ErrRegionOverlap = errors.New("tlsf: region overlap")
	// ErrBadRegion: a region's base or size is not a multiple of the
	// granularity, is empty, exceeds MaxSize, wraps around 2^64, or names
	// no region.
	ErrBadRegion = errors.New("tlsf: bad region")
	// ErrRegionBusy: RemoveRegion of a region that still has allocated
	// blocks.
	ErrRegionBusy = errors.New("tlsf: region has allocated blocks")
	// ErrBadConfig: a Config field out of range.
	ErrBadConfig = errors.New("tlsf: bad config")
	// ErrCorrupt: Check found a broken invariant (a bug, never misuse).
	ErrCorrupt = errors.New("tlsf: invariant violated")
)
