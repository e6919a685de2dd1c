//go:build cgo

package main

// Go wrappers of the C entry points, so that tests (which cannot use cgo
// themselves) call the library exactly as a C program does: through
// tlsf.c, on the calling OS thread, with its thread-local message.

/*
#include <stddef.h>
#include <stdlib.h>
#include "tlsf.h"

static uintptr_t call_malloc(size_t size, int dev, uintptr_t s) { return (uintptr_t)tlsf_malloc(size, dev, (void*)s); }
static void call_free(uintptr_t ptr, size_t size, int dev, uintptr_t s) { tlsf_free((void*)ptr, size, dev, (void*)s); }
static void call_record_stream(uintptr_t ptr, uintptr_t s) { tlsf_record_stream((void*)ptr, (void*)s); }
static int call_get_stats(int dev, tlsf_stats* out, size_t size) { if (out) out->size = size; return tlsf_get_stats(dev, out); }
static size_t released_offset(void) { return offsetof(tlsf_stats, released); }
static size_t caches_on_offset(void) { return offsetof(tlsf_stats, caches_on); }
*/
import "C"

import "unsafe"

// stats mirrors tlsf_stats for tests.
type stats struct {
	Size                                  uint64
	Allocated, Reserved, Active, Cached   uint64
	PeakAllocated, PeakReserved           uint64
	NumAllocs, NumFrees, NumOOMs, DevCall uint64
	Cap                                   uint64
	Released                              uint64
	ByPath                                [C.TLSF_NUM_PATHS]uint64
	CachesOn                              uint64
}

func callMalloc(size uint64, dev int, s uintptr) uintptr {
	return uintptr(C.call_malloc(C.size_t(size), C.int(dev), C.uintptr_t(s)))
}

func callFree(ptr uintptr, size uint64, dev int, s uintptr) {
	C.call_free(C.uintptr_t(ptr), C.size_t(size), C.int(dev), C.uintptr_t(s))
}

func callInit(n int)                         { C.tlsf_init(C.int(n)) }
func callReset()                             { C.tlsf_reset() }
func callSetMemoryFraction(f float64, d int) { C.tlsf_set_memory_fraction(C.double(f), C.int(d)) }
func callRecordStream(ptr, s uintptr)        { C.call_record_stream(C.uintptr_t(ptr), C.uintptr_t(s)) }
func callTrim(dev int) uint64                { return uint64(C.tlsf_trim(C.int(dev))) }
func lastError() string                      { return C.GoString(C.tlsf_last_error()) }

// callConfigure passes conf, or NULL when null is set.
func callConfigure(conf string, null bool) int {
	if null {
		return int(C.tlsf_configure(nil))
	}
	cs := C.CString(conf)
	defer C.free(unsafe.Pointer(cs))
	return int(C.tlsf_configure(cs))
}

// callGetStats calls tlsf_get_stats with out->size = size (nil out when
// null) and returns the struct, in a buffer larger than the struct so that
// a test sees any byte written past size.
func callGetStats(dev int, size uint64, null bool) (stats, [32]uint64, int) {
	var buf [32]uint64
	for i := range buf {
		buf[i] = 0xdeadbeef
	}
	var out *C.tlsf_stats
	if !null {
		out = (*C.tlsf_stats)(unsafe.Pointer(&buf[0]))
	}
	rc := int(C.call_get_stats(C.int(dev), out, C.size_t(size)))
	s := *(*stats)(unsafe.Pointer(&buf[0]))
	return s, buf, rc
}

// statsSize is sizeof(tlsf_stats).
const statsSize = C.sizeof_tlsf_stats

// statsSizeBefore is sizeof(tlsf_stats) as a caller built against the
// tlsf.h before released and device_calls_by_path knows it.
var statsSizeBefore = uint64(C.released_offset())

// statsSizeBeforeCachesOn is sizeof(tlsf_stats) as a caller built against
// the tlsf.h before caches_on knows it.
var statsSizeBeforeCachesOn = uint64(C.caches_on_offset())

// The TLSF_PATH_* of tlsf.h, for tests.
const (
	pathAll         = C.TLSF_PATH_ALL
	pathSetup       = C.TLSF_PATH_SETUP
	pathAlloc       = C.TLSF_PATH_ALLOC
	pathOutOfMemory = C.TLSF_PATH_OUT_OF_MEMORY
	numPaths        = C.TLSF_NUM_PATHS
)

// callGetDeviceCalls calls tlsf_get_device_calls with call NULL where
// nullCall is set (else name, "" included) and out NULL where nullOut is;
// out starts at sentinel.
func callGetDeviceCalls(dev, path int, name string, nullCall, nullOut bool) (uint64, int) {
	var cs *C.char
	if !nullCall {
		cs = C.CString(name)
		defer C.free(unsafe.Pointer(cs))
	}
	n := C.uint64_t(sentinel)
	out := &n
	if nullOut {
		out = nil
	}
	rc := int(C.tlsf_get_device_calls(C.int(dev), C.int(path), cs, out))
	return uint64(n), rc
}

// sentinel is what callGetDeviceCalls's out holds before the call.
const sentinel = 0xdeadbeef

// callVersion calls tlsf_version, with abi_version NULL where null is set
// (abi then reads -1).
func callVersion(null bool) (string, int, uintptr) {
	abi := C.int(-1)
	out := &abi
	if null {
		out = nil
	}
	s := C.tlsf_version(out)
	return C.GoString(s), int(abi), uintptr(unsafe.Pointer(s))
}

// headerABIVersion is tlsf.h's TLSF_ABI_VERSION.
const headerABIVersion = C.TLSF_ABI_VERSION
