package pool

import (
	"sync/atomic"

	"github.com/gpumem/tlsf/device"
)

// counted wraps the pool's Device and counts every call the pool makes,
// by kind, for Stats.DeviceCalls. The pool makes its calls under its lock;
// the counters are atomic all the same, so that no future call outside it
// can race with Stats.
type counted struct {
	device.Device
	n [device.NumCalls]atomic.Uint64
	// heaps, when a memory checker watches the pool (nvtx.go), hears of
	// every piece of device memory the heap takes and returns.
	heaps *memWatch
	// lastFree is the device's free memory in bytes as the last
	// successful cuMemGetInfo reported it, valid once lastFreeOK.
	lastFree   atomic.Uint64
	lastFreeOK atomic.Bool
}

// seenFree returns the device's free memory as the pool's last
// cuMemGetInfo reported it, and whether it made one; no driver call.
func (c *counted) seenFree() (uint64, bool) {
	return c.lastFree.Load(), c.lastFreeOK.Load()
}

func (c *counted) counts() device.Counts {
	var out device.Counts
	for i := range c.n {
		out[i] = c.n[i].Load()
	}
	return out
}

func (c *counted) MemGetInfo() (uint64, uint64, error) {
	c.n[device.CallMemGetInfo].Add(1)
	free, total, err := c.Device.MemGetInfo()
	if err == nil {
		c.lastFree.Store(free)
		c.lastFreeOK.Store(true)
	}
	return free, total, err
}

func (c *counted) MemAlloc(size uint64) (uintptr, error) {
	c.n[device.CallMemAlloc].Add(1)
	ptr, err := c.Device.MemAlloc(size)
	if err == nil && c.heaps != nil {
		c.heaps.mapped(ptr, size)
	}
	return ptr, err
}

func (c *counted) MemFree(ptr uintptr) error {
	c.n[device.CallMemFree].Add(1)
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
	c.n[device.CallMemAllocPitch].Add(1)
	return c.Device.MemAllocPitch(w, h, elem)
}

func (c *counted) AddressReserve(size, align uint64) (uintptr, error) {
	c.n[device.CallAddressReserve].Add(1)
	ptr, err := c.Device.AddressReserve(size, align)
	if err == nil && c.heaps != nil {
		c.heaps.mapped(ptr, size)
	}
	return ptr, err
}

func (c *counted) AddressFree(ptr uintptr, size uint64) error {
	c.n[device.CallAddressFree].Add(1)
	if c.heaps == nil {
		return c.Device.AddressFree(ptr, size)
	}
	c.heaps.unmapped(ptr) // not registered again on failure: see MemFree
	return c.Device.AddressFree(ptr, size)
}

func (c *counted) MemCreate(size uint64) (device.MemHandle, error) {
	c.n[device.CallMemCreate].Add(1)
	return c.Device.MemCreate(size)
}

func (c *counted) MemRelease(h device.MemHandle) error {
	c.n[device.CallMemRelease].Add(1)
	return c.Device.MemRelease(h)
}

func (c *counted) MemMap(ptr uintptr, size uint64, h device.MemHandle) error {
	c.n[device.CallMemMap].Add(1)
	return c.Device.MemMap(ptr, size, h)
}

func (c *counted) MemUnmap(ptr uintptr, size uint64) error {
	c.n[device.CallMemUnmap].Add(1)
	return c.Device.MemUnmap(ptr, size)
}

func (c *counted) MemSetAccess(ptr uintptr, size uint64) error {
	c.n[device.CallMemSetAccess].Add(1)
	return c.Device.MemSetAccess(ptr, size)
}

func (c *counted) StreamSynchronize(s device.Stream) error {
	c.n[device.CallStreamSynchronize].Add(1)
	return c.Device.StreamSynchronize(s)
}

func (c *counted) StreamWaitEvent(s device.Stream, e device.Event) error {
	c.n[device.CallStreamWaitEvent].Add(1)
	return c.Device.StreamWaitEvent(s, e)
}

func (c *counted) EventCreate() (device.Event, error) {
	c.n[device.CallEventCreate].Add(1)
	return c.Device.EventCreate()
}

func (c *counted) EventDestroy(e device.Event) error {
	c.n[device.CallEventDestroy].Add(1)
	return c.Device.EventDestroy(e)
}

func (c *counted) EventRecord(e device.Event, s device.Stream) error {
	c.n[device.CallEventRecord].Add(1)
	return c.Device.EventRecord(e, s)
}

func (c *counted) EventQuery(e device.Event) (bool, error) {
	c.n[device.CallEventQuery].Add(1)
	return c.Device.EventQuery(e)
}

func (c *counted) EventSynchronize(e device.Event) error {
	c.n[device.CallEventSynchronize].Add(1)
	return c.Device.EventSynchronize(e)
}
