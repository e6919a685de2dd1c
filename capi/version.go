//go:build cgo

package main

/*
#include <stddef.h>
*/
import "C"

import (
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"unsafe"
)

// abiVersion is the ABI version this library implements: tlsf.h's
// TLSF_ABI_VERSION when it was built (a test checks that they agree).
const abiVersion = 1

// modulePath is the module's path, for a build without build information.
const modulePath = "github.com/gpumem/tlsf"

// versionString is tlsf_version's string (tlsf.h): the module's path and
// version, abi=N, the VCS revision and whether the tree was modified where
// the build recorded them, and the Go toolchain's version, from the build
// information the Go linker embeds (runtime/debug.ReadBuildInfo).
func versionString() string {
	path, version, goVersion := modulePath, "(unknown)", runtime.Version()
	var vcs []string
	if bi, ok := debug.ReadBuildInfo(); ok {
		if bi.Main.Path != "" {
			path, version = bi.Main.Path, bi.Main.Version
		}
		if bi.GoVersion != "" {
			goVersion = bi.GoVersion
		}
		for _, s := range bi.Settings {
			if s.Key == "vcs.revision" || s.Key == "vcs.modified" {
				vcs = append(vcs, s.Key+"="+s.Value)
			}
		}
	}
	if version == "" {
		version = "(unknown)"
	}
	fields := append([]string{path, version, "abi=" + strconv.Itoa(abiVersion)}, vcs...)
	return strings.Join(append(fields, "go="+goVersion), " ")
}

// tlsfgo_version writes versionString into buf (n bytes), cut to fit and
// NUL-terminated. tlsf.c calls it once and keeps the result.
//
//export tlsfgo_version
func tlsfgo_version(buf *C.char, n C.size_t) {
	if buf == nil || n == 0 {
		return
	}
	b := unsafe.Slice((*byte)(unsafe.Pointer(buf)), int(n))
	s := modulePath + " (unknown) abi=" + strconv.Itoa(abiVersion) + " go=" + runtime.Version()
	func() {
		defer func() { _ = recover() }() // a bug: tlsf_version never fails, so the fallback
		s = versionString()
	}()
	k := copy(b[:len(b)-1], s)
	b[k] = 0
}
