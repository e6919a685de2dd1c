//go:build cgo

// Command capi is the C ABI of the pool, built as a shared library
// (make capi: go build -buildmode=c-shared -o bin/libtlsf.so ./capi, with
// the linker's version script capi/exports.map, so that the library
// exports the functions tlsf.h declares and nothing else: not the Go
// side's entry points, nor the Go runtime's C symbols) for C and C++
// programs and for PyTorch's pluggable allocator (python/tlsf_torch.py).
// tlsf.h documents every function. (cgo refuses the version script as a
// #cgo LDFLAGS flag: the Makefile passes it with -extldflags.)
//
// # Layout
//
// tlsf.c holds the entry points: each clears the calling thread's message
// (a thread-local buffer, so messages are per OS thread and never leak),
// answers what needs no pool (size 0, a NULL pointer) and calls the Go side
// in capi.go, which turns errors into messages. registry.go keeps one pool
// per device ordinal, made on first use with the configuration of
// tlsf_configure or of the environment variable TLSF_ALLOC_CONF (parsed by
// pool.ParseConf); device:sim makes pools on simulated GPUs, for tests and
// the example without a GPU.
//
// # Threads
//
// A C thread that calls in runs the Go side on that same thread (cgo
// callbacks run on the calling OS thread), so the message written by the
// Go side lands in the caller's thread-local buffer. Pools are safe for
// concurrent use; the registry looks pools up with an atomic load.
//
// # Failure
//
// No entry point panics across the ABI: every error is a message and NULL,
// -1 or 0; a Go panic inside a call is recovered and reported as a message
// too (it would be a bug).
//
// Only this package uses cgo: every file has the cgo build constraint, so
// CGO_ENABLED=0 builds of the module skip it.
package main

func main() {}
