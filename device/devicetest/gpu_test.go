package devicetest

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/device"
)

// A GPU that is there but unavailable (CUDA_ERROR_DEVICE_UNAVAILABLE,
// which device.ErrNoDevice matches) fails the test, rather than skip it as
// a missing GPU; a missing driver or device skips it unless
// TLSF_REQUIRE_GPU=1.
func TestSkipReasonTellsABusyGPUFromAMissingOne(t *testing.T) {
	busy := fmt.Errorf("opening: %w", &device.Error{Call: "cuDevicePrimaryCtxRetain", Code: 46, Name: "CUDA_ERROR_DEVICE_UNAVAILABLE"})
	missing := fmt.Errorf("device: CUDA ordinal 3: %w", &device.Error{Call: "cuDeviceGet", Code: 101, Name: "CUDA_ERROR_INVALID_DEVICE"})
	noDriver := fmt.Errorf("dlopen libcuda.so.1: %w", device.ErrNoDriver)
	other := &device.Error{Call: "cuDevicePrimaryCtxRetain", Code: 999, Name: "CUDA_ERROR_UNKNOWN"}
	if !errors.Is(busy, device.ErrNoDevice) {
		t.Fatalf("%v does not match ErrNoDevice: the case this test is about is gone", busy)
	}
	for _, require := range []string{"", "1"} {
		t.Run("TLSF_REQUIRE_GPU="+require, func(t *testing.T) {
			t.Setenv(RequireGPUEnv, require)
			cases := []struct {
				name     string
				err      error
				skip     bool
				failText string
			}{
				{"nil", nil, false, ""},
				{"busy", busy, false, "unavailable"},
				{"missing device", missing, require != "1", RequireGPUEnv},
				{"no driver", noDriver, require != "1", RequireGPUEnv},
				{"other", other, false, "CUDA_ERROR_UNKNOWN"},
			}
			for _, c := range cases {
				skip, fail := SkipReason(c.err)
				switch {
				case c.err == nil:
					if skip != "" || fail != nil {
						t.Errorf("%s: SkipReason = %q, %v, want neither", c.name, skip, fail)
					}
				case c.skip:
					if skip == "" || fail != nil {
						t.Errorf("%s: SkipReason = %q, %v, want a skip", c.name, skip, fail)
					}
				default:
					if skip != "" || fail == nil || !errors.Is(fail, c.err) || !strings.Contains(fail.Error(), c.failText) {
						t.Errorf("%s: SkipReason = %q, %v, want a failure wrapping the error and naming %q", c.name, skip, fail, c.failText)
					}
				}
			}
			if NoGPU(busy) || !DeviceUnavailable(busy) || DeviceUnavailable(missing) || !NoGPU(missing) || !NoGPU(noDriver) {
				t.Errorf("NoGPU/DeviceUnavailable misclassify: busy %v/%v, missing %v/%v, no driver %v",
					NoGPU(busy), DeviceUnavailable(busy), NoGPU(missing), DeviceUnavailable(missing), NoGPU(noDriver))
			}
		})
	}
}
