package cuda

// Virtual memory management (VMM) on a Device: reserve a range of
// device virtual addresses, create physical allocations, map them into the
// range and grant access. The driver reads its arguments from three C
// structs, declared below with the exact layout of cuda.h on LP64 Linux.
// structs.HostLayout pins Go's layout to the platform's C rules, and
// TestCUDAStructLayout checks every size and offset.

import (
	"structs"
	"unsafe"

	"github.com/gpumem/tlsf/device"
)

// cuMemLocation is CUmemLocation: where memory lives.
//
//	offset size  C field
//	     0    4  CUmemLocationType type  (enum: 4 bytes)
//	     4    4  int id                  (the CUdevice for a device)
//	size 8, alignment 4
type cuMemLocation struct {
	_   structs.HostLayout
	typ int32
	id  int32
}

// cuMemAllocationProp is CUmemAllocationProp: what cuMemCreate allocates
// and what cuMemGetAllocationGranularity asks about.
//
//	offset size  C field
//	     0    4  CUmemAllocationType type                  (PINNED = 1)
//	     4    4  CUmemAllocationHandleType requestedHandleTypes (NONE = 0)
//	     8    8  CUmemLocation location                    (alignment 4)
//	    16    8  void *win32HandleMetaData                 (0 off Windows)
//	    24    1  allocFlags.compressionType                (NONE = 0)
//	    25    1  allocFlags.gpuDirectRDMACapable
//	    26    2  allocFlags.usage                          (unsigned short)
//	    28    4  allocFlags.reserved[4]                    (must be 0)
//	size 32, alignment 8; no padding (the pointer at 16 is already aligned)
type cuMemAllocationProp struct {
	_                    structs.HostLayout
	typ                  int32
	requestedHandleTypes int32
	location             cuMemLocation
	win32HandleMetaData  uintptr
	compressionType      uint8
	gpuDirectRDMACapable uint8
	usage                uint16
	reserved             [4]uint8
}

// cuMemAccessDesc is CUmemAccessDesc: one location's access to a range, as
// an element of the array cuMemSetAccess reads.
//
//	offset size  C field
//	     0    8  CUmemLocation location
//	     8    4  CUmemAccess_flags flags  (enum; PROT_READWRITE = 3)
//	size 12, alignment 4 (array elements are 12 bytes apart)
type cuMemAccessDesc struct {
	_        structs.HostLayout
	location cuMemLocation
	flags    int32
}

// pinnedProp describes pinned device memory on this device, with no
// shareable handle type and no compression.
func (d *Device) pinnedProp() cuMemAllocationProp {
	return cuMemAllocationProp{
		typ:                  cuMemAllocationPinned,
		requestedHandleTypes: cuMemHandleTypeNone,
		location:             cuMemLocation{typ: cuMemLocationDevice, id: d.dev},
	}
}

// AllocationGranularity returns the minimum granularity in bytes of
// physical allocations and mappings of pinned device memory on this device
// (cuMemGetAllocationGranularity, CU_MEM_ALLOC_GRANULARITY_MINIMUM; 2 MiB
// on current GPUs). The first successful answer is cached, so later calls
// make no driver call; no Call kind counts it. Errors: ErrNotSupported or
// ErrInvalidValue where the device has no VMM.
func (d *Device) AllocationGranularity() (uint64, error) {
	if g := d.gran.Load(); g != 0 {
		return g, nil
	}
	prop := d.pinnedProp()
	var g uintptr // size_t
	err := d.do(callInternal, &d.drv.cuMemGetAllocationGranularity,
		uintptr(unsafe.Pointer(&g)), uintptr(unsafe.Pointer(&prop)), cuMemGranularityMinimum)
	if err != nil {
		return 0, err
	}
	d.gran.Store(uint64(g))
	return uint64(g), nil
}

// AddressReserve reserves size bytes of device virtual address space,
// aligned to alignment bytes (0: the granularity), at an address the
// driver chooses (cuMemAddressReserve, flags 0). size must be a multiple
// of the granularity. Errors: ErrInvalidValue for a bad size or alignment,
// ErrOutOfMemory when no such range is free.
func (d *Device) AddressReserve(size, alignment uint64) (uintptr, error) {
	var p uintptr // CUdeviceptr
	err := d.do(device.CallAddressReserve, &d.drv.cuMemAddressReserve,
		uintptr(unsafe.Pointer(&p)), uintptr(size), uintptr(alignment), 0, 0)
	return p, err
}

// AddressFree releases a whole reservation made by AddressReserve
// (cuMemAddressFree); nothing may be mapped in it. Errors: ErrInvalidValue
// for a range that is not exactly one reservation.
func (d *Device) AddressFree(ptr uintptr, size uint64) error {
	return d.do(device.CallAddressFree, &d.drv.cuMemAddressFree, ptr, uintptr(size))
}

// MemCreate allocates size bytes of physical memory on this device, a
// multiple of the granularity (cuMemCreate: CU_MEM_ALLOCATION_TYPE_PINNED,
// CU_MEM_LOCATION_TYPE_DEVICE, no shareable handle, flags 0). Errors:
// ErrInvalidValue for a bad size, ErrOutOfMemory.
func (d *Device) MemCreate(size uint64) (device.MemHandle, error) {
	prop := d.pinnedProp()
	var h uint64 // CUmemGenericAllocationHandle (unsigned long long)
	err := d.do(device.CallMemCreate, &d.drv.cuMemCreate,
		uintptr(unsafe.Pointer(&h)), uintptr(size), uintptr(unsafe.Pointer(&prop)), 0)
	return device.MemHandle(h), err
}

// MemRelease releases a handle from MemCreate (cuMemRelease); the memory
// is freed once it is also unmapped everywhere. Errors: ErrInvalidValue
// for an unknown handle.
func (d *Device) MemRelease(h device.MemHandle) error {
	return d.do(device.CallMemRelease, &d.drv.cuMemRelease, uintptr(h))
}

// MemMap maps the whole of physical allocation h, size bytes from offset
// 0, at ptr inside a reservation (cuMemMap, flags 0). Access must then be
// granted with MemSetAccess. Errors: ErrNotSupported for a size below
// h's, part of a handle (driver 580 answers CUDA_ERROR_NOT_SUPPORTED);
// ErrInvalidValue for a range outside a reservation or already mapped, a
// size above h's, or an unknown handle.
func (d *Device) MemMap(ptr uintptr, size uint64, h device.MemHandle) error {
	return d.do(device.CallMemMap, &d.drv.cuMemMap, ptr, uintptr(size), 0, uintptr(h), 0)
}

// MemUnmap unmaps [ptr, ptr+size) (cuMemUnmap). It does not wait for the
// GPU: the caller must know no work still uses the range. Errors:
// ErrInvalidValue for a range that is not mapped as whole allocations.
func (d *Device) MemUnmap(ptr uintptr, size uint64) error {
	return d.do(device.CallMemUnmap, &d.drv.cuMemUnmap, ptr, uintptr(size))
}

// MemSetAccess grants this device read-write access to the mapped range
// [ptr, ptr+size) (cuMemSetAccess with one CUmemAccessDesc:
// CU_MEM_LOCATION_TYPE_DEVICE, this device, PROT_READWRITE). Errors:
// ErrInvalidValue for a range not wholly mapped.
func (d *Device) MemSetAccess(ptr uintptr, size uint64) error {
	desc := cuMemAccessDesc{
		location: cuMemLocation{typ: cuMemLocationDevice, id: d.dev},
		flags:    cuMemAccessReadWrite,
	}
	return d.do(device.CallMemSetAccess, &d.drv.cuMemSetAccess, ptr, uintptr(size), uintptr(unsafe.Pointer(&desc)), 1)
}
