//go:build cgo

package main

/*
#include <stdlib.h>
#include "tlsf.h"
__attribute__((visibility("hidden"))) void tlsf_set_error(const char* msg, size_t n);
__attribute__((visibility("hidden"))) const char* tlsf_getenv(const char* key);
*/
import "C"

import (
	"errors"
	"fmt"
	"math"
	"os"
	"strings"
	"unicode/utf8"
	"unsafe"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/nvtx"
	"github.com/gpumem/tlsf/pool"
)

// The Go side of the entry points in tlsf.c: tlsfgo_X serves tlsf_X, after
// tlsf.c cleared the caller's message and handled what needs no pool.
// Pointers and streams cross as uintptr_t; a failure sets the message
// ("tlsf_X: reason") and returns NULL, -1 or 0.

func init() { envSync = syncEnv }

// envKeys are the environment variables the library reads: the
// configuration, passthrough mode and the NVTX injection.
var envKeys = []string{pool.ConfEnv, pool.PassthroughEnv, nvtx.InjectionEnv, nvtx.DebugEnv, nvtx.SegmentEnv}

// syncEnv copies envKeys from the process's environment (C's getenv) into
// the Go runtime's copy, which dates from when the library was loaded: a
// program that sets TLSF_ALLOC_CONF after loading it (setenv in C,
// os.environ in Python) is read at the first use as tlsf.h says.
//
// Only a key whose value differs is written (os.Setenv writes C's
// environment too, in a cgo build): the host's environment is left as it
// is in the common case, where nothing changed since the library loaded.
func syncEnv() {
	for _, k := range envKeys {
		ck := C.CString(k)
		cv := C.tlsf_getenv(ck)
		C.free(unsafe.Pointer(ck))
		old, had := os.LookupEnv(k)
		switch {
		case cv == nil && had:
			_ = os.Unsetenv(k)
		case cv != nil:
			if v := C.GoString(cv); !had || v != old {
				_ = os.Setenv(k, v)
			}
		}
	}
}

// setError leaves fn's failure as the calling thread's message.
func setError(fn string, err error) {
	msg := clip(fn+": "+err.Error(), C.TLSF_ERROR_MAX-1)
	// The bytes are copied into the thread's buffer before the call returns.
	C.tlsf_set_error((*C.char)(unsafe.Pointer(unsafe.StringData(msg))), C.size_t(len(msg)))
}

// clip cuts msg to at most n bytes at the start of a UTF-8 character, so
// that a message the thread's buffer (TLSF_ERROR_MAX bytes with its NUL)
// cuts short stays valid UTF-8.
func clip(msg string, n int) string {
	if len(msg) <= n {
		return msg
	}
	for n > 0 && !utf8.RuneStart(msg[n]) {
		n--
	}
	return msg[:n]
}

// guard turns a panic in fn (a bug) into a message instead of a crash of
// the process. Deferred first in every entry point.
func guard(fn string) {
	if r := recover(); r != nil {
		setError(fn, fmt.Errorf("internal error, please report: %v", r))
	}
}

//export tlsfgo_malloc
func tlsfgo_malloc(size C.size_t, dev C.int, stream C.uintptr_t) (ptr C.uintptr_t) {
	defer guard("tlsf_malloc")
	p, err := reg.get(int(dev))
	if err == nil {
		var q uintptr
		if q, err = p.AllocOn(uint64(size), device.Stream(stream)); err == nil {
			return C.uintptr_t(q)
		}
	}
	setError("tlsf_malloc", fmt.Errorf("%d bytes on device %d: %w", uint64(size), int(dev), err))
	return 0
}

//export tlsfgo_free
func tlsfgo_free(ptr C.uintptr_t, size C.size_t, dev C.int, stream C.uintptr_t) {
	defer guard("tlsf_free")
	p, err := reg.lookup(int(dev))
	if err == nil && p == nil {
		err = fmt.Errorf("%w: device %d has no pool", pool.ErrUnknownPointer, int(dev))
	}
	if err == nil {
		if err = p.FreeSizedOn(uintptr(ptr), uint64(size), device.Stream(stream)); err == nil {
			return
		}
	}
	if errors.Is(err, pool.ErrUnknownPointer) || errors.Is(err, pool.ErrDoubleFree) {
		if o, ok := reg.owner(uintptr(ptr), int(dev)); ok {
			err = fmt.Errorf("%w; it is a live allocation of device %d's pool", err, o)
		}
	}
	sized := "" // size 0: unknown (tlsf.h)
	if size != 0 {
		sized = fmt.Sprintf(" (%d bytes)", uint64(size))
	}
	setError("tlsf_free", fmt.Errorf("%#x%s on device %d: %w", uintptr(ptr), sized, int(dev), err))
}

//export tlsfgo_init
func tlsfgo_init(deviceCount C.int) {
	defer guard("tlsf_init")
	reg.mu.Lock()
	_, err := reg.confLocked()
	reg.mu.Unlock()
	if err != nil {
		setError("tlsf_init", err)
	}
}

//export tlsfgo_reset
func tlsfgo_reset() {
	defer guard("tlsf_reset")
	var errs []error
	reg.each(func(dev int, p *pool.Pool) {
		if _, err := p.Trim(); err != nil {
			errs = append(errs, fmt.Errorf("device %d: %w", dev, err))
		}
	})
	if err := errors.Join(errs...); err != nil {
		setError("tlsf_reset", err)
	}
}

//export tlsfgo_set_memory_fraction
func tlsfgo_set_memory_fraction(fraction C.double, dev C.int) {
	defer guard("tlsf_set_memory_fraction")
	if err := setMemoryFraction(float64(fraction), int(dev)); err != nil {
		setError("tlsf_set_memory_fraction", fmt.Errorf("fraction %v on device %d: %w", float64(fraction), int(dev), err))
	}
}

// setMemoryFraction caps the pool of dev at f × the device's total memory,
// at least one byte (f = 0 refuses every growth, as in PyTorch), and at
// most the configuration's max_bytes where it set one.
func setMemoryFraction(f float64, dev int) error {
	if math.IsNaN(f) || f < 0 || f > 1 {
		return fmt.Errorf("%w: want a fraction in [0, 1]", pool.ErrBadOptions)
	}
	p, err := reg.get(dev)
	if err != nil {
		return err
	}
	_, total, err := p.Device().MemGetInfo()
	if err != nil {
		return err
	}
	n := max(1, uint64(f*float64(total)))
	if mb := reg.maxBytes(); mb > 0 {
		n = min(n, mb)
	}
	return p.SetMaxBytes(n)
}

//export tlsfgo_record_stream
func tlsfgo_record_stream(ptr C.uintptr_t, stream C.uintptr_t) {
	defer guard("tlsf_record_stream")
	err := fmt.Errorf("%w: no pool has it live", pool.ErrUnknownPointer)
	reg.each(func(_ int, p *pool.Pool) {
		if err == nil {
			return
		}
		if e := p.RecordStream(uintptr(ptr), device.Stream(stream)); e == nil || !errors.Is(e, pool.ErrUnknownPointer) {
			err = e
		}
	})
	if err != nil {
		setError("tlsf_record_stream", fmt.Errorf("%#x on stream %#x: %w", uintptr(ptr), uintptr(stream), err))
	}
}

//export tlsfgo_configure
func tlsfgo_configure(conf *C.char, n C.size_t) (rc C.int) {
	rc = -1 // what a panic (recovered by guard) returns
	defer guard("tlsf_configure")
	if err := reg.configure(C.GoStringN(conf, C.int(min(n, math.MaxInt32)))); err != nil {
		setError("tlsf_configure", err)
		return -1
	}
	return 0
}

//export tlsfgo_get_stats
func tlsfgo_get_stats(dev C.int, out *C.tlsf_stats) (rc C.int) {
	rc = -1
	defer guard("tlsf_get_stats")
	p, err := reg.lookup(int(dev))
	if err != nil {
		setError("tlsf_get_stats", err)
		return -1
	}
	if p == nil {
		return 0 // zeros: no pool yet
	}
	limit, err := p.Cap()
	if err != nil {
		setError("tlsf_get_stats", fmt.Errorf("device %d: %w", int(dev), err))
		return -1
	}
	s := p.Stats()
	out.allocated = C.uint64_t(s.Allocated)
	out.reserved = C.uint64_t(s.Reserved)
	out.active = C.uint64_t(s.Active + s.Cached)
	out.cached = C.uint64_t(s.Cached)
	out.peak_allocated = C.uint64_t(s.AllocatedPeak)
	out.peak_reserved = C.uint64_t(s.ReservedPeak)
	out.num_allocs = C.uint64_t(s.Allocs)
	out.num_frees = C.uint64_t(s.Frees)
	out.num_ooms = C.uint64_t(s.OutOfMemory)
	out.device_calls = C.uint64_t(s.DeviceCalls.Total())
	out.cap = C.uint64_t(limit)
	out.released = C.uint64_t(s.ReleasedBytes)
	for path, c := range s.DeviceCallsByPath {
		out.device_calls_by_path[path] = C.uint64_t(c.Total())
	}
	if s.CachesOn {
		out.caches_on = 1
	}
	return 0
}

// tlsf.h's TLSF_PATH_* are pool.Path's values: a compile error here
// (a negative constant converted to uint) if they drift apart.
const (
	_ = uint(C.TLSF_PATH_OTHER-int(pool.PathOther)) + uint(int(pool.PathOther)-C.TLSF_PATH_OTHER)
	_ = uint(C.TLSF_PATH_SETUP-int(pool.PathSetup)) + uint(int(pool.PathSetup)-C.TLSF_PATH_SETUP)
	_ = uint(C.TLSF_PATH_ALLOC-int(pool.PathAlloc)) + uint(int(pool.PathAlloc)-C.TLSF_PATH_ALLOC)
	_ = uint(C.TLSF_PATH_OUT_OF_MEMORY-int(pool.PathOutOfMemory)) + uint(int(pool.PathOutOfMemory)-C.TLSF_PATH_OUT_OF_MEMORY)
	_ = uint(C.TLSF_PATH_SCAVENGE-int(pool.PathScavenge)) + uint(int(pool.PathScavenge)-C.TLSF_PATH_SCAVENGE)
	_ = uint(C.TLSF_PATH_TRIM-int(pool.PathTrim)) + uint(int(pool.PathTrim)-C.TLSF_PATH_TRIM)
	_ = uint(C.TLSF_NUM_PATHS-int(pool.NumPaths)) + uint(int(pool.NumPaths)-C.TLSF_NUM_PATHS)
)

//export tlsfgo_get_device_calls
func tlsfgo_get_device_calls(dev, path C.int, call *C.char, n C.size_t, out *C.uint64_t) (rc C.int) {
	rc = -1
	defer guard("tlsf_get_device_calls")
	if path < C.TLSF_PATH_ALL || path >= C.TLSF_NUM_PATHS {
		setError("tlsf_get_device_calls", fmt.Errorf("path %d is not a TLSF_PATH_* (0 to %d, or TLSF_PATH_ALL)", int(path), C.TLSF_NUM_PATHS-1))
		return -1
	}
	kind := device.NumCalls // every entry point
	if call != nil {
		name := C.GoStringN(call, C.int(min(n, math.MaxInt32)))
		kind = callNamed(name)
		if kind == device.NumCalls {
			setError("tlsf_get_device_calls", fmt.Errorf("%q is not a driver call this library counts (one of device.Call's entry points, such as cuMemMap, optionally with a _vN suffix: see tlsf.h)", name))
			return -1
		}
	}
	p, err := reg.lookup(int(dev))
	if err != nil {
		setError("tlsf_get_device_calls", err)
		return -1
	}
	var total uint64
	if p != nil {
		s := p.Stats()
		for q, c := range s.DeviceCallsByPath {
			if path != C.TLSF_PATH_ALL && q != int(path) {
				continue
			}
			if kind == device.NumCalls {
				total += c.Total()
			} else {
				total += c[kind]
			}
		}
	}
	*out = C.uint64_t(total)
	return 0
}

// callNamed returns the Call whose entry point is name, or
// device.NumCalls where none is. A versioned symbol, as the driver
// exports it and tools such as nsys show it (cuMemAlloc_v2), names its
// entry point too.
func callNamed(name string) device.Call {
	if i := strings.LastIndex(name, "_v"); i > 0 && i+2 < len(name) && strings.Trim(name[i+2:], "0123456789") == "" {
		name = name[:i]
	}
	for k := range device.NumCalls {
		if k.String() == name {
			return k
		}
	}
	return device.NumCalls
}

//export tlsfgo_trim
func tlsfgo_trim(dev C.int) (n C.size_t) {
	defer guard("tlsf_trim")
	p, err := reg.lookup(int(dev))
	if err == nil && p != nil {
		var released uint64
		if released, err = p.Trim(); err == nil {
			return C.size_t(released)
		}
		err = fmt.Errorf("device %d: %w", int(dev), err)
	}
	if err != nil {
		setError("tlsf_trim", err)
	}
	return 0
}
