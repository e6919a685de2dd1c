package cuda

// Byte fills and a one-byte store kernel, outside Device's core calls.
//
// The entry points below (cuMemsetD8Async, cuModuleLoadData,
// cuModuleGetFunction, cuLaunchKernel) are resolved on first use from the
// driver already loaded, so that a driver lacking them still opens and
// only these methods fail (ErrNotSupported).
//
// StoreByte launches storeByteKernel: hand-written PTX, one thread that
// stores a byte at an address given as a parameter. The driver compiles
// the PTX for the device when the module is loaded (cuModuleLoadData, the
// driver's own JIT: no CUDA toolkit needed), once per context; the
// module stays loaded for the context's life. It exists so that a Go
// program can make the GPU touch memory the way a kernel would, which is
// what compute-sanitizer checks (`tlsf-stress sanitize`).

import (
	"errors"
	"fmt"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/gpumem/tlsf/device"
)

var (
	_ device.ByteSetter = (*Device)(nil)
	_ device.ByteStorer = (*Device)(nil)

	kernelSyms           extSyms
	kernelModules        sync.Map // CUcontext → *kernelModule
	errNoKernelEntry     = fmt.Errorf("%w: the driver lacks cuLaunchKernel or cuModuleLoadData", device.ErrNotSupported)
	errNoMemsetD8Entry   = fmt.Errorf("%w: the driver lacks cuMemsetD8Async", device.ErrNotSupported)
	storeByteKernelEntry = []byte("tlsf_store_byte\x00")
)

// storeByteKernel stores the low byte of val at addr, a generic address
// converted to a global one. PTX ISA 7.0, sm_50: any driver since CUDA 11
// JIT-compiles it for its GPUs. ld/st may name a register wider than the
// access (the PTX ISA's rule for ld, st and cvt), so st.global.u8 takes
// the byte from a 32-bit register.
const storeByteKernel = `.version 7.0
.target sm_50
.address_size 64

.visible .entry tlsf_store_byte(
	.param .u64 tlsf_store_byte_addr,
	.param .u32 tlsf_store_byte_val
)
{
	.reg .b32 %r<2>;
	.reg .b64 %rd<3>;

	ld.param.u64 %rd1, [tlsf_store_byte_addr];
	ld.param.u32 %r1, [tlsf_store_byte_val];
	cvta.to.global.u64 %rd2, %rd1;
	st.global.u8 [%rd2], %r1;
	ret;
}
` + "\x00"

// extSyms are the entry points resolved on first use.
type extSyms struct {
	once                sync.Once
	cuMemsetD8Async     cuSym
	cuModuleLoadData    cuSym
	cuModuleGetFunction cuSym
	cuLaunchKernel      cuSym
}

func (d *Device) ext() *extSyms {
	e := &kernelSyms
	e.once.Do(func() {
		for _, s := range []struct {
			sym  *cuSym
			name string
		}{
			{&e.cuMemsetD8Async, "cuMemsetD8Async"},
			{&e.cuModuleLoadData, "cuModuleLoadData"},
			{&e.cuModuleGetFunction, "cuModuleGetFunction"},
			{&e.cuLaunchKernel, "cuLaunchKernel"},
		} {
			if addr, err := purego.Dlsym(d.drv.lib, s.name); err == nil && addr != 0 {
				*s.sym = cuSym{name: s.name, addr: addr}
			}
		}
	})
	return e
}

// MemsetD8Async sets n bytes at ptr (any alignment) to value, queued on
// stream s (cuMemsetD8Async). n = 0 makes no driver call. Errors:
// ErrNotSupported (no such entry point), ErrInvalidValue for a bad
// pointer, range or stream.
func (d *Device) MemsetD8Async(ptr uintptr, value byte, n uint64, s device.Stream) error {
	if n == 0 {
		return nil
	}
	e := d.ext()
	if e.cuMemsetD8Async.addr == 0 {
		return errNoMemsetD8Entry
	}
	return d.do(device.CallMemsetD8Async, &e.cuMemsetD8Async, ptr, uintptr(value), uintptr(n), uintptr(s))
}

// kernelModule is the store kernel loaded in one context.
type kernelModule struct {
	once sync.Once
	fn   uintptr // CUfunction
	err  error
}

// noCall is the Call index of driver calls that are not counted.
const noCall device.Call = -1

// StoreByte launches a one-thread kernel on stream s that stores value
// at the device address ptr (cuLaunchKernel of a PTX kernel loaded once
// per context with cuModuleLoadData). It returns once the launch is
// queued; a fault of the store (an address not mapped) shows at the next
// synchronization, and leaves the context unusable as any kernel fault
// does. Errors: ErrNotSupported (no such entry points), the *Error of
// loading the module (CUDA_ERROR_INVALID_PTX, …) or of the launch.
func (d *Device) StoreByte(ptr uintptr, value byte, s device.Stream) error {
	// Closed: fail before the module's once, whose error the context's
	// entry would keep (kernelModules).
	if err := d.closedErr(); err != nil {
		return err
	}
	e := d.ext()
	if e.cuModuleLoadData.addr == 0 || e.cuModuleGetFunction.addr == 0 || e.cuLaunchKernel.addr == 0 {
		return errNoKernelEntry
	}
	v, _ := kernelModules.LoadOrStore(d.ctx, &kernelModule{})
	m := v.(*kernelModule)
	m.once.Do(func() { m.fn, m.err = d.loadStoreKernel(e) })
	if m.err != nil {
		if errors.Is(m.err, errCUDAClosed) {
			// This device closed between the check above and the load:
			// its error is no answer for other devices of the context,
			// which load the module again.
			kernelModules.CompareAndDelete(d.ctx, m)
		}
		return m.err
	}
	// cuLaunchKernel reads kernelParams, an array of pointers to each
	// argument, before it returns; params and args are pinned for the
	// call because C reads Go memory that holds Go pointers.
	args := &struct {
		addr uint64
		val  uint32
	}{uint64(ptr), uint32(value)}
	params := &[2]unsafe.Pointer{unsafe.Pointer(&args.addr), unsafe.Pointer(&args.val)}
	var pin runtime.Pinner
	pin.Pin(args)
	pin.Pin(params)
	defer pin.Unpin()
	return d.do(noCall, &e.cuLaunchKernel, m.fn,
		1, 1, 1, // grid
		1, 1, 1, // block
		0, // shared memory bytes
		uintptr(s),
		uintptr(unsafe.Pointer(params)),
		0) // extra
}

// loadStoreKernel loads the PTX module in the device's context and finds
// its entry.
func (d *Device) loadStoreKernel(e *extSyms) (uintptr, error) {
	image := []byte(storeByteKernel)
	var mod, fn uintptr
	var pin runtime.Pinner
	pin.Pin(&image[0])
	defer pin.Unpin()
	if err := d.do(noCall, &e.cuModuleLoadData, uintptr(unsafe.Pointer(&mod)), uintptr(unsafe.Pointer(&image[0]))); err != nil {
		return 0, fmt.Errorf("cuda: loading the store kernel: %w", err)
	}
	if err := d.do(noCall, &e.cuModuleGetFunction, uintptr(unsafe.Pointer(&fn)), mod, uintptr(unsafe.Pointer(&storeByteKernelEntry[0]))); err != nil {
		return 0, fmt.Errorf("cuda: finding the store kernel: %w", err)
	}
	return fn, nil
}

// InContext runs f on the calling goroutine's OS thread with the device's
// context current (cuCtxPushCurrent_v2, then cuCtxPopCurrent_v2 after f),
// for C code that acts on the current context: compute-sanitizer's NVTX
// memory calls refuse a heap ("the object is not ready") when no context
// is current. f must not call the device's Close. Errors: those of
// calls after Close, the *Error of the push or pop.
func (d *Device) InContext(f func()) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return errCUDAClosed
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	drv := d.drv
	if r := drv.cuCtxPushCurrent.call(d.ctx); r != cudaSuccess {
		return drv.error(&drv.cuCtxPushCurrent, r)
	}
	f()
	var popped uintptr
	if r := drv.cuCtxPopCurrent.call(uintptr(unsafe.Pointer(&popped))); r != cudaSuccess {
		return drv.error(&drv.cuCtxPopCurrent, r)
	}
	return nil
}
