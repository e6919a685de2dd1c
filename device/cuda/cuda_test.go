package cuda

// GPU tests of Device. Where there is no driver or no GPU they skip,
// unless TLSF_REQUIRE_GPU=1, when they fail (see devicetest.OpenGPU). Build
// and run them on a GPU machine without a Go toolchain with:
//
//	GOOS=linux GOARCH=amd64 CGO_ENABLED=0 go test -c -o bin/cuda.test ./device/cuda
//	TLSF_REQUIRE_GPU=1 ./bin/cuda.test -test.v -test.run CUDA

import (
	"encoding/binary"
	"errors"
	"fmt"
	"runtime"
	"testing"
	"time"
	"unsafe"

	"github.com/ebitengine/purego"
	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/devicetest"
)

// openCUDA opens device 0 for tb and closes it when tb ends, or skips tb
// (fails it with TLSF_REQUIRE_GPU=1) where there is no GPU.
func openCUDA(tb testing.TB) *Device {
	tb.Helper()
	return devicetest.OpenGPU(tb, func() (*Device, error) { return Open(0) })
}

// rawSym resolves a driver entry point the package itself does not use,
// for tests that play the part of other CUDA code in the process.
func rawSym(tb testing.TB, d *Device, name string) *cuSym {
	tb.Helper()
	addr, err := purego.Dlsym(d.drv.lib, name)
	if err != nil || addr == 0 {
		tb.Skipf("driver lacks %s: %v", name, err)
	}
	return &cuSym{name: name, addr: addr}
}

// currentCtx is cuCtxGetCurrent on the calling thread.
func currentCtx(tb testing.TB, d *Device) uintptr {
	tb.Helper()
	get := rawSym(tb, d, "cuCtxGetCurrent")
	var ctx uintptr
	if r := get.call(uintptr(unsafe.Pointer(&ctx))); r != cudaSuccess {
		tb.Fatal(d.drv.error(get, r))
	}
	return ctx
}

// cuReadWords copies n 32-bit words from device address src.
func cuReadWords(tb testing.TB, d device.Device, src uintptr, n int) []uint32 {
	tb.Helper()
	b := make([]byte, 4*n)
	if err := d.MemcpyDtoH(b, src); err != nil {
		tb.Fatalf("MemcpyDtoH(%#x, %d B): %v", src, len(b), err)
	}
	w := make([]uint32, n)
	for i := range w {
		w[i] = binary.LittleEndian.Uint32(b[4*i:])
	}
	return w
}

// cuWantWords fails tb at the first word of got that is not want.
func cuWantWords(tb testing.TB, what string, got []uint32, want uint32) {
	tb.Helper()
	for i, w := range got {
		if w != want {
			tb.Fatalf("%s: word %d = %#x, want %#x", what, i, w, want)
		}
	}
}

func cuMust(tb testing.TB, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
}

func TestCUDAConformance(t *testing.T) {
	devicetest.Run(t, openCUDA(t))
}

func TestCUDAInfo(t *testing.T) {
	d := openCUDA(t)
	n, err := Count()
	cuMust(t, err)
	v, err := DriverVersion()
	cuMust(t, err)
	free, total, err := d.MemGetInfo()
	cuMust(t, err)
	t.Logf("%v: driver CUDA %d.%d, %d device(s), %.1f of %.1f GiB free, VMM %v, texture pitch alignment %d B, test binary CGO_ENABLED=%s",
		d, v/1000, v%1000/10, n, float64(free)/(1<<30), float64(total)/(1<<30), d.VMMSupported(), d.TexturePitchAlignment(), cgoSetting())
	if n < 1 || d.Name() == "" || total == 0 || free > total || d.TexturePitchAlignment() == 0 {
		t.Errorf("implausible: count %d, name %q, free %d, total %d, pitch alignment %d",
			n, d.Name(), free, total, d.TexturePitchAlignment())
	}
	if d.Context() == 0 {
		t.Error("Context() = 0")
	}
	if !d.VMMSupported() {
		return
	}
	g, err := d.AllocationGranularity()
	cuMust(t, err)
	c := d.Counts()
	before := c.Total()
	if g2, err := d.AllocationGranularity(); err != nil || g2 != g {
		t.Errorf("second AllocationGranularity = %d, %v; want the cached %d", g2, err, g)
	}
	c = d.Counts()
	if after := c.Total(); after != before {
		t.Errorf("cached AllocationGranularity made driver calls (%d → %d)", before, after)
	}
	t.Logf("allocation granularity %d B", g)
}

// TestCUDAEveryDevice opens all devices at once: several devices, each on
// its own primary context, in one process.
func TestCUDAEveryDevice(t *testing.T) {
	openCUDA(t)
	n, err := Count()
	cuMust(t, err)
	var devs []*Device
	for i := 0; i < n; i++ {
		d, err := Open(i)
		cuMust(t, err)
		defer d.Close()
		devs = append(devs, d)
	}
	for _, d := range devs {
		p, err := d.MemAlloc(1 << 20)
		cuMust(t, err)
		cuMust(t, d.MemsetD32(p, uint32(d.Ordinal()+1), 1<<18))
		cuWantWords(t, d.String(), cuReadWords(t, d, p, 1<<18), uint32(d.Ordinal()+1))
		cuMust(t, d.MemFree(p))
	}
	for _, bad := range []int{-1, n} {
		if _, err := Open(bad); !errors.Is(err, device.ErrNoDevice) {
			t.Errorf("CUDA(%d) = %v, want ErrNoDevice", bad, err)
		}
	}
}

// TestCUDAErrors: failures carry the versioned entry point and the
// driver's name for the code, and map to the sentinels. (The conformance
// suite covers which sentinel each misuse gives.)
func TestCUDAErrors(t *testing.T) {
	d := openCUDA(t)
	_, err := d.MemAlloc(1 << 50) // 1 PiB
	var e *device.Error
	if !errors.Is(err, device.ErrOutOfMemory) || !errors.As(err, &e) ||
		e.Call != "cuMemAlloc_v2" || e.Name != "CUDA_ERROR_OUT_OF_MEMORY" || e.Code != 2 /* CUDA_ERROR_OUT_OF_MEMORY */ {
		t.Errorf("MemAlloc(1 PiB) = %#v, want *Error{cuMemAlloc_v2, 2, CUDA_ERROR_OUT_OF_MEMORY} matching ErrOutOfMemory", err)
	}
	t.Logf("MemAlloc(1 PiB): %v", err)
	if d.VMMSupported() {
		g, err := d.AllocationGranularity()
		cuMust(t, err)
		_, err = d.MemCreate(1 << 50 / g * g)
		t.Logf("MemCreate(1 PiB): %v (ErrOutOfMemory: %v)", err, errors.Is(err, device.ErrOutOfMemory))
		if err == nil {
			t.Error("MemCreate(1 PiB) succeeded")
		}
	}
	before := d.Counts()[device.CallMemcpyDtoH]
	cuMust(t, d.MemcpyDtoH(nil, 0))
	if d.Counts()[device.CallMemcpyDtoH] != before {
		t.Error("MemcpyDtoH of nothing called the driver")
	}
}

// TestCUDAEventsAcrossStreams: a stream that waits on an event recorded on
// another runs after the work before the record. s1 fills a large buffer
// with 1; s2, after waiting on e, overwrites a small prefix with 2. Without
// the wait the small memset would finish first and be overwritten.
func TestCUDAEventsAcrossStreams(t *testing.T) {
	d := openCUDA(t)
	const size = 1 << 30
	const prefix = 1 << 20
	p, err := d.MemAlloc(size)
	cuMust(t, err)
	defer func() { cuMust(t, d.MemFree(p)) }()
	s1, err := d.StreamCreate()
	cuMust(t, err)
	defer func() { cuMust(t, d.StreamDestroy(s1)) }()
	s2, err := d.StreamCreate()
	cuMust(t, err)
	defer func() { cuMust(t, d.StreamDestroy(s2)) }()
	e, err := d.EventCreate()
	cuMust(t, err)
	defer func() { cuMust(t, d.EventDestroy(e)) }()

	if done, err := d.EventQuery(e); err != nil || !done {
		t.Errorf("EventQuery(never recorded) = %v, %v; want true, nil", done, err)
	}
	cuMust(t, d.MemsetD32Async(p, 1, size/4, s1))
	cuMust(t, d.EventRecord(e, s1))
	done, err := d.EventQuery(e)
	cuMust(t, err)
	t.Logf("EventQuery right after a 1 GiB memset: done=%v", done)
	cuMust(t, d.StreamWaitEvent(s2, e))
	cuMust(t, d.MemsetD32Async(p, 2, prefix/4, s2))
	cuMust(t, d.StreamSynchronize(s2))
	if done, err := d.EventQuery(e); err != nil || !done {
		t.Errorf("EventQuery after s2, which waited on e, is done = %v, %v; want true, nil", done, err)
	}
	cuMust(t, d.EventSynchronize(e))
	cuMust(t, d.StreamSynchronize(s1))
	cuWantWords(t, "prefix written by s2 after the wait", cuReadWords(t, d, p, prefix/4), 2)
	cuWantWords(t, "words after the prefix", cuReadWords(t, d, p+prefix, 1024), 1)
	cuWantWords(t, "end of the buffer", cuReadWords(t, d, p+size-4096, 1024), 1)

	c := d.Counts()
	for _, k := range []device.Call{device.CallStreamCreate, device.CallEventCreate, device.CallEventRecord, device.CallEventQuery, device.CallStreamWaitEvent, device.CallMemsetD32Async} {
		if c[k] == 0 {
			t.Errorf("Counts()[%v] = 0", k)
		}
	}
	t.Logf("counts: %v", c.Map())
}

// TestCUDAWithContext: a context made by other code in the process serves
// WithContext, and neither kind of device disturbs the context stack
// of the caller's thread.
func TestCUDAWithContext(t *testing.T) {
	primary := openCUDA(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()

	if cur := currentCtx(t, primary); cur != 0 {
		t.Skipf("test thread already has context %#x current", cur)
	}
	// Play cgo code that made its own context: cuCtxCreate_v2 makes it
	// and pushes it on this thread.
	create := rawSym(t, primary, "cuCtxCreate_v2")
	destroy := rawSym(t, primary, "cuCtxDestroy_v2")
	var ctx uintptr
	if r := create.call(uintptr(unsafe.Pointer(&ctx)), 0, uintptr(primary.dev)); r != cudaSuccess {
		t.Fatal(primary.drv.error(create, r))
	}
	defer func() {
		if r := destroy.call(ctx); r != cudaSuccess {
			t.Error(primary.drv.error(destroy, r))
		}
	}()
	if ctx == primary.Context() {
		t.Fatal("cuCtxCreate returned the primary context")
	}

	own, err := WithContext(0, ctx)
	cuMust(t, err)
	p, err := own.MemAlloc(1 << 20)
	cuMust(t, err)
	cuMust(t, own.MemsetD32(p, 7, 1<<18))
	cuWantWords(t, "memory of the caller's context", cuReadWords(t, own, p, 1<<18), 7)
	cuMust(t, own.MemFree(p))

	// The caller's context is current; calls of the primary-context device
	// must leave it so.
	q, err := primary.MemAlloc(4096)
	cuMust(t, err)
	cuMust(t, primary.MemFree(q))
	if cur := currentCtx(t, primary); cur != ctx {
		t.Errorf("after primary-context calls, current context = %#x, want the caller's %#x", cur, ctx)
	}
	// With no context current, calls must leave none.
	var popped uintptr
	if r := primary.drv.cuCtxPopCurrent.call(uintptr(unsafe.Pointer(&popped))); r != cudaSuccess || popped != ctx {
		t.Fatalf("pop = %v, %#x", primary.drv.error(&primary.drv.cuCtxPopCurrent, r), popped)
	}
	_, _, err = own.MemGetInfo()
	cuMust(t, err)
	if cur := currentCtx(t, primary); cur != 0 {
		t.Errorf("after calls from a thread with no context, current = %#x, want none", cur)
	}
	cuMust(t, own.Close())
	if _, err := own.MemAlloc(4096); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("MemAlloc after Close = %v, want ErrInvalidValue", err)
	}

	if _, err := WithContext(0, 0); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("WithContext(0, nil) = %v, want ErrInvalidValue", err)
	}
	if n, _ := Count(); n > 1 {
		if _, err := WithContext(1, ctx); !errors.Is(err, device.ErrInvalidValue) {
			t.Errorf("WithContext(1, device 0's context) = %v, want ErrInvalidValue", err)
		}
	}
}

// TestCUDAClose: two devices share the primary context; closing one
// leaves the other working, and a closed device fails cleanly.
func TestCUDAClose(t *testing.T) {
	a := openCUDA(t)
	b, err := Open(0)
	cuMust(t, err)
	if a.Context() != b.Context() {
		t.Errorf("two CUDA(0) have contexts %#x and %#x, want the one primary context", a.Context(), b.Context())
	}
	cuMust(t, b.Close())
	cuMust(t, b.Close())
	if _, err := b.MemAlloc(4096); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("MemAlloc after Close = %v, want ErrInvalidValue", err)
	}
	if _, err := b.EventQuery(0); !errors.Is(err, device.ErrInvalidValue) {
		t.Errorf("EventQuery after Close = %v, want ErrInvalidValue", err)
	}
	p, err := a.MemAlloc(4096)
	cuMust(t, err)
	cuMust(t, a.MemFree(p))
}

// BenchmarkCUDAEventQuery is the cheapest method on a completed event:
// thread lock, push, cuEventQuery, pop.
func BenchmarkCUDAEventQuery(b *testing.B) {
	d := openCUDA(b)
	e, err := d.EventCreate()
	cuMust(b, err)
	defer d.EventDestroy(e)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := d.EventQuery(e); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCUDABareCall is one driver call with no thread lock and no
// context push/pop (cuDriverGetVersion), the floor under every method.
func BenchmarkCUDABareCall(b *testing.B) {
	d := openCUDA(b)
	var v int32
	for b.Loop() {
		d.drv.cuDriverGetVersion.call(uintptr(unsafe.Pointer(&v)))
	}
}

func BenchmarkCUDAMemAllocFree(b *testing.B) {
	d := openCUDA(b)
	b.ReportAllocs()
	for b.Loop() {
		p, err := d.MemAlloc(1 << 20)
		if err != nil {
			b.Fatal(err)
		}
		if err := d.MemFree(p); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCUDAVMMPage times each virtual memory management call of the
// pool's page cycle for one 2 MiB granule: cuMemCreate, cuMemMap,
// cuMemSetAccess, cuMemUnmap, cuMemRelease (metrics in µs per call). The
// simulated device's latency model takes its VMM figures from this.
func BenchmarkCUDAVMMPage(b *testing.B) {
	d := openCUDA(b)
	gran, err := d.AllocationGranularity()
	cuMust(b, err)
	const pages = 64
	va, err := d.AddressReserve(pages*gran, 0)
	cuMust(b, err)
	defer func() { cuMust(b, d.AddressFree(va, pages*gran)) }()
	var t [5]time.Duration
	calls := 0
	for b.Loop() {
		hs := make([]device.MemHandle, pages)
		for i := range hs {
			t0 := time.Now()
			h, err := d.MemCreate(gran)
			cuMust(b, err)
			t1 := time.Now()
			cuMust(b, d.MemMap(va+uintptr(i)*uintptr(gran), gran, h))
			t2 := time.Now()
			cuMust(b, d.MemSetAccess(va+uintptr(i)*uintptr(gran), gran))
			t[0] += t1.Sub(t0)
			t[1] += t2.Sub(t1)
			t[2] += time.Since(t2)
			hs[i] = h
		}
		for i, h := range hs {
			t0 := time.Now()
			cuMust(b, d.MemUnmap(va+uintptr(i)*uintptr(gran), gran))
			t1 := time.Now()
			cuMust(b, d.MemRelease(h))
			t[3] += t1.Sub(t0)
			t[4] += time.Since(t1)
		}
		calls += pages
	}
	for i, name := range []string{"create", "map", "setaccess", "unmap", "release"} {
		b.ReportMetric(float64(t[i].Microseconds())/float64(calls), name+"-µs")
	}
	b.ReportMetric(0, "ns/op")
}

// BenchmarkCUDAVMMHandleSize times the same cycle for 1 GiB of memory in
// handles of 2 MiB to 1 GiB, one mapping each (metrics in µs per 2 MiB
// granule): the driver's cost per handle against its cost per byte, which
// bounds how large the pool's handles should be (pool/vmm.go,
// maxHandlePages).
func BenchmarkCUDAVMMHandleSize(b *testing.B) {
	d := openCUDA(b)
	gran, err := d.AllocationGranularity()
	cuMust(b, err)
	const total = 1 << 30
	for _, size := range []uint64{2 << 20, 128 << 20, 512 << 20, 1 << 30} {
		size = max(size/gran, 1) * gran
		b.Run(fmt.Sprintf("%dMiB", size>>20), func(b *testing.B) {
			va, err := d.AddressReserve(total, 0)
			cuMust(b, err)
			defer func() { cuMust(b, d.AddressFree(va, total)) }()
			n := int(total / size)
			var t [5]time.Duration
			granules := 0
			for b.Loop() {
				hs := make([]device.MemHandle, n)
				for i := range hs {
					at := va + uintptr(uint64(i)*size)
					t0 := time.Now()
					h, err := d.MemCreate(size)
					cuMust(b, err)
					t1 := time.Now()
					cuMust(b, d.MemMap(at, size, h))
					t2 := time.Now()
					cuMust(b, d.MemSetAccess(at, size))
					t[0] += t1.Sub(t0)
					t[1] += t2.Sub(t1)
					t[2] += time.Since(t2)
					hs[i] = h
				}
				for i, h := range hs {
					at := va + uintptr(uint64(i)*size)
					t0 := time.Now()
					cuMust(b, d.MemUnmap(at, size))
					t1 := time.Now()
					cuMust(b, d.MemRelease(h))
					t[3] += t1.Sub(t0)
					t[4] += time.Since(t1)
				}
				granules += int(total / gran)
			}
			for i, name := range []string{"create", "map", "setaccess", "unmap", "release"} {
				b.ReportMetric(float64(t[i].Nanoseconds())/1e3/float64(granules), name+"-µs/2MiB")
			}
			b.ReportMetric(0, "ns/op")
		})
	}
}
