package cuda

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime/debug"
	"strings"
	"testing"
)

// TestCUDABuildsWithoutCgo: the module builds, the device package vets and
// its test binary links with CGO_ENABLED=0, i.e. with purego's own C-call
// plumbing and no C toolchain. It needs the go tool and is skipped where
// there is none (the GPU machine runs a prebuilt test binary) and in -short
// mode.
func TestCUDABuildsWithoutCgo(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the go tool; skipped in -short mode")
	}
	gotool, err := exec.LookPath("go")
	if err != nil {
		t.Skip("no go tool on PATH")
	}
	out, err := exec.Command(gotool, "env", "GOMOD").Output()
	gomod := strings.TrimSpace(string(out))
	if err != nil || gomod == "" || gomod == os.DevNull {
		t.Skipf("not inside the module (go env GOMOD = %q, %v)", gomod, err)
	}
	root := filepath.Dir(gomod)
	for _, args := range [][]string{
		{"build", "./..."},
		{"vet", "./device/"},
		{"test", "-c", "-o", filepath.Join(t.TempDir(), "device.test"), "./device/"},
	} {
		cmd := exec.Command(gotool, args...)
		cmd.Dir = root
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("CGO_ENABLED=0 go %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// cgoSetting is the running binary's CGO_ENABLED build setting, for logs.
func cgoSetting() string {
	if bi, ok := debug.ReadBuildInfo(); ok {
		for _, s := range bi.Settings {
			if s.Key == "CGO_ENABLED" {
				return s.Value
			}
		}
	}
	return "unknown"
}
