package devicetest

import (
	"errors"
	"fmt"
	"os"
	"testing"

	"github.com/gpumem/tlsf/device"
)

// RequireGPUEnv names the environment variable that turns a missing GPU
// from a skipped test into a failed one: set it to 1 where a GPU must be
// present (the GPU CI job, the device machine).
const RequireGPUEnv = "TLSF_REQUIRE_GPU"

// cuResultDeviceUnavailable is CUDA_ERROR_DEVICE_UNAVAILABLE.
const cuResultDeviceUnavailable = 46

// NoGPU reports whether err means there is no GPU to use here: no driver
// (device.ErrNoDriver) or no device at the ordinal (device.ErrNoDevice),
// but not a GPU that is there and unavailable (DeviceUnavailable), which
// device.ErrNoDevice matches too.
func NoGPU(err error) bool {
	if DeviceUnavailable(err) {
		return false
	}
	return errors.Is(err, device.ErrNoDriver) || errors.Is(err, device.ErrNoDevice)
}

// DeviceUnavailable reports whether err is the driver's
// CUDA_ERROR_DEVICE_UNAVAILABLE (46): the GPU exists but cannot be used
// now, typically because another process holds it in exclusive-process
// compute mode.
func DeviceUnavailable(err error) bool {
	var e *device.Error
	return errors.As(err, &e) && e.Code == cuResultDeviceUnavailable
}

// SkipReason decides what a test does with the error of opening a GPU.
// Exactly one of its results is non-empty where err is not nil:
//
//   - skip: why the test should be skipped: err means there is no GPU
//     (NoGPU) and TLSF_REQUIRE_GPU is not 1;
//   - fail: the test should fail: opening failed otherwise (a GPU that
//     is there but unavailable, DeviceUnavailable, included: a busy GPU
//     must not pass for a missing one), or found no GPU while
//     TLSF_REQUIRE_GPU=1.
//
// Both are empty when err is nil. Safe for concurrent use.
func SkipReason(err error) (skip string, fail error) {
	switch {
	case err == nil:
		return "", nil
	case DeviceUnavailable(err):
		return "", fmt.Errorf("the GPU is present but unavailable (CUDA_ERROR_DEVICE_UNAVAILABLE: held by another process in exclusive-process compute mode?): %w", err)
	case !NoGPU(err):
		return "", err
	case os.Getenv(RequireGPUEnv) == "1":
		return "", fmt.Errorf("%s=1 but no GPU: %w", RequireGPUEnv, err)
	}
	return fmt.Sprintf("no CUDA GPU (set %s=1 to fail instead): %v", RequireGPUEnv, err), nil
}

// OpenGPU calls open (e.g. func() (*cuda.Device, error) { return
// cuda.Open(0) }) and returns its device, closed when the test ends.
// Where there is no driver or no such device it skips tb with the reason,
// unless TLSF_REQUIRE_GPU=1, when it fails tb; any other error fails tb,
// a GPU that is there but unavailable (DeviceUnavailable) included.
//
// It takes a function rather than an ordinal so that this package does
// not import the driver binding, whose own tests use it.
func OpenGPU[D device.Device](tb testing.TB, open func() (D, error)) D {
	tb.Helper()
	d, err := open()
	skip, fail := SkipReason(err)
	switch {
	case fail != nil:
		tb.Fatal(fail)
	case skip != "":
		tb.Skip(skip)
	}
	tb.Cleanup(func() {
		if err := d.Close(); err != nil {
			tb.Errorf("closing %v: %v", d, err)
		}
	})
	return d
}
