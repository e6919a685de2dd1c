// Package device is what a memory pool needs from one GPU: the Device
// interface, the handle types (Stream, Event, MemHandle), the sentinel
// errors and the driver Error, the optional AsyncAllocator, and call
// counting (Call, Counts). It loads no driver and simulates nothing: the
// implementations live beside it, device/cuda (the CUDA driver API through
// purego, no cgo) and device/sim (a deterministic simulated GPU), and
// device/devicetest is the conformance suite both run.
//
// # The contract every implementation keeps
//
// Units: sizes, offsets, pitches and alignments are bytes; device pointers
// are plain uintptrs, so pointers, streams and contexts made by other
// bindings convert directly.
//
// Ordering: work queued on one stream runs in issue order; MemsetD32 and
// MemcpyDtoH act on the legacy default stream and so wait for earlier work
// there. An event completes when the work queued before its last record
// has. Work on different streams is unordered unless StreamWaitEvent or a
// synchronisation orders it. MemUnmap, MemRelease and MemFree of memory
// that queued work still uses is the caller's error: the driver does not
// always detect it (device/sim records it as a violation).
//
// Errors: every error wraps a sentinel (errors.Is) or is an *Error naming
// the driver call and its CUresult code, which wraps the sentinel for that
// code where one exists:
//   - ErrInvalidValue for bad arguments (size 0, misaligned ranges,
//     unknown pointers, streams, events or handles);
//   - ErrOutOfMemory when the device cannot back an allocation, a
//     physical handle or (async) a pool growth; nothing is left allocated;
//   - ErrNotSupported for VMM or memory pools on a device without them,
//     for mapping part of a physical handle (cuMemMap with a size below
//     the handle's: the driver maps whole handles only), and for peer
//     access between devices that have no peer path;
//   - ErrNoDriver / ErrNoDevice when opening fails;
//   - ErrIllegalAddress for an access to memory that is not mapped; on a
//     real GPU this error is sticky and ends the context.
//
// A failed call changes nothing the caller can observe except counters.
//
// Concurrency: every method of a Device may be called from any number of
// goroutines at once; Close must not race with calls the caller still
// expects to succeed (later calls fail).
package device
