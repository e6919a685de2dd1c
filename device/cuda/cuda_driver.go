package cuda

// Loading the CUDA driver at run time.
//
// libcuda.so.1 is opened once per process (sync.Once) with purego.Dlopen,
// every entry point this package uses is resolved with purego.Dlsym and
// checked, and cuInit(0) is called. Nothing here needs cgo: with
// CGO_ENABLED=0 purego supplies the thread and C-call plumbing itself, so
// the module builds on machines without a CUDA toolkit or a C compiler and
// finds the driver, or its absence, when it runs.
//
// The entry points are the versioned symbols the driver exports (the
// header's #defines map cuMemAlloc to cuMemAlloc_v2 and so on). Resolving
// by exact name means a too-old driver shows up as a missing symbol in the
// load error, not as a call through a function with another signature.
//
// Calls go through purego.SyscallN (0.17 µs for a trivial driver call on
// the H200 host), not purego.RegisterFunc, whose wrappers convert every
// argument through reflection. A
// CUresult is a C enum, 32 bits wide, returned in the low half of a 64-bit
// register whose high half the callee may leave as anything: cuSym.call
// truncates it to int32 before comparing.

import (
	"fmt"
	"strings"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/gpumem/tlsf/device"
)

// libcudaName is the driver's soname. The unversioned libcuda.so is a
// development symlink that the toolkit installs and the driver package
// often does not; the .1 name is what the driver itself provides.
const libcudaName = "libcuda.so.1"

// CUresult codes handled here beyond those device.go maps to sentinels.
const (
	cudaSuccess      = 0
	cuResultNotReady = 600 // cuEventQuery: work before the event is pending
)

// Enumerators and flags passed to the driver, from cuda.h.
const (
	cuStreamNonBlocking     = 0x1 // CU_STREAM_NON_BLOCKING
	cuEventDisableTiming    = 0x2 // CU_EVENT_DISABLE_TIMING
	cuAttrTexturePitchAlign = 51  // CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT
	cuAttrVMMSupported      = 102 // CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED
	cuAttrMemoryPools       = 115 // CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED
	cuMemAllocationPinned   = 0x1 // CU_MEM_ALLOCATION_TYPE_PINNED
	cuMemHandleTypeNone     = 0x0 // CU_MEM_HANDLE_TYPE_NONE
	cuMemLocationDevice     = 0x1 // CU_MEM_LOCATION_TYPE_DEVICE
	cuMemAccessReadWrite    = 0x3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	cuMemGranularityMinimum = 0x0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	cuDeviceNameBufferBytes = 256 // cuDeviceGetName's buffer; names are far shorter
	cuErrorNameMaxBytes     = 128 // longest name read back from cuGetErrorName
	cuInitFlags             = 0   // cuInit's Flags argument must be 0
)

// cuSym is one resolved driver entry point.
type cuSym struct {
	name string  // exported symbol, e.g. "cuMemAlloc_v2"
	addr uintptr // its address in libcuda
}

// call calls the entry point with integer and pointer arguments and returns
// its CUresult. Pointers must be converted to uintptr in the argument list
// of the call itself (unsafe.Pointer rule 4): go:uintptrescapes then keeps
// the pointed-to objects on the heap and alive until the call returns.
//
//go:uintptrescapes
func (s *cuSym) call(args ...uintptr) int32 {
	r, _, _ := purego.SyscallN(s.addr, args...)
	return int32(r) // CUresult: 32-bit enum, high half of the register undefined
}

// cuDriver is the loaded driver: one entry point per function used.
type cuDriver struct {
	lib uintptr // dlopen handle; never closed (the driver stays for the process)

	cuInit                        cuSym
	cuDriverGetVersion            cuSym
	cuGetErrorName                cuSym
	cuDeviceGetCount              cuSym
	cuDeviceGet                   cuSym
	cuDeviceGetName               cuSym
	cuDeviceGetAttribute          cuSym
	cuDevicePrimaryCtxRetain      cuSym
	cuDevicePrimaryCtxRelease     cuSym
	cuCtxPushCurrent              cuSym
	cuCtxPopCurrent               cuSym
	cuCtxGetDevice                cuSym
	cuMemGetInfo                  cuSym
	cuMemAlloc                    cuSym
	cuMemFree                     cuSym
	cuMemAllocPitch               cuSym
	cuMemGetAllocationGranularity cuSym
	cuMemAddressReserve           cuSym
	cuMemAddressFree              cuSym
	cuMemCreate                   cuSym
	cuMemRelease                  cuSym
	cuMemMap                      cuSym
	cuMemUnmap                    cuSym
	cuMemSetAccess                cuSym
	cuStreamCreate                cuSym
	cuStreamDestroy               cuSym
	cuStreamSynchronize           cuSym
	cuStreamWaitEvent             cuSym
	cuEventCreate                 cuSym
	cuEventDestroy                cuSym
	cuEventRecord                 cuSym
	cuEventQuery                  cuSym
	cuEventSynchronize            cuSym
	cuMemsetD32                   cuSym
	cuMemsetD32Async              cuSym
	cuMemcpyDtoH                  cuSym
	cuDeviceCanAccessPeer         cuSym // several GPUs (cuda_peer.go)
	cuCtxEnablePeerAccess         cuSym
	cuMemcpyDtoDAsync             cuSym

	// Optional entry points (optionalSymbols): a zero addr means the
	// driver lacks them, and the methods using them fail with
	// ErrNotSupported.
	cuMemAllocAsync           cuSym
	cuMemFreeAsync            cuSym
	cuDeviceGetDefaultMemPool cuSym
	cuMemPoolTrimTo           cuSym
	cuMemPoolGetAttribute     cuSym
	cuMemPoolSetAttribute     cuSym
}

// symbols pairs each field with the exact exported name it resolves to.
func (d *cuDriver) symbols() []struct {
	sym  *cuSym
	name string
} {
	return []struct {
		sym  *cuSym
		name string
	}{
		{&d.cuInit, "cuInit"},
		{&d.cuDriverGetVersion, "cuDriverGetVersion"},
		{&d.cuGetErrorName, "cuGetErrorName"},
		{&d.cuDeviceGetCount, "cuDeviceGetCount"},
		{&d.cuDeviceGet, "cuDeviceGet"},
		{&d.cuDeviceGetName, "cuDeviceGetName"},
		{&d.cuDeviceGetAttribute, "cuDeviceGetAttribute"},
		{&d.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain"},
		{&d.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2"},
		{&d.cuCtxPushCurrent, "cuCtxPushCurrent_v2"},
		{&d.cuCtxPopCurrent, "cuCtxPopCurrent_v2"},
		{&d.cuCtxGetDevice, "cuCtxGetDevice"},
		{&d.cuMemGetInfo, "cuMemGetInfo_v2"},
		{&d.cuMemAlloc, "cuMemAlloc_v2"},
		{&d.cuMemFree, "cuMemFree_v2"},
		{&d.cuMemAllocPitch, "cuMemAllocPitch_v2"},
		{&d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity"},
		{&d.cuMemAddressReserve, "cuMemAddressReserve"},
		{&d.cuMemAddressFree, "cuMemAddressFree"},
		{&d.cuMemCreate, "cuMemCreate"},
		{&d.cuMemRelease, "cuMemRelease"},
		{&d.cuMemMap, "cuMemMap"},
		{&d.cuMemUnmap, "cuMemUnmap"},
		{&d.cuMemSetAccess, "cuMemSetAccess"},
		{&d.cuStreamCreate, "cuStreamCreate"},
		{&d.cuStreamDestroy, "cuStreamDestroy_v2"},
		{&d.cuStreamSynchronize, "cuStreamSynchronize"},
		{&d.cuStreamWaitEvent, "cuStreamWaitEvent"},
		{&d.cuEventCreate, "cuEventCreate"},
		{&d.cuEventDestroy, "cuEventDestroy_v2"},
		{&d.cuEventRecord, "cuEventRecord"},
		{&d.cuEventQuery, "cuEventQuery"},
		{&d.cuEventSynchronize, "cuEventSynchronize"},
		{&d.cuMemsetD32, "cuMemsetD32_v2"},
		{&d.cuMemsetD32Async, "cuMemsetD32Async"},
		{&d.cuMemcpyDtoH, "cuMemcpyDtoH_v2"},
		{&d.cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer"},
		{&d.cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess"},
		{&d.cuMemcpyDtoDAsync, "cuMemcpyDtoDAsync_v2"},
	}
}

// optionalSymbols are the entry points of the stream-ordered allocator
// (CUDA 11.2 on): a driver without them still loads, and AsyncAllocator's
// methods then fail with ErrNotSupported.
func (d *cuDriver) optionalSymbols() []struct {
	sym  *cuSym
	name string
} {
	return []struct {
		sym  *cuSym
		name string
	}{
		{&d.cuMemAllocAsync, "cuMemAllocAsync"},
		{&d.cuMemFreeAsync, "cuMemFreeAsync"},
		{&d.cuDeviceGetDefaultMemPool, "cuDeviceGetDefaultMemPool"},
		{&d.cuMemPoolTrimTo, "cuMemPoolTrimTo"},
		{&d.cuMemPoolGetAttribute, "cuMemPoolGetAttribute"},
		{&d.cuMemPoolSetAttribute, "cuMemPoolSetAttribute"},
	}
}

var (
	cuLoadOnce sync.Once
	cuDrv      *cuDriver
	cuLoadErr  error
)

// cuLoad returns the process's driver, loading and initialising it on the
// first call. A failure is remembered: later calls return the same error.
func cuLoad() (*cuDriver, error) {
	cuLoadOnce.Do(func() { cuDrv, cuLoadErr = cuOpen(libcudaName) })
	return cuDrv, cuLoadErr
}

// cuOpen opens the library at path, resolves every entry point and calls
// cuInit(0). Every error wraps ErrNoDriver; one from cuInit also wraps the
// *Error (CUDA_ERROR_NO_DEVICE there also matches ErrNoDevice).
func cuOpen(path string) (*cuDriver, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, fmt.Errorf("%w: dlopen %s: %v", device.ErrNoDriver, path, err)
	}
	d := &cuDriver{lib: lib}
	var missing []string
	for _, s := range d.symbols() {
		addr, err := purego.Dlsym(lib, s.name)
		if err != nil || addr == 0 {
			missing = append(missing, s.name)
			continue
		}
		*s.sym = cuSym{name: s.name, addr: addr}
	}
	for _, s := range d.optionalSymbols() {
		if addr, err := purego.Dlsym(lib, s.name); err == nil && addr != 0 {
			*s.sym = cuSym{name: s.name, addr: addr}
		}
	}
	if len(missing) > 0 {
		// The handle stays open: a library whose constructors ran may not
		// expect to be unloaded, and this happens once per process.
		return nil, fmt.Errorf("%w: %s lacks %s (driver too old, or not the CUDA driver)",
			device.ErrNoDriver, path, strings.Join(missing, ", "))
	}
	if r := d.cuInit.call(cuInitFlags); r != cudaSuccess {
		return nil, fmt.Errorf("%w: %s: %w", device.ErrNoDriver, path, d.error(&d.cuInit, r))
	}
	return d, nil
}

// error turns a failed CUresult r of entry point s into an *Error, naming
// the code with cuGetErrorName (a call that needs no context).
func (d *cuDriver) error(s *cuSym, r int32) *device.Error {
	return &device.Error{Call: s.name, Code: int(r), Name: d.errorName(r)}
}

// errorName is cuGetErrorName(r), or "CUresult(r)" for a code the driver
// does not know.
func (d *cuDriver) errorName(r int32) string {
	// The driver writes the address of a static C string into p. A *byte
	// that points outside the Go heap is legal and ignored by the GC; it
	// avoids converting a uintptr back into a pointer.
	var p *byte
	if d.cuGetErrorName.call(uintptr(r), uintptr(unsafe.Pointer(&p))) != cudaSuccess || p == nil {
		return fmt.Sprintf("CUresult(%d)", r)
	}
	return cString(p, cuErrorNameMaxBytes)
}

// cString copies the NUL-terminated C string at p, reading at most max
// bytes.
func cString(p *byte, max int) string {
	var b []byte
	for i := 0; i < max; i++ {
		c := *(*byte)(unsafe.Add(unsafe.Pointer(p), i))
		if c == 0 {
			break
		}
		b = append(b, c)
	}
	return string(b)
}

// check returns nil for CUDA_SUCCESS and the *Error for anything else.
func (d *cuDriver) check(s *cuSym, r int32) error {
	if r == cudaSuccess {
		return nil
	}
	return d.error(s, r)
}

// Count returns the number of CUDA devices (cuDeviceGetCount), loading the
// driver on first use. Without a usable driver it returns an error wrapping
// ErrNoDriver. Safe for concurrent use.
func Count() (int, error) {
	d, err := cuLoad()
	if err != nil {
		return 0, err
	}
	var n int32
	if err := d.check(&d.cuDeviceGetCount, d.cuDeviceGetCount.call(uintptr(unsafe.Pointer(&n)))); err != nil {
		return 0, err
	}
	return int(n), nil
}

// DriverVersion returns the CUDA version the driver supports, encoded as
// 1000*major + 10*minor (13000 for CUDA 13.0) (cuDriverGetVersion), loading
// the driver on first use. Without a usable driver it returns an error
// wrapping ErrNoDriver. Safe for concurrent use.
func DriverVersion() (int, error) {
	d, err := cuLoad()
	if err != nil {
		return 0, err
	}
	var v int32
	if err := d.check(&d.cuDriverGetVersion, d.cuDriverGetVersion.call(uintptr(unsafe.Pointer(&v)))); err != nil {
		return 0, err
	}
	return int(v), nil
}

// errCUDAClosed is returned by a Device's methods after Close.
var errCUDAClosed = fmt.Errorf("device: CUDA device is closed: %w", device.ErrInvalidValue)
