//go:build cgo

// The C side of the ABI: each entry point clears the calling thread's
// message and calls the Go side (capi.go), which sets a message on failure
// with tlsf_set_error. The message lives in a thread-local buffer, so it is
// per OS thread, costs no allocation and can never leak.

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "tlsf.h"
#include "_cgo_export.h"

static __thread char tlsf_errbuf[TLSF_ERROR_MAX];

/* The environment as the process has it now, for capi.go's envSync: the
 * Go runtime's copy dates from when the library was loaded. */
__attribute__((visibility("hidden"))) const char* tlsf_getenv(const char* key) { return getenv(key); }

/* Internal (capi.go calls it): hidden, so that no build of the shared
 * library exports it (make capi's version script, capi/exports.map,
 * exports only the functions tlsf.h declares). */
__attribute__((visibility("hidden"))) void tlsf_set_error(const char* msg, size_t n) {
	if (msg == NULL) {
		n = 0;
	}
	if (n >= TLSF_ERROR_MAX) {
		n = TLSF_ERROR_MAX - 1;
	}
	if (n > 0) {
		memcpy(tlsf_errbuf, msg, n);
	}
	tlsf_errbuf[n] = 0;
}

const char* tlsf_last_error(void) { return tlsf_errbuf; }

/* A child made by fork() has only the thread that called fork: the Go
 * runtime's threads are gone, and a call into the Go side may wait for
 * them for ever (a C user's trial, 2026-12-07: 63 of 100 children hung
 * where the parent allocated on two threads, 1 of 100 where it never
 * called the library). So an atfork handler marks the child, and every
 * entry point there fails with a message instead, never entering Go.
 * Registered when the library is loaded; the library is never unloaded
 * (the Go runtime links it NODELETE), so the handler stays valid. */
static volatile int tlsf_forked;

static void tlsf_mark_child(void) { tlsf_forked = 1; }

__attribute__((constructor)) static void tlsf_watch_fork(void) { pthread_atfork(NULL, NULL, tlsf_mark_child); }

/* in_child clears the thread's message and, in a forked child, sets it
 * and returns 1. */
static int in_child(const char* fn) {
	tlsf_errbuf[0] = 0;
	if (!tlsf_forked) {
		return 0;
	}
	static const char msg[] = ": called in a child made by fork(), where neither this library nor the CUDA driver works: exec a new program first (Python: the \"spawn\" start method)";
	size_t n = strlen(fn);
	char buf[TLSF_ERROR_MAX];
	if (n + sizeof msg > sizeof buf) {
		n = 0;
	}
	memcpy(buf, fn, n);
	memcpy(buf + n, msg, sizeof msg);
	tlsf_set_error(buf, n + sizeof msg - 1);
	return 1;
}

void* tlsf_malloc(size_t size, int device, void* stream) {
	if (in_child("tlsf_malloc")) {
		return NULL;
	}
	if (size == 0) {
		return NULL; // as cudaMalloc and PyTorch's allocator: no memory, no error
	}
	return (void*)tlsfgo_malloc(size, device, (uintptr_t)stream);
}

void tlsf_free(void* ptr, size_t size, int device, void* stream) {
	if (in_child("tlsf_free")) {
		return;
	}
	if (ptr == NULL) {
		return;
	}
	tlsfgo_free((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

void tlsf_init(int device_count) {
	if (in_child("tlsf_init")) {
		return;
	}
	tlsfgo_init(device_count);
}

void tlsf_reset(void) {
	if (in_child("tlsf_reset")) {
		return;
	}
	tlsfgo_reset();
}

void tlsf_set_memory_fraction(double fraction, int device) {
	if (in_child("tlsf_set_memory_fraction")) {
		return;
	}
	tlsfgo_set_memory_fraction(fraction, device);
}

void tlsf_record_stream(void* ptr, void* stream) {
	if (in_child("tlsf_record_stream")) {
		return;
	}
	tlsfgo_record_stream((uintptr_t)ptr, (uintptr_t)stream);
}

int tlsf_configure(const char* conf) {
	if (in_child("tlsf_configure")) {
		return -1;
	}
	if (conf == NULL) {
		static const char msg[] = "tlsf_configure: conf is NULL";
		tlsf_set_error(msg, sizeof msg - 1);
		return -1;
	}
	return tlsfgo_configure((char*)conf, strlen(conf));
}

int tlsf_get_stats(int device, tlsf_stats* out) {
	if (in_child("tlsf_get_stats")) {
		return -1;
	}
	if (out == NULL) {
		static const char msg[] = "tlsf_get_stats: out is NULL";
		tlsf_set_error(msg, sizeof msg - 1);
		return -1;
	}
	if (out->size < sizeof(size_t)) {
		static const char msg[] = "tlsf_get_stats: out->size is below sizeof(size_t): set it to sizeof(tlsf_stats)";
		tlsf_set_error(msg, sizeof msg - 1);
		return -1;
	}
	tlsf_stats s;
	memset(&s, 0, sizeof s);
	if (tlsfgo_get_stats(device, &s) != 0) {
		return -1;
	}
	size_t n = out->size < sizeof s ? out->size : sizeof s;
	if (n >= sizeof(uint64_t)) {
		n -= n % sizeof(uint64_t); /* whole fields only */
	}
	s.size = n;
	memcpy(out, &s, n);
	return 0;
}

int tlsf_get_device_calls(int device, int path, const char* call, uint64_t* out) {
	if (in_child("tlsf_get_device_calls")) {
		return -1;
	}
	if (out == NULL) {
		static const char msg[] = "tlsf_get_device_calls: out is NULL";
		tlsf_set_error(msg, sizeof msg - 1);
		return -1;
	}
	return tlsfgo_get_device_calls(device, path, (char*)call, call == NULL ? 0 : strlen(call), out);
}

size_t tlsf_trim(int device) {
	if (in_child("tlsf_trim")) {
		return 0;
	}
	return tlsfgo_trim(device);
}

/* tlsf_version's string: read from the Go side once (pthread_once), then
 * served from here. tlsf_ver_ready, set with release order once the buffer
 * is whole, lets a forked child use the parent's copy without the once
 * (whose state a fork in the middle of the call would leave locked). */
static char tlsf_verbuf[512];
static pthread_once_t tlsf_ver_once = PTHREAD_ONCE_INIT;
static int tlsf_ver_ready;

static void tlsf_read_version(void) {
	tlsfgo_version(tlsf_verbuf, sizeof tlsf_verbuf);
	__atomic_store_n(&tlsf_ver_ready, 1, __ATOMIC_RELEASE);
}

#define TLSF_STR2(x) #x
#define TLSF_STR(x) TLSF_STR2(x)

const char* tlsf_version(int* abi_version) {
	tlsf_errbuf[0] = 0;
	if (abi_version != NULL) {
		*abi_version = TLSF_ABI_VERSION;
	}
	if (!tlsf_forked) {
		pthread_once(&tlsf_ver_once, tlsf_read_version);
	}
	if (__atomic_load_n(&tlsf_ver_ready, __ATOMIC_ACQUIRE)) {
		return tlsf_verbuf;
	}
	return "github.com/gpumem/tlsf (unknown) abi=" TLSF_STR(TLSF_ABI_VERSION) " go=(unknown)";
}
