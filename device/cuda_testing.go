package device

// Opening a GPU for tests, shared by every package's tests. It lives here,
// not in a _test.go file, so that other packages' tests can use it too
// (internal/gputest wraps it in a testing.TB helper); it imports no
// "testing", so it costs non-test binaries nothing but these few lines.

import (
	"fmt"
	"os"
)

// RequireGPUEnv names the environment variable that turns a missing GPU
// from a skipped test into a failed one: set it to 1 where a GPU must be
// present (the GPU CI job, the device machine).
const RequireGPUEnv = "TLSF_REQUIRE_GPU"

// CUDAOrSkipReason opens device ordinal with CUDA for a test. Exactly one
// of its results is set:
//
//   - d: the device; the test must Close it.
//   - skip: why the test should be skipped: there is no driver or no such
//     device (errors wrapping ErrNoDriver or ErrNoDevice) and
//     TLSF_REQUIRE_GPU is not 1.
//   - err: the test should fail: CUDA failed otherwise, or found no GPU
//     while TLSF_REQUIRE_GPU=1.
//
// Safe for concurrent use.
func CUDAOrSkipReason(ordinal int) (d *CUDADevice, skip string, err error) {
	d, err = CUDA(ordinal)
	if err == nil {
		return d, "", nil
	}
	if isNoGPU(err) {
		if os.Getenv(RequireGPUEnv) == "1" {
			return nil, "", fmt.Errorf("%s=1 but no GPU: %w", RequireGPUEnv, err)
		}
		return nil, fmt.Sprintf("no CUDA GPU (set %s=1 to fail instead): %v", RequireGPUEnv, err), nil
	}
	return nil, "", err
}
