package cuda

// Device: the Device interface over the CUDA driver API.
//
// # Contexts and threads
//
// The driver keeps a stack of current contexts per OS thread, and every
// call below acts on the context at the top of the calling thread's stack.
// Goroutines move between OS threads, and the thread a goroutine runs on
// may already have a context current that belongs to someone else: cgo
// code, gorgonia.org/cu, or another Device. So every method
//
//  1. locks its goroutine to its OS thread (runtime.LockOSThread; nested
//     locks are counted, so a caller's own lock survives),
//  2. pushes the device's context (cuCtxPushCurrent_v2),
//  3. makes the one driver call,
//  4. pops the context again (cuCtxPopCurrent_v2) and unlocks.
//
// Push/pop rather than set-and-restore, because it is both cheaper and
// exact. Set-and-restore costs cuCtxGetCurrent + cuCtxSetCurrent + the call
// + cuCtxSetCurrent, four C calls whenever the thread's current context is
// not ours, which on Go's shared runtime threads is the usual case; push/pop
// costs three every time, and it leaves the thread's whole context stack as
// it found it, empty or not. Measured on an H200 host (driver 580): a bare
// driver call 0.17 µs, a whole method (lock, push, cuEventQuery, pop)
// 1.17 µs (BenchmarkCUDABareCall, BenchmarkCUDAEventQuery). The only
// cheaper scheme, making our context current and leaving it there, leaks it
// onto runtime threads that other goroutines' cgo code then runs on, and a
// primary context released by Close while still current on such a thread
// turns that code's calls into CUDA_ERROR_CONTEXT_IS_DESTROYED. The pool
// keeps driver calls off its fast path, so ≈ 1 µs per call is the
// right price for never disturbing a caller's thread.
//
// # Ownership
//
// Open retains the device's primary context (cuDevicePrimaryCtxRetain),
// the context the CUDA runtime and most libraries share; Close releases
// that reference (cuDevicePrimaryCtxRelease_v2). The primary context is one
// per device per process, so two Devices for one ordinal share it, and
// devices of different ordinals are used side by side, each call pushing
// its own. WithContext borrows a context the caller made; Close then
// leaves it alone. Close frees no memory, streams or events: they belong to
// the context, and the caller frees them before the context goes.
//
// # Concurrency
//
// The driver is thread-safe and every method may be called from any number
// of goroutines. Methods hold a read lock that Close takes for writing, so
// Close waits for calls in flight and later calls fail instead of using a
// released context.

import (
	"errors"
	"fmt"
	"math"
	"runtime"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/gpumem/tlsf/device"
)

// Device is one GPU driven through the CUDA driver API (libcuda.so.1,
// loaded at run time with purego). It implements Device; device pointers
// are CUdeviceptr values and sizes are bytes.
//
// All methods are safe for concurrent use. Each runs on a locked OS thread
// with the device's context pushed for the duration of its one driver call
// (see the file comment for why, and the cost: three C calls, ≈ 1.2 µs).
// After Close every method that calls the driver fails with an error
// wrapping ErrInvalidValue.
type Device struct {
	drv     *cuDriver
	ordinal int
	dev     int32   // CUdevice
	ctx     uintptr // CUcontext
	owned   bool    // ctx is the primary context, retained by Open

	// Attributes read once when the device is opened.
	name       string
	vmm        bool
	pitchAlign uint64

	gran atomic.Uint64 // AllocationGranularity once known; 0 before

	memPoolOnce sync.Once // finds the default memory pool (cuda_async.go)
	memPool     uintptr   // CUmemoryPool; valid when memPoolErr is nil
	memPoolErr  error

	counts [device.NumCalls]atomic.Uint64

	peerMu  sync.Mutex        // guards peerCtx
	peerCtx map[int32]uintptr // primary contexts of peers, retained by EnablePeerAccess until Close (cuda_peer.go)

	mu     sync.RWMutex // read-held by each driver call, write-held by Close
	closed bool
}

var _ device.Device = (*Device)(nil)

// Open opens device ordinal (0-based) on its primary context, retained
// with cuDevicePrimaryCtxRetain and released by Close. It loads and
// initialises the driver on first use.
//
// Errors: ErrNoDriver when libcuda.so.1 cannot be loaded, lacks an entry
// point, or cuInit fails (the message names the library and the reason);
// ErrNoDevice when no device has that ordinal; otherwise the *Error of the
// failing driver call. Safe for concurrent use.
func Open(ordinal int) (*Device, error) {
	drv, dev, err := cuDeviceAt(ordinal)
	if err != nil {
		return nil, err
	}
	var ctx uintptr
	if r := drv.cuDevicePrimaryCtxRetain.call(uintptr(unsafe.Pointer(&ctx)), uintptr(dev)); r != cudaSuccess {
		return nil, drv.error(&drv.cuDevicePrimaryCtxRetain, r)
	}
	d, err := newDevice(drv, ordinal, dev, ctx, true)
	if err != nil {
		drv.cuDevicePrimaryCtxRelease.call(uintptr(dev))
		return nil, err
	}
	return d, nil
}

// WithContext opens device ordinal on ctx, a CUcontext the caller made
// (with cgo, gorgonia.org/cu or any other binding) and keeps alive until
// after Close; Close does not destroy it. The context must belong to
// device ordinal: WithContext checks with cuCtxGetDevice.
//
// Errors: as for Open, and ErrInvalidValue when ctx is 0 or belongs to
// another device. Safe for concurrent use.
func WithContext(ordinal int, ctx uintptr) (*Device, error) {
	drv, dev, err := cuDeviceAt(ordinal)
	if err != nil {
		return nil, err
	}
	if ctx == 0 {
		return nil, fmt.Errorf("cuda: WithContext(%d): nil context: %w", ordinal, device.ErrInvalidValue)
	}
	d, err := newDevice(drv, ordinal, dev, ctx, false)
	if err != nil {
		return nil, err
	}
	var ctxDev int32
	if err := d.do(callInternal, &drv.cuCtxGetDevice, uintptr(unsafe.Pointer(&ctxDev))); err != nil {
		return nil, err
	}
	if ctxDev != dev {
		return nil, fmt.Errorf("cuda: WithContext(%d): context belongs to CUdevice %d, not %d: %w",
			ordinal, ctxDev, dev, device.ErrInvalidValue)
	}
	return d, nil
}

// cuDeviceAt loads the driver and returns the CUdevice for ordinal
// (cuDeviceGet).
func cuDeviceAt(ordinal int) (*cuDriver, int32, error) {
	drv, err := cuLoad()
	if err != nil {
		return nil, 0, err
	}
	if ordinal < 0 || ordinal > math.MaxInt32 {
		return nil, 0, fmt.Errorf("device: CUDA ordinal %d: %w", ordinal, device.ErrNoDevice)
	}
	var dev int32
	if r := drv.cuDeviceGet.call(uintptr(unsafe.Pointer(&dev)), uintptr(ordinal)); r != cudaSuccess {
		return nil, 0, fmt.Errorf("device: CUDA ordinal %d: %w", ordinal, drv.error(&drv.cuDeviceGet, r))
	}
	return drv, dev, nil
}

// newDevice reads the attributes the Device methods report without a
// driver call (cuDeviceGetName, cuDeviceGetAttribute; neither needs a
// context).
func newDevice(drv *cuDriver, ordinal int, dev int32, ctx uintptr, owned bool) (*Device, error) {
	d := &Device{drv: drv, ordinal: ordinal, dev: dev, ctx: ctx, owned: owned}
	var buf [cuDeviceNameBufferBytes]byte
	if r := drv.cuDeviceGetName.call(uintptr(unsafe.Pointer(&buf[0])), uintptr(len(buf)), uintptr(dev)); r != cudaSuccess {
		return nil, drv.error(&drv.cuDeviceGetName, r)
	}
	d.name = cString(&buf[0], len(buf))
	vmm, err := d.attribute(cuAttrVMMSupported)
	if err != nil {
		return nil, err
	}
	d.vmm = vmm != 0
	pitch, err := d.attribute(cuAttrTexturePitchAlign)
	if err != nil {
		return nil, err
	}
	d.pitchAlign = uint64(pitch)
	return d, nil
}

// attribute is cuDeviceGetAttribute(attr) for this device.
func (d *Device) attribute(attr int) (int32, error) {
	var v int32
	r := d.drv.cuDeviceGetAttribute.call(uintptr(unsafe.Pointer(&v)), uintptr(attr), uintptr(d.dev))
	return v, d.drv.check(&d.drv.cuDeviceGetAttribute, r)
}

// callInternal marks driver calls made for the package's own bookkeeping;
// they are not counted.
const callInternal device.Call = -1

// exec makes one driver call s(args...) on a locked OS thread with d's
// context pushed, and returns its CUresult. err is non-nil when d is closed
// or the context could not be pushed or popped; then r is meaningless
// unless the call was made. Pointer arguments follow cuSym.call's rule.
//
//go:uintptrescapes
func (d *Device) exec(c device.Call, s *cuSym, args ...uintptr) (r int32, err error) {
	return d.execOn(d.ctx, c, s, args...)
}

// execOn is exec with context ctx pushed instead of d's own (a peer's,
// for cuCtxEnablePeerAccess).
//
//go:uintptrescapes
func (d *Device) execOn(ctx uintptr, c device.Call, s *cuSym, args ...uintptr) (r int32, err error) {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return cudaSuccess, errCUDAClosed
	}
	if c >= 0 {
		d.counts[c].Add(1)
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	drv := d.drv
	if pr := drv.cuCtxPushCurrent.call(ctx); pr != cudaSuccess {
		return cudaSuccess, drv.error(&drv.cuCtxPushCurrent, pr)
	}
	r = s.call(args...)
	var popped uintptr
	if pr := drv.cuCtxPopCurrent.call(uintptr(unsafe.Pointer(&popped))); pr != cudaSuccess {
		return r, drv.error(&drv.cuCtxPopCurrent, pr)
	}
	return r, nil
}

// do is exec with the call's CUresult turned into an *Error.
//
//go:uintptrescapes
func (d *Device) do(c device.Call, s *cuSym, args ...uintptr) error {
	r, err := d.exec(c, s, args...)
	if r != cudaSuccess {
		return errors.Join(d.drv.error(s, r), err)
	}
	return err
}

// Ordinal returns the device's index among the driver's devices (0-based).
func (d *Device) Ordinal() int { return d.ordinal }

// Name returns the device's name (cuDeviceGetName, read when opened), e.g.
// "NVIDIA H200".
func (d *Device) Name() string { return d.name }

// Context returns the CUcontext the device's calls run in, for use with
// other bindings. It stays valid until Close (primary context) or for as
// long as its owner keeps it (WithContext).
func (d *Device) Context() uintptr { return d.ctx }

// Counts returns how many driver calls of each kind the device's methods
// have made (calls that failed included, calls after Close excluded).
// Safe for concurrent use; the counts are read one by one, not as a
// snapshot.
func (d *Device) Counts() device.Counts {
	var c device.Counts
	for k := range d.counts {
		c[k] = d.counts[k].Load()
	}
	return c
}

// VMMSupported reports whether the device supports virtual memory
// management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, read
// when opened).
func (d *Device) VMMSupported() bool { return d.vmm }

// TexturePitchAlignment returns the pitch alignment in bytes for textures
// bound to pitched memory (CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT,
// read when opened; 32 on Hopper). MemAllocPitch rounds pitches to a larger
// multiple (512 bytes).
func (d *Device) TexturePitchAlignment() uint64 { return d.pitchAlign }

// MemGetInfo returns the free and total device memory in bytes
// (cuMemGetInfo_v2). Errors: the *Error of the call.
func (d *Device) MemGetInfo() (free, total uint64, err error) {
	var f, t uintptr // size_t
	err = d.do(device.CallMemGetInfo, &d.drv.cuMemGetInfo, uintptr(unsafe.Pointer(&f)), uintptr(unsafe.Pointer(&t)))
	return uint64(f), uint64(t), err
}

// MemAlloc allocates size bytes of linear device memory (cuMemAlloc_v2),
// aligned to at least 256 bytes. Errors: ErrInvalidValue for size 0,
// ErrOutOfMemory when the device cannot satisfy the request.
func (d *Device) MemAlloc(size uint64) (uintptr, error) {
	var p uintptr // CUdeviceptr
	err := d.do(device.CallMemAlloc, &d.drv.cuMemAlloc, uintptr(unsafe.Pointer(&p)), uintptr(size))
	return p, err
}

// MemFree frees memory from MemAlloc or MemAllocPitch (cuMemFree_v2); the
// driver waits for work using it to finish. Errors: ErrInvalidValue for a
// pointer the driver did not allocate.
func (d *Device) MemFree(ptr uintptr) error {
	return d.do(device.CallMemFree, &d.drv.cuMemFree, ptr)
}

// MemAllocPitch allocates height rows of at least widthBytes bytes each
// (cuMemAllocPitch_v2) and returns the pointer and the row pitch in bytes,
// a multiple of 512 on current GPUs (4 → 512, 2052 → 2560). elementSize is
// 4, 8 or 16 bytes. Errors: ErrInvalidValue for a zero width or height or
// another element size, ErrOutOfMemory.
func (d *Device) MemAllocPitch(widthBytes, height uint64, elementSize uint32) (ptr uintptr, pitch uint64, err error) {
	var p, pt uintptr // CUdeviceptr, size_t
	err = d.do(device.CallMemAllocPitch, &d.drv.cuMemAllocPitch,
		uintptr(unsafe.Pointer(&p)), uintptr(unsafe.Pointer(&pt)),
		uintptr(widthBytes), uintptr(height), uintptr(elementSize))
	return p, uint64(pt), err
}

// StreamCreate creates a stream that does not synchronise with the legacy
// default stream (cuStreamCreate, CU_STREAM_NON_BLOCKING).
func (d *Device) StreamCreate() (device.Stream, error) {
	var s uintptr // CUstream
	err := d.do(device.CallStreamCreate, &d.drv.cuStreamCreate, uintptr(unsafe.Pointer(&s)), cuStreamNonBlocking)
	return device.Stream(s), err
}

// StreamDestroy destroys s once its queued work is done
// (cuStreamDestroy_v2); the call itself does not wait.
func (d *Device) StreamDestroy(s device.Stream) error {
	return d.do(device.CallStreamDestroy, &d.drv.cuStreamDestroy, uintptr(s))
}

// StreamSynchronize waits until all work queued on s is done
// (cuStreamSynchronize). Errors include those of earlier asynchronous work.
func (d *Device) StreamSynchronize(s device.Stream) error {
	return d.do(device.CallStreamSynchronize, &d.drv.cuStreamSynchronize, uintptr(s))
}

// StreamWaitEvent makes work queued on s after this call wait until the
// work before e's last record is done (cuStreamWaitEvent, flags 0). It
// does not block the host.
func (d *Device) StreamWaitEvent(s device.Stream, e device.Event) error {
	return d.do(device.CallStreamWaitEvent, &d.drv.cuStreamWaitEvent, uintptr(s), uintptr(e), 0)
}

// EventCreate creates an event with timing disabled (cuEventCreate,
// CU_EVENT_DISABLE_TIMING), the cheapest kind to record and query.
func (d *Device) EventCreate() (device.Event, error) {
	var e uintptr // CUevent
	err := d.do(device.CallEventCreate, &d.drv.cuEventCreate, uintptr(unsafe.Pointer(&e)), cuEventDisableTiming)
	return device.Event(e), err
}

// EventDestroy destroys e (cuEventDestroy_v2); a pending record completes
// regardless.
func (d *Device) EventDestroy(e device.Event) error {
	return d.do(device.CallEventDestroy, &d.drv.cuEventDestroy, uintptr(e))
}

// EventRecord records e on s (cuEventRecord): e completes when the work
// queued on s before this call is done.
func (d *Device) EventRecord(e device.Event, s device.Stream) error {
	return d.do(device.CallEventRecord, &d.drv.cuEventRecord, uintptr(e), uintptr(s))
}

// EventQuery reports whether the work before e's last record is done
// (cuEventQuery): CUDA_SUCCESS gives true, CUDA_ERROR_NOT_READY gives
// false and no error. An event never recorded is done.
func (d *Device) EventQuery(e device.Event) (done bool, err error) {
	r, err := d.exec(device.CallEventQuery, &d.drv.cuEventQuery, uintptr(e))
	switch {
	case err != nil && r == cudaSuccess:
		return false, err
	case r == cudaSuccess:
		return true, nil
	case r == cuResultNotReady:
		return false, err
	}
	return false, errors.Join(d.drv.error(&d.drv.cuEventQuery, r), err)
}

// EventSynchronize blocks the calling goroutine (and its OS thread) until
// the work before e's last record is done (cuEventSynchronize).
func (d *Device) EventSynchronize(e device.Event) error {
	return d.do(device.CallEventSynchronize, &d.drv.cuEventSynchronize, uintptr(e))
}

// MemsetD32 sets n 32-bit words at ptr to value (cuMemsetD32_v2); ptr must
// be 4-byte aligned. It is ordered on the legacy default stream and, for
// device memory, may return before the memset is done. Errors:
// ErrInvalidValue for a bad pointer or range.
func (d *Device) MemsetD32(ptr uintptr, value uint32, n uint64) error {
	return d.do(device.CallMemsetD32, &d.drv.cuMemsetD32, ptr, uintptr(value), uintptr(n))
}

// MemsetD32Async is MemsetD32 queued on stream s (cuMemsetD32Async).
func (d *Device) MemsetD32Async(ptr uintptr, value uint32, n uint64, s device.Stream) error {
	return d.do(device.CallMemsetD32Async, &d.drv.cuMemsetD32Async, ptr, uintptr(value), uintptr(n), uintptr(s))
}

// MemcpyDtoH copies len(dst) bytes from device address src into dst
// (cuMemcpyDtoH_v2). The copy is ordered on the legacy default stream, so
// it waits for earlier work there but not for work on non-blocking
// streams; it returns once dst holds the data. An empty dst makes no
// driver call. Errors: ErrInvalidValue for a bad source range.
func (d *Device) MemcpyDtoH(dst []byte, src uintptr) error {
	if len(dst) == 0 {
		return nil
	}
	// dst is Go memory that C writes into. go:uintptrescapes on the call
	// chain keeps it on the heap and alive until the call returns; pinning
	// it as well states the contract the cgo rules ask for, and holds
	// should the driver ever keep the pointer past the call (it does not:
	// copies to pageable memory complete before cuMemcpyDtoH returns).
	var pin runtime.Pinner
	pin.Pin(&dst[0])
	defer pin.Unpin()
	return d.do(device.CallMemcpyDtoH, &d.drv.cuMemcpyDtoH, uintptr(unsafe.Pointer(&dst[0])), src, uintptr(len(dst)))
}

// Close releases the primary context retained by Open
// (cuDevicePrimaryCtxRelease_v2; for WithContext it releases none) and
// the peers' primary contexts EnablePeerAccess retained. It waits for
// method calls in flight; later calls that would call the driver fail
// with an error wrapping ErrInvalidValue. Memory, streams and events the
// caller made are not freed; when the last reference to the primary
// context goes, the driver destroys it and them. A second Close returns
// nil. Errors: the *Error of each release that failed (errors.Join).
func (d *Device) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil
	}
	d.closed = true
	errs := d.releasePeers()
	if !d.owned {
		return errs
	}
	return errors.Join(errs, d.drv.check(&d.drv.cuDevicePrimaryCtxRelease, d.drv.cuDevicePrimaryCtxRelease.call(uintptr(d.dev))))
}

// String describes the device, e.g. `CUDA device 0 "NVIDIA H200"`.
func (d *Device) String() string {
	return fmt.Sprintf("CUDA device %d %q", d.ordinal, d.name)
}
