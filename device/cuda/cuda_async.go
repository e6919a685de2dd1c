package cuda

// The stream-ordered allocator on a Device (AsyncAllocator): the
// device's default memory pool, found once with cuDeviceGetDefaultMemPool
// after checking CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED. The entry
// points are optional (cuda_driver.go): without them, or without pool
// support on the device, every method fails with ErrNotSupported.

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/gpumem/tlsf/device"
)

var _ device.AsyncAllocator = (*Device)(nil)

// defaultMemPool returns the device's default CUmemoryPool, looking it up
// on first use (cuDeviceGetDefaultMemPool, not counted). After Close it
// returns errCUDAClosed, and makes no driver call.
func (d *Device) defaultMemPool() (uintptr, error) {
	if err := d.closedErr(); err != nil {
		return 0, err
	}
	d.memPoolOnce.Do(func() {
		drv := d.drv
		for _, s := range []*cuSym{&drv.cuMemAllocAsync, &drv.cuMemFreeAsync, &drv.cuDeviceGetDefaultMemPool,
			&drv.cuMemPoolTrimTo, &drv.cuMemPoolGetAttribute, &drv.cuMemPoolSetAttribute} {
			if s.addr == 0 {
				d.memPoolErr = fmt.Errorf("device: %s lacks the stream-ordered allocator (CUDA 11.2+): %w", libcudaName, device.ErrNotSupported)
				return
			}
		}
		var ok int32
		err := d.whileOpen(func() (err error) {
			ok, err = d.attribute(cuAttrMemoryPools)
			return err
		})
		if errors.Is(err, errCUDAClosed) {
			d.memPoolErr = err // closed meanwhile: every later call fails so
			return
		}
		if err != nil || ok == 0 {
			d.memPoolErr = fmt.Errorf("device: %v has no memory pools (CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED): %w", d, device.ErrNotSupported)
			return
		}
		var pool uintptr
		if err := d.do(callInternal, &drv.cuDeviceGetDefaultMemPool, uintptr(unsafe.Pointer(&pool)), uintptr(d.dev)); err != nil {
			d.memPoolErr = err
			return
		}
		d.memPool = pool
	})
	return d.memPool, d.memPoolErr
}

// MemAllocAsync allocates size bytes from the device's default memory
// pool for work on stream s (cuMemAllocAsync). Errors: ErrInvalidValue
// (size 0, bad stream), ErrOutOfMemory, ErrNotSupported (no memory pools).
func (d *Device) MemAllocAsync(size uint64, s device.Stream) (uintptr, error) {
	if _, err := d.defaultMemPool(); err != nil {
		return 0, err
	}
	var p uintptr // CUdeviceptr
	err := d.do(device.CallMemAllocAsync, &d.drv.cuMemAllocAsync, uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(s))
	return p, err
}

// MemFreeAsync frees ptr, from MemAllocAsync, once stream s reaches the
// call (cuMemFreeAsync). Errors: ErrInvalidValue, ErrNotSupported.
func (d *Device) MemFreeAsync(ptr uintptr, s device.Stream) error {
	if _, err := d.defaultMemPool(); err != nil {
		return err
	}
	return d.do(device.CallMemFreeAsync, &d.drv.cuMemFreeAsync, ptr, uintptr(s))
}

// MemPoolTrimTo returns unused memory of the default pool to the device,
// keeping at least keep bytes reserved (cuMemPoolTrimTo, keep as its
// minBytesToKeep; memory live allocations use stays). Errors:
// ErrNotSupported, the *Error of the call.
func (d *Device) MemPoolTrimTo(keep uint64) error {
	pool, err := d.defaultMemPool()
	if err != nil {
		return err
	}
	return d.do(device.CallMemPoolTrimTo, &d.drv.cuMemPoolTrimTo, pool, uintptr(keep))
}

// MemPoolGetAttribute reads a 64-bit attribute (cuuint64_t) of the
// default pool (cuMemPoolGetAttribute). Errors: ErrInvalidValue for an
// attribute other than those of MemPoolAttribute, ErrNotSupported.
func (d *Device) MemPoolGetAttribute(attr device.MemPoolAttribute) (uint64, error) {
	if !attr.Valid() {
		return 0, fmt.Errorf("device: cuMemPoolGetAttribute: %v is not a 64-bit attribute: %w", attr, device.ErrInvalidValue)
	}
	pool, err := d.defaultMemPool()
	if err != nil {
		return 0, err
	}
	var v uint64
	err = d.do(device.CallMemPoolGetAttribute, &d.drv.cuMemPoolGetAttribute, pool, uintptr(attr), uintptr(unsafe.Pointer(&v)))
	return v, err
}

// MemPoolSetAttribute sets a 64-bit attribute of the default pool
// (cuMemPoolSetAttribute): the release threshold, or 0 to reset a
// high-water mark. Errors: ErrInvalidValue for other attributes or
// values, ErrNotSupported.
func (d *Device) MemPoolSetAttribute(attr device.MemPoolAttribute, value uint64) error {
	if !attr.Valid() {
		return fmt.Errorf("device: cuMemPoolSetAttribute: %v is not a 64-bit attribute: %w", attr, device.ErrInvalidValue)
	}
	pool, err := d.defaultMemPool()
	if err != nil {
		return err
	}
	v := value
	return d.do(device.CallMemPoolSetAttribute, &d.drv.cuMemPoolSetAttribute, pool, uintptr(attr), uintptr(unsafe.Pointer(&v)))
}
