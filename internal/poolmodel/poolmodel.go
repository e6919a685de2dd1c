// Package poolmodel is what the pool's tests outside package pool (the
// fault campaigns in pool/, the fuzz targets in fuzz/) expect of its
// statistics, written from the documentation of pool.Options rather than
// from the pool's code, so that the two can disagree.
package poolmodel

import (
	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/pool"
)

// BlockSize is the size in bytes at which a pool made with options o
// counts a block of size bytes allocated on stream s (Stats.Allocated,
// Size): its size class (class) where the caches serve it (the default
// stream, the caches' largest size and less: 4 KiB by default, 1 MiB with
// GoodFit) or with GoodFit, else size rounded up to 256 bytes (best fit).
func BlockSize(o pool.Options, class func(uint64) uint64, size uint64, s device.Stream) uint64 {
	most := o.Cache.MaxSize
	if most == 0 {
		most = 4 << 10
		if o.GoodFit {
			most = 1 << 20
		}
	}
	if o.GoodFit || s == 0 && !o.Cache.Disable && size <= most {
		return class(size)
	}
	return (size + 255) &^ 255
}
