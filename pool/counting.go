package pool

import (
	"strings"
	"sync/atomic"

	"github.com/gpumem/tlsf/device"
)

// Path names the part of the pool that made a driver call
// (Stats.DeviceCallsByPath), so that a program making more calls than it
// expects can tell ordinary growth from the out-of-memory path or the
// scavenger. A call counts for the outermost path it is made in, but the
// out-of-memory path takes over from the request's own PathAlloc (the
// growth it retries counts for PathOutOfMemory), and while the
// OnOutOfMemory hook runs without the pool's lock, calls count for their
// own paths (the hook's Trim for PathTrim).
type Path int

const (
	// PathOther is every call made outside the paths below: stream and
	// event calls of stream-ordered frees, a passthrough pool's frees,
	// AllocPitch's pitch query, a P cache's or peer's work.
	PathOther Path = iota
	// PathSetup is New and Close: the virtual address range, an initial
	// reserve (InitialFraction), memory returned at Close.
	PathSetup
	// PathAlloc is a request's own slow path short of out-of-memory:
	// growth (cuMemCreate, cuMemMap, cuMemSetAccess; cuMemAlloc for a
	// chunk pool; cuMemGetInfo to size it), backing released pages under
	// the block placed, ReleaseFraction's moves before mapping more,
	// polls of pending stream-ordered frees; a passthrough pool's
	// cuMemAlloc.
	PathAlloc
	// PathOutOfMemory is the out-of-memory path (share.go): from the
	// first failed growth of a request on, the waits for pending frees,
	// the pages moved or released for it, the growth retried, the
	// OnOutOfMemory hook's retry.
	PathOutOfMemory
	// PathScavenge is memory returned because the device ran low
	// (FreeFloorFraction) or an idle pool gave its memory to another
	// process (IdleRelease): the background scavenger's wakes and the floor's
	// check every ReleaseCheckInterval frees.
	PathScavenge
	// PathTrim is Trim.
	PathTrim
	// NumPaths is the number of paths; not a path.
	NumPaths
)

var pathNames = [NumPaths]string{"other", "setup", "alloc", "out_of_memory", "scavenge", "trim"}

// String returns the path's name as the JSON of tlsf-stress reports it:
// "other", "setup", "alloc", "out_of_memory", "scavenge", "trim".
func (p Path) String() string {
	if p >= 0 && p < NumPaths {
		return pathNames[p]
	}
	return "Path(?)"
}

// PathCounts holds the driver calls each Path made, by kind:
// c[PathOutOfMemory][device.CallMemMap] is the cuMemMap calls of the
// out-of-memory path, c[PathOutOfMemory].Total() all of its calls.
type PathCounts [NumPaths]device.Counts

// Total is the sum over all paths and kinds.
func (c PathCounts) Total() uint64 {
	var t uint64
	for _, k := range c {
		t += k.Total()
	}
	return t
}

// Map returns the paths that made calls, keyed by name, each with its
// non-zero counts keyed by driver entry point (device.Counts.Map).
func (c PathCounts) Map() map[string]map[string]uint64 {
	m := make(map[string]map[string]uint64)
	for p, k := range c {
		if k.Total() != 0 {
			m[Path(p).String()] = k.Map()
		}
	}
	return m
}

// String lists the paths that made calls, each with its non-zero counts,
// e.g. "setup: cuMemGetInfo=1 cuMemAddressReserve=1; alloc: cuMemCreate=3
// cuMemMap=3"; "" where no path made any.
func (c PathCounts) String() string {
	var b strings.Builder
	for p, k := range c {
		if k.Total() == 0 {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(Path(p).String() + ": " + k.String())
	}
	return b.String()
}

// counted wraps the pool's Device and counts every call the pool makes,
// by the path making it and by kind (Stats.DeviceCallsByPath; summed over
// the paths, Stats.DeviceCalls). The pool makes its calls under its lock,
// but for the few the unlocked* methods make (guard mode's stream
// synchronization at a free, history's look at free memory after a
// failure), which count for PathOther: they neither read nor disturb the
// current path, which the lock guards. The counters and the path are
// atomic all the same, so that no call can race with Stats. The path is
// set only on slow paths (enter, switchTo, leave), never on a fast path's
// Alloc or Free.
type counted struct {
	device.Device
	byPath [NumPaths][device.NumCalls]atomic.Uint64
	path   atomic.Int32 // the Path locked calls count for now
	// heaps, when a memory checker watches the pool (nvtx.go), hears of
	// every piece of device memory the heap takes and returns.
	heaps *memWatch
	// lastFree is the device's free memory in bytes as the last
	// successful cuMemGetInfo under the pool's lock reported it, and
	// lastReserved the pool's reserved bytes then (reservedNow, which
	// reads the pool's state under its lock), valid once lastFreeOK.
	lastFree     atomic.Uint64
	lastReserved atomic.Uint64
	lastFreeOK   atomic.Bool
	reservedNow  func() uint64
}

// count counts one call of kind k, for the current path.
func (c *counted) count(k device.Call) {
	c.byPath[c.path.Load()][k].Add(1)
}

// enter makes the calls that follow count for path, unless they count for
// a path other than PathOther already (the outermost path names them),
// and returns the path to give leave.
func (c *counted) enter(path Path) Path {
	prev := Path(c.path.Load())
	if prev == PathOther {
		c.path.Store(int32(path))
	}
	return prev
}

// switchTo makes the calls that follow count for path, whatever the path
// was: the out-of-memory path taking over from a request's own. The
// caller's leave restores what enter saved.
func (c *counted) switchTo(path Path) { c.path.Store(int32(path)) }

// leave restores the path enter returned.
func (c *counted) leave(prev Path) { c.path.Store(int32(prev)) }

// seenFree returns the device's free memory as the pool's last
// cuMemGetInfo under its lock reported it, with the pool's reserved bytes
// then, and whether it made one; no driver call.
func (c *counted) seenFree() (seenFree, bool) {
	return seenFree{free: c.lastFree.Load(), reserved: c.lastReserved.Load(), ok: true}, c.lastFreeOK.Load()
}

// counts returns the calls by kind.
func (c *counted) counts() device.Counts {
	all, _ := c.snapshot()
	return all
}

// snapshot returns the calls by path and kind, read once each, and their
// sums over the paths: the calls by kind.
func (c *counted) snapshot() (device.Counts, PathCounts) {
	var kinds device.Counts
	var paths PathCounts
	for p := range c.byPath {
		for k := range c.byPath[p] {
			n := c.byPath[p][k].Load()
			paths[p][k] = n
			kinds[k] += n
		}
	}
	return kinds, paths
}

// unlockedMemGetInfo is MemGetInfo for a caller without the pool's lock;
// its answer is not kept for seenFree (the pool's reserved bytes cannot
// be read with it).
func (c *counted) unlockedMemGetInfo() (free, total uint64, err error) {
	c.byPath[PathOther][device.CallMemGetInfo].Add(1)
	return c.Device.MemGetInfo()
}

// unlockedStreamSynchronize is StreamSynchronize for a caller without the
// pool's lock.
func (c *counted) unlockedStreamSynchronize(s device.Stream) error {
	c.byPath[PathOther][device.CallStreamSynchronize].Add(1)
	return c.Device.StreamSynchronize(s)
}

func (c *counted) MemGetInfo() (uint64, uint64, error) {
	c.count(device.CallMemGetInfo)
	return c.memGetInfo()
}

// memGetInfo is cuMemGetInfo, its answer kept for seenFree; not counted.
// Pool lock held.
func (c *counted) memGetInfo() (uint64, uint64, error) {
	free, total, err := c.Device.MemGetInfo()
	if err == nil {
		c.lastFree.Store(free)
		if c.reservedNow != nil {
			c.lastReserved.Store(c.reservedNow())
		}
		c.lastFreeOK.Store(true)
	}
	return free, total, err
}

func (c *counted) MemAlloc(size uint64) (uintptr, error) {
	c.count(device.CallMemAlloc)
	ptr, err := c.Device.MemAlloc(size)
	if err == nil && c.heaps != nil {
		c.heaps.mapped(ptr, size)
	}
	return ptr, err
}

func (c *counted) MemFree(ptr uintptr) error {
	c.count(device.CallMemFree)
	if c.heaps == nil {
		return c.Device.MemFree(ptr)
	}
	// The checker forgets the heap before the driver frees its memory
	// (afterwards it refuses the unregistration). If the free fails, the
	// heap is not registered again: a failing cuMemFree almost always
	// means the context is gone (a device fault, sticky; compute-sanitizer
	// destroys the context on a reported access by default), and the
	// checker refuses a heap there ("Call to nvtxMemHeapRegister failed:
	// One or more of the parameters is invalid"). A chunk the pool keeps
	// after a failed free is unwatched: the checker sees it as the
	// driver's allocation, whole.
	c.heaps.unmapped(ptr)
	return c.Device.MemFree(ptr)
}

func (c *counted) MemAllocPitch(w, h uint64, elem uint32) (uintptr, uint64, error) {
	c.count(device.CallMemAllocPitch)
	return c.Device.MemAllocPitch(w, h, elem)
}

func (c *counted) AddressReserve(size, align uint64) (uintptr, error) {
	c.count(device.CallAddressReserve)
	ptr, err := c.Device.AddressReserve(size, align)
	if err == nil && c.heaps != nil {
		c.heaps.mapped(ptr, size)
	}
	return ptr, err
}

func (c *counted) AddressFree(ptr uintptr, size uint64) error {
	c.count(device.CallAddressFree)
	if c.heaps == nil {
		return c.Device.AddressFree(ptr, size)
	}
	c.heaps.unmapped(ptr) // not registered again on failure: see MemFree
	return c.Device.AddressFree(ptr, size)
}

func (c *counted) MemCreate(size uint64) (device.MemHandle, error) {
	c.count(device.CallMemCreate)
	return c.Device.MemCreate(size)
}

func (c *counted) MemRelease(h device.MemHandle) error {
	c.count(device.CallMemRelease)
	return c.Device.MemRelease(h)
}

func (c *counted) MemMap(ptr uintptr, size uint64, h device.MemHandle) error {
	c.count(device.CallMemMap)
	return c.Device.MemMap(ptr, size, h)
}

func (c *counted) MemUnmap(ptr uintptr, size uint64) error {
	c.count(device.CallMemUnmap)
	return c.Device.MemUnmap(ptr, size)
}

func (c *counted) MemSetAccess(ptr uintptr, size uint64) error {
	c.count(device.CallMemSetAccess)
	return c.Device.MemSetAccess(ptr, size)
}

func (c *counted) StreamSynchronize(s device.Stream) error {
	c.count(device.CallStreamSynchronize)
	return c.Device.StreamSynchronize(s)
}

func (c *counted) StreamWaitEvent(s device.Stream, e device.Event) error {
	c.count(device.CallStreamWaitEvent)
	return c.Device.StreamWaitEvent(s, e)
}

func (c *counted) EventCreate() (device.Event, error) {
	c.count(device.CallEventCreate)
	return c.Device.EventCreate()
}

func (c *counted) EventDestroy(e device.Event) error {
	c.count(device.CallEventDestroy)
	return c.Device.EventDestroy(e)
}

func (c *counted) EventRecord(e device.Event, s device.Stream) error {
	c.count(device.CallEventRecord)
	return c.Device.EventRecord(e, s)
}

func (c *counted) EventQuery(e device.Event) (bool, error) {
	c.count(device.CallEventQuery)
	return c.Device.EventQuery(e)
}

func (c *counted) EventSynchronize(e device.Event) error {
	c.count(device.CallEventSynchronize)
	return c.Device.EventSynchronize(e)
}
