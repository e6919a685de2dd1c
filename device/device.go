package device

import (
	"errors"
	"fmt"
)

// Stream is a CUDA stream handle (CUstream). The zero Stream is the legacy
// default stream (the NULL stream), which every driver call accepts.
// Handles made by other bindings (gorgonia.org/cu, cgo code) are plain
// uintptrs and convert directly.
type Stream uintptr

// Event is a CUDA event handle (CUevent).
type Event uintptr

// MemHandle is a physical memory allocation handle of the virtual memory
// management API (CUmemGenericAllocationHandle, from cuMemCreate).
type MemHandle uint64

// Device is what the pool needs from one GPU: memory information, linear
// allocations, virtual memory management (VMM), streams and events, and the
// memset/copy calls used to verify contents. Device pointers and sizes are
// plain integers (bytes); nothing CUDA-typed beyond the handle types above
// leaves this package.
//
// Every method is safe for concurrent use. Every error either wraps one of
// the sentinels below (test with errors.Is) or is an *Error naming the
// driver call and code.
type Device interface {
	// Ordinal is the device's index among the driver's devices (0-based).
	Ordinal() int
	// Name is the device's marketing name, e.g. "NVIDIA H200".
	Name() string

	// MemGetInfo returns the free and total device memory in bytes
	// (cuMemGetInfo_v2). Free memory changes as other processes allocate.
	MemGetInfo() (free, total uint64, err error)

	// MemAlloc allocates size bytes of linear device memory (cuMemAlloc_v2),
	// aligned to at least 256 bytes. A size of 0 fails with ErrInvalidValue;
	// exhaustion fails with ErrOutOfMemory.
	MemAlloc(size uint64) (uintptr, error)
	// MemFree frees memory from MemAlloc or MemAllocPitch (cuMemFree_v2).
	// The driver waits for work using it to finish.
	MemFree(ptr uintptr) error
	// MemAllocPitch allocates height rows of at least widthBytes each
	// (cuMemAllocPitch_v2) and returns the pointer and the row pitch in
	// bytes. elementSize is 4, 8 or 16 bytes.
	MemAllocPitch(widthBytes, height uint64, elementSize uint32) (ptr uintptr, pitch uint64, err error)

	// VMMSupported reports whether the device supports virtual memory
	// management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED).
	VMMSupported() bool
	// AllocationGranularity is the minimum granularity in bytes of
	// physical allocations and mappings for pinned device memory
	// (cuMemGetAllocationGranularity, CU_MEM_ALLOC_GRANULARITY_MINIMUM).
	AllocationGranularity() (uint64, error)
	// AddressReserve reserves size bytes of virtual address space aligned to
	// alignment bytes (0: the granularity) (cuMemAddressReserve). size must
	// be a multiple of the granularity.
	AddressReserve(size, alignment uint64) (uintptr, error)
	// AddressFree releases a reservation made by AddressReserve
	// (cuMemAddressFree). Nothing may be mapped in it.
	AddressFree(ptr uintptr, size uint64) error
	// MemCreate allocates size bytes of physical device memory, a multiple
	// of the granularity (cuMemCreate, pinned, on this device).
	MemCreate(size uint64) (MemHandle, error)
	// MemRelease releases a physical allocation handle (cuMemRelease). The
	// memory is freed once it is also unmapped everywhere.
	MemRelease(h MemHandle) error
	// MemMap maps the whole of physical allocation h (size bytes, offset 0)
	// at ptr inside a reservation (cuMemMap). Access must then be granted
	// with MemSetAccess. A size below h's (part of a handle) is
	// ErrNotSupported, as the driver answers it; a range outside a
	// reservation or already mapped is ErrInvalidValue.
	MemMap(ptr uintptr, size uint64, h MemHandle) error
	// MemUnmap unmaps [ptr, ptr+size) (cuMemUnmap). It does not wait for
	// the GPU: the caller must know no work still uses the range.
	MemUnmap(ptr uintptr, size uint64) error
	// MemSetAccess grants this device read-write access to the mapped range
	// [ptr, ptr+size) (cuMemSetAccess).
	MemSetAccess(ptr uintptr, size uint64) error

	// StreamCreate creates a stream (cuStreamCreate, CU_STREAM_NON_BLOCKING).
	StreamCreate() (Stream, error)
	// StreamDestroy destroys a stream (cuStreamDestroy_v2).
	StreamDestroy(s Stream) error
	// StreamSynchronize waits until all work queued on s is done
	// (cuStreamSynchronize).
	StreamSynchronize(s Stream) error
	// StreamWaitEvent makes future work on s wait for e (cuStreamWaitEvent).
	StreamWaitEvent(s Stream, e Event) error
	// EventCreate creates an event with timing disabled
	// (cuEventCreate, CU_EVENT_DISABLE_TIMING).
	EventCreate() (Event, error)
	// EventDestroy destroys an event (cuEventDestroy_v2).
	EventDestroy(e Event) error
	// EventRecord records e on s (cuEventRecord).
	EventRecord(e Event, s Stream) error
	// EventQuery reports whether the work before e's last record is done
	// (cuEventQuery: CUDA_SUCCESS → true, CUDA_ERROR_NOT_READY → false).
	EventQuery(e Event) (done bool, err error)
	// EventSynchronize waits for e (cuEventSynchronize).
	EventSynchronize(e Event) error

	// MemsetD32 sets n 32-bit words at ptr to value (cuMemsetD32_v2);
	// ptr must be 4-byte aligned.
	MemsetD32(ptr uintptr, value uint32, n uint64) error
	// MemsetD32Async is MemsetD32 queued on stream s (cuMemsetD32Async).
	MemsetD32Async(ptr uintptr, value uint32, n uint64, s Stream) error
	// MemcpyDtoH copies len(dst) bytes from device address src to dst
	// (cuMemcpyDtoH_v2); it waits for prior work on the default stream.
	MemcpyDtoH(dst []byte, src uintptr) error

	// TexturePitchAlignment is the pitch alignment in bytes
	// (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT); MemAllocPitch rounds
	// pitches to a multiple of 512 bytes on current GPUs regardless.
	TexturePitchAlignment() uint64

	// Close releases what the Device itself holds (contexts it retained).
	// Memory the caller allocated is not freed.
	Close() error
}

// Sentinel errors. Driver errors wrap the sentinel matching their code
// where one exists.
var (
	// ErrNoDriver: libcuda.so.1 could not be loaded or initialised; also
	// the driver's CUDA_ERROR_NOT_INITIALIZED (3), CUDA_ERROR_DEINITIALIZED
	// (4, the driver is shutting down) and CUDA_ERROR_STUB_LIBRARY (34,
	// libcuda.so.1 is the toolkit's stub, not a driver).
	ErrNoDriver = errors.New("device: CUDA driver not available (libcuda.so.1)")
	// ErrOutOfMemory: CUDA_ERROR_OUT_OF_MEMORY (2), or the simulated
	// capacity is exhausted.
	ErrOutOfMemory = errors.New("device: out of memory")
	// ErrInvalidValue: CUDA_ERROR_INVALID_VALUE (1) or
	// CUDA_ERROR_INVALID_HANDLE (400: a stream, event or handle the
	// driver does not know), or an argument the simulated device rejects
	// (zero size, misalignment, unknown pointer); also a call on a closed
	// device.
	ErrInvalidValue = errors.New("device: invalid value")
	// ErrNotSupported: CUDA_ERROR_NOT_SUPPORTED (801), e.g. VMM on a
	// device without it or cuMemMap of part of a handle, and
	// CUDA_ERROR_PEER_ACCESS_UNSUPPORTED (217).
	ErrNotSupported = errors.New("device: not supported")
	// ErrNoDevice: the ordinal names no device (CUDA_ERROR_NO_DEVICE
	// (100), CUDA_ERROR_INVALID_DEVICE (101)), or the device is there but
	// cannot be used now (CUDA_ERROR_DEVICE_UNAVAILABLE (46): in use by
	// another process in exclusive-process compute mode, or otherwise
	// unavailable). Tell them apart by the *Error's Code where it
	// matters (devicetest does: DeviceUnavailable).
	ErrNoDevice = errors.New("device: no such device")
	// ErrIllegalAddress: an access to memory that is not allocated or not
	// mapped (CUDA_ERROR_ILLEGAL_ADDRESS, 700); on the simulated device, what a
	// use after free looks like.
	ErrIllegalAddress = errors.New("device: illegal address")
	// ErrInjected: a failure injected by the simulated device (device/sim) when the
	// caller chose no other error.
	ErrInjected = errors.New("device: injected fault")
)

// Error is a failed driver call: the call's name, the CUresult code and
// the driver's name for it (cuGetErrorName). It matches the sentinel for
// its code under errors.Is.
type Error struct {
	Call string // e.g. "cuMemAlloc_v2"
	Code int    // CUresult
	Name string // e.g. "CUDA_ERROR_OUT_OF_MEMORY"
}

func (e *Error) Error() string {
	return fmt.Sprintf("device: %s: %s (%d)", e.Call, e.Name, e.Code)
}

// CUresult codes this package maps to sentinels.
const (
	cuResultInvalidValue      = 1
	cuResultOutOfMemory       = 2
	cuResultNotInitialized    = 3
	cuResultDeinitialized     = 4   // the driver is shutting down
	cuResultStubLibrary       = 34  // libcuda.so.1 is the toolkit's stub, not a driver
	cuResultDeviceUnavailable = 46  // the device is in exclusive use, or unavailable
	cuResultPeerUnsupported   = 217 // CUDA_ERROR_PEER_ACCESS_UNSUPPORTED
	cuResultNoDevice          = 100
	cuResultInvalidDevice     = 101
	cuResultInvalidHandle     = 400 // a stream, event or handle the driver does not know
	cuResultIllegalAddress    = 700
	cuResultNotSupported      = 801
)

// Unwrap returns the sentinel for the code, if any.
func (e *Error) Unwrap() error {
	switch e.Code {
	case cuResultInvalidValue, cuResultInvalidHandle:
		return ErrInvalidValue
	case cuResultNotInitialized, cuResultDeinitialized, cuResultStubLibrary:
		return ErrNoDriver
	case cuResultOutOfMemory:
		return ErrOutOfMemory
	case cuResultNoDevice, cuResultInvalidDevice, cuResultDeviceUnavailable:
		return ErrNoDevice
	case cuResultIllegalAddress:
		return ErrIllegalAddress
	case cuResultNotSupported, cuResultPeerUnsupported:
		return ErrNotSupported
	}
	return nil
}
