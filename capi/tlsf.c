//go:build cgo

// The C side of the ABI: each entry point clears the calling thread's
// message and calls the Go side (capi.go), which sets a message on failure
// with tlsf_set_error. The message lives in a thread-local buffer, so it is
// per OS thread, costs no allocation and can never leak.

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

void* tlsf_malloc(size_t size, int device, void* stream) {
	tlsf_errbuf[0] = 0;
	if (size == 0) {
		return NULL; // as cudaMalloc and PyTorch's allocator: no memory, no error
	}
	return (void*)tlsfgo_malloc(size, device, (uintptr_t)stream);
}

void tlsf_free(void* ptr, size_t size, int device, void* stream) {
	tlsf_errbuf[0] = 0;
	if (ptr == NULL) {
		return;
	}
	tlsfgo_free((uintptr_t)ptr, size, device, (uintptr_t)stream);
}

void tlsf_init(int device_count) {
	tlsf_errbuf[0] = 0;
	tlsfgo_init(device_count);
}

void tlsf_reset(void) {
	tlsf_errbuf[0] = 0;
	tlsfgo_reset();
}

void tlsf_set_memory_fraction(double fraction, int device) {
	tlsf_errbuf[0] = 0;
	tlsfgo_set_memory_fraction(fraction, device);
}

void tlsf_record_stream(void* ptr, void* stream) {
	tlsf_errbuf[0] = 0;
	tlsfgo_record_stream((uintptr_t)ptr, (uintptr_t)stream);
}

int tlsf_configure(const char* conf) {
	tlsf_errbuf[0] = 0;
	if (conf == NULL) {
		static const char msg[] = "tlsf_configure: conf is NULL";
		tlsf_set_error(msg, sizeof msg - 1);
		return -1;
	}
	return tlsfgo_configure((char*)conf, strlen(conf));
}

int tlsf_get_stats(int device, tlsf_stats* out) {
	tlsf_errbuf[0] = 0;
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
	tlsf_errbuf[0] = 0;
	if (out == NULL) {
		static const char msg[] = "tlsf_get_device_calls: out is NULL";
		tlsf_set_error(msg, sizeof msg - 1);
		return -1;
	}
	return tlsfgo_get_device_calls(device, path, (char*)call, call == NULL ? 0 : strlen(call), out);
}

size_t tlsf_trim(int device) {
	tlsf_errbuf[0] = 0;
	return tlsfgo_trim(device);
}
