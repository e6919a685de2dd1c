/*
 * tlsf.h: the C ABI of github.com/gpumem/tlsf, a GPU device-memory pool
 * (TLSF sub-allocation over CUDA device memory), built as a shared library:
 *
 *     make capi
 *
 * (CGO_ENABLED=1 go build -buildmode=c-shared with the version script
 * capi/exports.map, as the Makefile has it: without the script the
 * library also exports internal entry points, tlsfgo_*, which skip this
 * header's checks; capi/doc.go).
 *
 * The library loads the CUDA driver (libcuda.so.1) at run time; it needs
 * no CUDA headers or libraries at build time.
 *
 * Pools. One pool per device ordinal, made on the first call that needs
 * it (tlsf_malloc, tlsf_set_memory_fraction), with the configuration set
 * by tlsf_configure or, failing that, read from the environment variable
 * TLSF_ALLOC_CONF at that first use (as the process's environment has it
 * then: setenv, or Python's os.environ, after the library was loaded
 * counts; read again at each use until one made a pool). Pools live until the process exits. Device ordinals are 0 to
 * 63; one with no pool (none made yet, or no such device) reads as zeros
 * in tlsf_get_stats, tlsf_get_device_calls and tlsf_trim.
 *
 * Threads. Every function may be called from any thread, at the same time
 * as any other. Each function except tlsf_last_error first clears the
 * calling thread's error message; on failure it leaves a message there, so
 * after a call tlsf_last_error() returns "" exactly when that call
 * succeeded. Messages are per OS thread: one thread never sees another's.
 *
 * Errors. No function aborts or exits the process, whatever it is passed,
 * but for pointers to memory it must write that the caller does not own
 * (tlsf_get_stats's and tlsf_get_device_calls's out): as in C, undefined.
 * A failed call leaves every pool's allocations and statistics as they
 * were, apart from the counters of driver calls and out-of-memory events
 * (num_ooms, device_calls, device_calls_by_path), the release of unused
 * cached memory that the out-of-memory path performs before giving up
 * (reserved and cached may drop, active with cached, released grow), and
 * its wait for pending stream-ordered frees (active drops as they
 * complete).
 *
 * Streams. A stream argument is a CUstream / cudaStream_t (NULL: the
 * legacy default stream). Memory freed on a stream may be reused at once
 * by later requests on that stream, and by other streams only after the
 * work queued on it before the free has completed (the pool records a
 * CUDA event). Stream handles are not validated. A destroyed or
 * never-created stream is undefined behaviour to the CUDA driver (on the
 * H200 with driver 580 its calls crashed the process): stop passing a
 * stream before destroying it. Where a driver call on such a stream fails
 * with an invalid handle instead (the simulated device's do): a stream
 * destroyed after the pool used it is forgotten, and the pool keeps
 * serving; a stream it never saw is mostly taken for such a one (no
 * driver call names it, and tlsf_malloc and tlsf_free on it succeed),
 * except where the pool must first order work on it (the first
 * tlsf_malloc or tlsf_free on a second stream after frees on the first:
 * cuStreamWaitEvent), which fails with the driver's error, the pool
 * unchanged.
 *
 * Processes. A child made by fork() cannot use this library (nor the CUDA
 * driver, which a forked child cannot use either): the Go runtime inside
 * it runs threads that the child does not have, and a call into it could
 * wait for ever. So in such a child every function fails at once, as
 * each documents its failures, with a message naming the function and
 * fork() (an atfork handler marks the child; tlsf_last_error works). A
 * child that needs the library calls exec first (Python's
 * multiprocessing: the "spawn" start method).
 *
 * Units: sizes are bytes; pointers are CUDA device pointers aligned to at
 * least 256 bytes.
 *
 * PyTorch: tlsf_malloc and tlsf_free have the types of its pluggable
 * allocator (torch.cuda.memory.CUDAPluggableAllocator, MallocFuncType and
 * FreeFuncType); tlsf_init, tlsf_reset, tlsf_set_memory_fraction and
 * tlsf_record_stream are the hooks set with set_init_fn, set_reset_fn,
 * set_memory_fraction_fn and set_record_stream_fn. python/tlsf_torch.py
 * wires them.
 */
#ifndef TLSF_H
#define TLSF_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Longest message tlsf_last_error returns, terminating NUL included;
 * longer messages are cut. */
#define TLSF_ERROR_MAX 1024

/*
 * The parts of a pool that make driver calls (pool.Path in Go), for
 * tlsf_stats.device_calls_by_path and tlsf_get_device_calls. A call counts
 * for the outermost path it is made in, except that the out-of-memory path
 * takes over from a request's own growth.
 */
#define TLSF_PATH_OTHER         0 /* stream and event calls of stream-ordered frees, pitch queries, ... */
#define TLSF_PATH_SETUP         1 /* making the pool (address range, initial reserve) */
#define TLSF_PATH_ALLOC         2 /* a request's own growth and mapping of released pages */
#define TLSF_PATH_OUT_OF_MEMORY 3 /* from a request's first failed growth on: waits, pages moved, the retry */
#define TLSF_PATH_SCAVENGE      4 /* memory returned because the device ran low (free_floor_fraction) or the pool was idle (idle_release) */
#define TLSF_PATH_TRIM          5 /* tlsf_trim and tlsf_reset */
#define TLSF_NUM_PATHS          6 /* the number of paths; not a path */
#define TLSF_PATH_ALL          -1 /* every path, for tlsf_get_device_calls */

/* Defined where tlsf_stats has released and device_calls_by_path and the
 * library has tlsf_get_device_calls. */
#define TLSF_HAS_DEVICE_CALLS_BY_PATH 1

/* Defined where tlsf_stats has caches_on. */
#define TLSF_HAS_CACHES_ON 1

/* Defined where the library has tlsf_version. */
#define TLSF_HAS_VERSION 1

/*
 * The version of the ABI this header declares. It goes up when a
 * function's meaning, a constant or a struct's layout changes in a way that
 * breaks a caller built against an earlier tlsf.h; additions leave it as
 * it is (tlsf_stats grows at its end, and each later function or field
 * comes with a TLSF_HAS_ macro). tlsf_version reports the one the loaded
 * library implements.
 */
#define TLSF_ABI_VERSION 1

/*
 * tlsf_stats: a pool's statistics, in bytes unless said otherwise. The
 * struct may grow at its end in later versions: set size to
 * sizeof(tlsf_stats) before calling tlsf_get_stats, which fills at most
 * that many bytes, in whole 8-byte fields, and sets size to the number of
 * bytes it filled. A caller built against an older tlsf.h gets the fields
 * it knows.
 */
typedef struct tlsf_stats {
  size_t   size;            /* in: sizeof(tlsf_stats) as the caller knows it; out: bytes filled */
  uint64_t allocated;       /* bytes in live blocks, each at its block size (256-byte rounding; size class if cached or good_fit) */
  uint64_t reserved;        /* bytes held from the driver (mapped pages or chunks; with
                               passthrough, the requests' own sizes, which allocated
                               rounds up, so it may be below allocated) */
  uint64_t active;          /* bytes that cannot serve a new request: allocated, blocks
                               awaiting a stream's work, and cached (Go's Stats.Active
                               + Stats.Cached) */
  uint64_t cached;          /* bytes held by the per-thread (per-P) small-block caches */
  uint64_t peak_allocated;  /* highest allocated since the pool was made (caches counted in) */
  uint64_t peak_reserved;   /* highest reserved since the pool was made */
  uint64_t num_allocs;      /* successful allocations */
  uint64_t num_frees;       /* successful frees */
  uint64_t num_ooms;        /* allocations that failed for want of memory */
  uint64_t device_calls;    /* driver calls the pool made, of every kind */
  uint64_t cap;             /* the cap on reserved now, bytes (0: none) */
  /* Added with TLSF_HAS_DEVICE_CALLS_BY_PATH: a library older than that
   * fills the struct only up to cap and returns that size. A field is
   * filled where the returned size covers it; all are where it is
   * sizeof(tlsf_stats). */
  uint64_t released;        /* bytes returned to the driver since the pool was made */
  uint64_t device_calls_by_path[TLSF_NUM_PATHS]; /* device_calls by the part of the pool
                               that made them (TLSF_PATH_*); they sum to device_calls */
  /* Added with TLSF_HAS_CACHES_ON (an older library returns a size that
   * ends before it). */
  uint64_t caches_on;       /* 1 once the per-thread (per-P) caches serve requests: from
                               the start with caches:true, after threads contended for
                               the pool's lock with caches:auto (the default); else 0 */
} tlsf_stats;

/*
 * tlsf_malloc: allocates size bytes on device ordinal `device` for use on
 * `stream`, and returns the device pointer (aligned to 256 bytes).
 * size 0 returns NULL and is no error (tlsf_last_error() is ""), as
 * PyTorch's own allocator returns a null pointer for empty tensors.
 * Failure: NULL, with the reason in tlsf_last_error(): out of memory (the
 * message gives the request, allocated and reserved bytes, the largest
 * free block and the device's free memory; a request above the device's
 * total memory fails at once, releasing nothing, and so does one above
 * the cap that memory the pool already holds cannot serve), a size the
 * pool can never serve, a bad device ordinal, a malformed configuration,
 * no CUDA driver, a driver error (a stream the driver refuses).
 * Nothing was allocated. (Under guard, a malloc whose red-zone fill the
 * driver refuses has its block freed on the stream at once; on a stream
 * with work queued, in a pool serving several streams, active counts the
 * block until that work completes, as after any free there.)
 */
void* tlsf_malloc(size_t size, int device, void* stream);

/*
 * tlsf_free: frees ptr, returned by tlsf_malloc for `device`, whose last
 * use is queued on `stream` (or done). size is the size asked for, as
 * PyTorch passes it: a hint that lets a large block's free skip the
 * per-thread caches (Go's Pool.FreeSizedOn); 0 (unknown) or any other
 * size frees the block all the same. NULL does nothing.
 * Failure (see tlsf_last_error): a pointer freed already, one the pool
 * never returned or the interior of an allocation, a bad device ordinal,
 * a live block of another device's pool (the message names that device;
 * the block stays allocated there), a driver error (a stream the driver
 * refuses: the block stays allocated), under guard a red zone found
 * overwritten (the block is named and not freed). The pool is unchanged:
 * nothing is freed twice.
 */
void tlsf_free(void* ptr, size_t size, int device, void* stream);

/*
 * tlsf_init: PyTorch's init hook, called with the number of devices when
 * CUDA is initialised. Pools are made lazily, so this only checks the
 * configuration (parsing TLSF_ALLOC_CONF if tlsf_configure was not called:
 * its syntax and the range of each value) and, when that fails, sets the
 * message. Values that are wrong only for a device (a cap below its
 * allocation granularity, an initial reserve above the cap) fail when the
 * device's pool is made, at its first tlsf_malloc.
 */
void tlsf_init(int device_count);

/*
 * tlsf_reset: PyTorch's reset hook (torch.cuda.empty_cache): trims every
 * pool, as tlsf_trim. On failure the message names the devices whose trim
 * failed; the others were trimmed.
 */
void tlsf_reset(void);

/*
 * tlsf_set_memory_fraction: PyTorch's memory-fraction hook
 * (torch.cuda.set_per_process_memory_fraction): caps the memory the pool of
 * `device` reserves at fraction x the device's total memory (cuMemGetInfo),
 * making the pool if need be. fraction is in [0, 1]; 0 refuses every
 * allocation that needs more memory, as in PyTorch. The cap is in bytes
 * and counts no context, unlike max_fraction in tlsf_configure: jobs
 * sharing a GPU at 1/K each should use max_fraction, whose caps leave
 * each process's CUDA context room. A max_bytes or max_fraction set by
 * tlsf_configure or TLSF_ALLOC_CONF stays the ceiling: the cap is the
 * smallest of them. Memory reserved above a lowered cap stays until
 * trimmed, and serves requests meanwhile; growth beyond the cap fails.
 * tlsf_trim releases only physical allocations lying wholly under free
 * blocks: one mapped before the cap was lowered (up to 128 MiB) that a
 * live block touches stays, and may keep reserved above the cap.
 * Failure (see tlsf_last_error): a fraction out of range or NaN, a bad
 * device ordinal, a pool that cannot be made, or the driver's error from
 * cuMemGetInfo, which reads the device's total memory at each call (the
 * message names the call and its CUresult). The cap is unchanged.
 */
void tlsf_set_memory_fraction(double fraction, int device);

/*
 * tlsf_record_stream: PyTorch's record-stream hook
 * (Tensor.record_stream): ptr, a live allocation, is also used by work on
 * `stream`. When ptr is freed, the pool records an event on each recorded
 * stream (and on the freeing stream) and reuses the block only after all
 * of them completed. Recording the stream ptr is later freed on (under
 * PyTorch, the allocation's own) changes nothing.
 * Failure (see tlsf_last_error): a pointer no pool has live. Nothing is
 * recorded.
 */
void tlsf_record_stream(void* ptr, void* stream);

/*
 * tlsf_configure: sets the configuration of every pool, before the first
 * pool is made; it replaces TLSF_ALLOC_CONF. conf is key:value pairs
 * separated by commas, e.g. "backend:vmm,max_bytes:40GiB,caches:false".
 * Keys: backend (auto|vmm|chunks|passthrough), device (cuda|sim: with
 * sim, device ordinals 0 to 3 each get a simulated GPU of its own, with
 * addresses of its own as under CUDA's unified addressing; the simulated
 * device knows no stream a C program could name, so C programs on it pass
 * NULL streams: a non-NULL one is taken for a destroyed stream, as above,
 * and guard mode's red-zone fill on it fails),
 * sim_capacity (bytes, 2MiB to 1TiB or 0, device:sim only), initial_fraction,
 * grow_fraction,
 * max_fraction (of the device's total memory, less what the share
 * leaves for the process's context: pool.Options.MaxFraction),
 * release_fraction, free_floor_fraction (fractions in [0, 1]; 0 is the
 * default), idle_release (a duration such as 500ms or 2s, 0 for the
 * default 500ms, or off: a pool that made no tlsf_malloc or tlsf_free
 * for that long returns the memory it holds unused to the driver once
 * another process started or grew since, so that a process started after
 * this one went idle gets it; the pool maps memory again when used
 * again), max_bytes (bytes; 0: no cap), caches (auto|true|false:
 * auto, the default, turns the per-thread caches on once threads contend
 * for the pool's lock; true, from the start; false, never),
 * cache_max_size
 * (bytes: the largest request the caches serve, default 4KiB, 1MiB with
 * good_fit), good_fit (true|false: TLSF's O(1) good fit instead of the
 * default best fit within the request's own list), wilderness
 * (true|false, backend vmm only, ignored by the others: keep the free top
 * of the heap for requests no other free block holds from the start, not
 * only once fragmentation is severe and until every block is freed),
 * passthrough (true|false: wins over backend), guard (bytes of red zone
 * after every block, checked on free; at most 1MiB), history (events
 * kept for the Go API's snapshots, at most 2^24; no call of this ABI
 * reads them), history_stacks (true|false).
 * Bytes: an integer, or a number and a unit, in any case: KiB, MiB, GiB,
 * TiB or K, M, G, T (powers of 1024), KB, MB, GB, TB (powers of 1000)
 * or B; with a unit the number may have a fraction, rounded down to
 * whole bytes (so "0.5B" is 0).
 * Returns 0 on success; -1 on failure (conf NULL or malformed: an unknown
 * key, a bad value, named in the message; or a pool exists already), when
 * the configuration is unchanged. Values wrong only for a device, which
 * configure cannot see (a max_bytes below its allocation granularity,
 * 2 MiB on current GPUs; an initial reserve above the cap), are accepted
 * here and fail when the device's pool is made, at its first tlsf_malloc
 * (NULL, the message naming the value); configure may then be called
 * again, as no pool was made. So does a value of the environment variable
 * TLSF_PASSTHROUGH other than 1, true, yes, on (every pool passthrough)
 * or 0, false, no, off, empty (no effect), which configure does not read.
 */
int tlsf_configure(const char* conf);

/*
 * tlsf_get_stats: fills *out with the statistics of the pool of `device`
 * (see tlsf_stats; set out->size first). A device with no pool yet reports
 * zeros. Returns 0 on success; -1 on failure (out NULL, out->size smaller
 * than a size_t, a bad device ordinal), when *out is unchanged.
 */
int tlsf_get_stats(int device, tlsf_stats* out);

/*
 * tlsf_get_device_calls: sets *out to the number of driver calls the pool
 * of `device` made to the entry point named `call` (NULL: every entry
 * point counted) on `path` (TLSF_PATH_*, or TLSF_PATH_ALL for every path)
 * since it was made; these are the calls device_calls in tlsf_stats
 * counts. A device with no pool yet reports 0.
 * `call` must name one of the counted kinds of driver call, the Go
 * package device's Call kinds (device/call.go), case mattering:
 *   cuMemGetInfo cuMemAlloc cuMemFree cuMemAllocPitch cuMemAddressReserve
 *   cuMemAddressFree cuMemCreate cuMemRelease cuMemMap cuMemUnmap
 *   cuMemSetAccess cuStreamCreate cuStreamDestroy cuStreamSynchronize
 *   cuStreamWaitEvent cuEventCreate cuEventDestroy cuEventRecord
 *   cuEventQuery cuEventSynchronize cuMemsetD32 cuMemsetD32Async
 *   cuMemcpyDtoH cuMemAllocAsync cuMemFreeAsync cuMemPoolTrimTo
 *   cuMemPoolGetAttribute cuMemPoolSetAttribute cuMemsetD8Async
 *   cuCtxEnablePeerAccess cuMemcpyDtoDAsync
 * optionally followed by a version suffix, "_v" and one or more digits,
 * which is ignored (so "cuMemGetInfo_v2", as the driver exports it, reads
 * cuMemGetInfo's count, and so would "cuMemGetInfo_v7"). A listed name the
 * pool never calls (the stream-ordered allocator's, for instance) is
 * accepted and reports 0. Any other name is refused, entry points the
 * library does call but does not count included (cuInit, cuDeviceGet,
 * cuDevicePrimaryCtxRetain, cuCtxPushCurrent_v2, cuCtxPopCurrent_v2,
 * cuMemGetAllocationGranularity, cuDeviceCanAccessPeer, ...).
 * Each call reads the counters at its own moment: under concurrent use,
 * several calls (or a call and tlsf_get_stats) need not add up exactly.
 * Returns 0 on success; -1 on failure (out NULL, a path out of range, a
 * name, "" included, that is not one of those above, a bad device
 * ordinal), when *out is unchanged.
 */
int tlsf_get_device_calls(int device, int path, const char* call, uint64_t* out);

/*
 * tlsf_trim: returns unused memory of the pool of `device` to the driver
 * (empties the caches, waits for the work of pending stream-ordered frees,
 * releases the physical allocations, VMM handles or chunks, lying wholly
 * under free blocks; one a live block touches stays whole, up to 128 MiB
 * where it was mapped while the pool had no cap: the Go package's
 * Pool.Trim) and returns the
 * bytes released. A device with no pool returns 0. Failure: 0
 * and a message (bad ordinal, driver error); what was released before the
 * error stays released.
 */
size_t tlsf_trim(int device);

/*
 * tlsf_version: which build of the library is loaded, for logs and bug
 * reports: a NUL-terminated string, the same at every call, owned by the
 * library and valid until the process exits (never NULL). Its fields are
 * separated by single spaces: the module path and version as the Go
 * toolchain stamped them (a pseudo-version naming the commit, "+dirty"
 * where the tree had changes, or "(devel)"), then abi=N (N as *abi_version
 * gets it), then, where the build recorded them, vcs.revision=COMMIT and
 * vcs.modified=true or false, then go=VERSION (the Go toolchain), e.g.
 * "github.com/gpumem/tlsf v0.0.0-20261207233600-f31e939eba59 abi=1
 * vcs.revision=f31e939eba59be20af40a276b1cd50e773a71b1d vcs.modified=false
 * go=go1.26.0" (one line). Later versions may add fields before go=.
 * If abi_version is not NULL, sets *abi_version to the ABI version the
 * library implements: a caller compares it with the TLSF_ABI_VERSION of
 * the tlsf.h it was built with. Never fails (the caller's message is
 * cleared); in a child made by fork() it makes no call into Go and
 * returns the string the parent read, or, if the parent had not read it
 * when it forked, "github.com/gpumem/tlsf (unknown) abi=N go=(unknown)".
 */
const char* tlsf_version(int* abi_version);

/*
 * tlsf_last_error: the message of the calling thread's latest failed call,
 * "" if its latest call succeeded or it has made none. The string belongs
 * to the library and stays valid until the thread's next call of a tlsf_
 * function; copy it to keep it.
 */
const char* tlsf_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* TLSF_H */
