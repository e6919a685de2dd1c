package cuda

// Tests of the CUDA binding that need no GPU: struct layouts, loading
// failures, and the skip-or-fail rule for GPU tests.

import (
	"errors"
	"strings"
	"testing"
	"unsafe"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/devicetest"
)

// TestCUDAStructLayout checks the Go mirrors of the driver's structs
// against cuda.h's layout on LP64 (see cuda_vmm.go).
func TestCUDAStructLayout(t *testing.T) {
	var loc cuMemLocation
	var prop cuMemAllocationProp
	var acc cuMemAccessDesc
	for _, c := range []struct {
		what      string
		got, want uintptr
	}{
		{"sizeof(CUmemLocation)", unsafe.Sizeof(loc), 8},
		{"CUmemLocation.id", unsafe.Offsetof(loc.id), 4},
		{"sizeof(CUmemAllocationProp)", unsafe.Sizeof(prop), 32},
		{"alignof(CUmemAllocationProp)", unsafe.Alignof(prop), 8},
		{"CUmemAllocationProp.requestedHandleTypes", unsafe.Offsetof(prop.requestedHandleTypes), 4},
		{"CUmemAllocationProp.location", unsafe.Offsetof(prop.location), 8},
		{"CUmemAllocationProp.win32HandleMetaData", unsafe.Offsetof(prop.win32HandleMetaData), 16},
		{"CUmemAllocationProp.allocFlags.compressionType", unsafe.Offsetof(prop.compressionType), 24},
		{"CUmemAllocationProp.allocFlags.gpuDirectRDMACapable", unsafe.Offsetof(prop.gpuDirectRDMACapable), 25},
		{"CUmemAllocationProp.allocFlags.usage", unsafe.Offsetof(prop.usage), 26},
		{"CUmemAllocationProp.allocFlags.reserved", unsafe.Offsetof(prop.reserved), 28},
		{"sizeof(CUmemAccessDesc)", unsafe.Sizeof(acc), 12},
		{"alignof(CUmemAccessDesc)", unsafe.Alignof(acc), 4},
		{"CUmemAccessDesc.flags", unsafe.Offsetof(acc.flags), 8},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.what, c.got, c.want)
		}
	}
}

// TestCUDAOpenMissingLibrary: a library that is not there is ErrNoDriver,
// and the message names it and says why dlopen failed.
func TestCUDAOpenMissingLibrary(t *testing.T) {
	const name = "libcuda-not-here.so.1"
	_, err := cuOpen(name)
	if !errors.Is(err, device.ErrNoDriver) {
		t.Fatalf("cuOpen(%q) = %v, want ErrNoDriver", name, err)
	}
	if msg := err.Error(); !strings.Contains(msg, name) || !strings.Contains(msg, "dlopen") {
		t.Errorf("error %q should name %s and dlopen's reason", msg, name)
	}
}

// TestCUDAOpenMissingSymbols: a library without the driver's entry points
// is ErrNoDriver naming them, and nothing is called through a nil pointer.
func TestCUDAOpenMissingSymbols(t *testing.T) {
	const libc = "libc.so.6"
	_, err := cuOpen(libc)
	if err != nil && strings.Contains(err.Error(), "dlopen") {
		t.Skipf("no %s to stand in for a wrong library: %v", libc, err)
	}
	if !errors.Is(err, device.ErrNoDriver) {
		t.Fatalf("cuOpen(%q) = %v, want ErrNoDriver", libc, err)
	}
	for _, sym := range []string{"cuInit", "cuMemAlloc_v2", "cuMemcpyDtoH_v2"} {
		if !strings.Contains(err.Error(), sym) {
			t.Errorf("error %q does not name missing %s", err, sym)
		}
	}
}

// TestCUDANoDriver: without a driver every entry point fails with
// ErrNoDriver naming libcuda.so.1, and nothing crashes or hangs.
func TestCUDANoDriver(t *testing.T) {
	if _, err := cuLoad(); err == nil {
		t.Skip("a CUDA driver is present")
	}
	_, err := Open(0)
	if !errors.Is(err, device.ErrNoDriver) || !strings.Contains(err.Error(), libcudaName) {
		t.Errorf("CUDA(0) = %v, want ErrNoDriver naming %s", err, libcudaName)
	}
	t.Logf("CUDA(0): %v", err)
	if _, err := WithContext(0, 1); !errors.Is(err, device.ErrNoDriver) {
		t.Errorf("WithContext = %v, want ErrNoDriver", err)
	}
	if _, err := Count(); !errors.Is(err, device.ErrNoDriver) {
		t.Errorf("Count = %v, want ErrNoDriver", err)
	}
	if _, err := DriverVersion(); !errors.Is(err, device.ErrNoDriver) {
		t.Errorf("DriverVersion = %v, want ErrNoDriver", err)
	}
}

// TestSkipReason: opening device 0 where there is no GPU skips unless
// TLSF_REQUIRE_GPU=1, which fails; a GPU opens.
func TestSkipReason(t *testing.T) {
	_, loadErr := cuLoad()
	for _, require := range []string{"", "0", "1"} {
		t.Run("TLSF_REQUIRE_GPU="+require, func(t *testing.T) {
			t.Setenv(devicetest.RequireGPUEnv, require)
			d, openErr := Open(0)
			if d != nil {
				defer d.Close()
			}
			skip, err := devicetest.SkipReason(openErr)
			switch {
			case loadErr == nil:
				if d == nil || skip != "" || err != nil {
					t.Errorf("driver loaded but Open = %v, SkipReason = (%q, %v)", openErr, skip, err)
				}
			case require == "1":
				if skip != "" || !errors.Is(err, device.ErrNoDriver) || !strings.Contains(err.Error(), devicetest.RequireGPUEnv) {
					t.Errorf("SkipReason = (%q, %v), want ErrNoDriver naming %s", skip, err, devicetest.RequireGPUEnv)
				}
			default:
				if err != nil || !strings.Contains(skip, libcudaName) {
					t.Errorf("SkipReason = (%q, %v), want the reason naming %s", skip, err, libcudaName)
				}
			}
		})
	}
}

// TestCUDAErrorSentinels: driver codes match the sentinels under errors.Is.
func TestCUDAErrorSentinels(t *testing.T) {
	for _, c := range []struct {
		code int
		name string
		want error // nil: no sentinel
	}{
		{1, "CUDA_ERROR_INVALID_VALUE", device.ErrInvalidValue},
		{2, "CUDA_ERROR_OUT_OF_MEMORY", device.ErrOutOfMemory},
		{3, "CUDA_ERROR_NOT_INITIALIZED", device.ErrNoDriver},
		{34, "CUDA_ERROR_STUB_LIBRARY", device.ErrNoDriver},
		{46, "CUDA_ERROR_DEVICE_UNAVAILABLE", device.ErrNoDevice},
		{100, "CUDA_ERROR_NO_DEVICE", device.ErrNoDevice},
		{101, "CUDA_ERROR_INVALID_DEVICE", device.ErrNoDevice},
		{400, "CUDA_ERROR_INVALID_HANDLE", device.ErrInvalidValue},
		{700, "CUDA_ERROR_ILLEGAL_ADDRESS", device.ErrIllegalAddress},
		{801, "CUDA_ERROR_NOT_SUPPORTED", device.ErrNotSupported},
		{600, "CUDA_ERROR_NOT_READY", nil},
	} {
		err := error(&device.Error{Call: "cuTest", Code: c.code, Name: c.name})
		if got := errors.Unwrap(err); got != c.want {
			t.Errorf("%s (%d) unwraps to %v, want %v", c.name, c.code, got, c.want)
		}
	}
}
