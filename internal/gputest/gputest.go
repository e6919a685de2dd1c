// Package gputest opens a CUDA GPU for a test, or skips the test where
// there is none; with TLSF_REQUIRE_GPU=1 a missing GPU fails it instead.
package gputest

import (
	"testing"

	"github.com/gpumem/tlsf/device"
)

// Open returns device ordinal on its primary context (device.CUDA) and
// closes it when the test ends. Where there is no driver or no such device
// it skips tb with the reason, unless TLSF_REQUIRE_GPU=1, when it fails tb;
// any other error fails tb. See device.CUDAOrSkipReason.
func Open(tb testing.TB, ordinal int) *device.CUDADevice {
	tb.Helper()
	d, skip, err := device.CUDAOrSkipReason(ordinal)
	switch {
	case err != nil:
		tb.Fatal(err)
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
