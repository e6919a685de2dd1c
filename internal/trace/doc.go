// Package trace reads, writes and samples allocation traces: the recorded
// sequences of device-memory allocations and frees that the allocator's
// tests, benchmarks and the tlsf-stress command replay.
//
// # Model
//
// A Trace is an ordered list of Ops. An allocation names a new block by an
// ID and gives its size in bytes and the stream it was requested on; a free
// names a live block (and repeats its size and stream). Blocks still live
// at the end are never freed. Trace.Check states these rules as code, and
// every Trace that Parse returns satisfies it. PeakLive, the largest sum of
// live sizes, is the memory a perfect allocator would need.
//
// # Formats
//
// Parse decompresses gzip (told by its magic bytes 1f 8b, not by a file
// name) and then tells the format by content.
//
// Text, this project's format, one record per line, fields separated by
// blanks, numbers in decimal below 2^64:
//
//	# any comment             a line whose first non-blank character is '#'
//	a ID SIZE STREAM          allocate SIZE (> 0) bytes as block ID on STREAM
//	f ID                      free block ID
//
// Blank lines are ignored. The text parser is strict: an unknown record, a
// missing or extra field, a bad number, a zero size, an allocation of an
// ID that is live, or a free of an ID that is not live is an error naming
// the line. An ID may be reused after its block is freed; the traces this
// package writes never do. Sizes are the caller's requested sizes: in the
// embedded traces 20% (tdnn) to 24% (resnet50) of them are not multiples
// of 512, contrary to the README of the traces, so an allocator that wants
// PyTorch's 512-byte rounding must round them itself.
//
// PyTorch memory snapshots, the pickle that torch.cuda.memory._snapshot()
// returns and _dump_snapshot writes (recorded with _record_memory_history):
// a dict holding "segments" (a list, not read) and "device_traces", a list
// per device of entry dicts with "action", "addr", "size", "stream" and
// "time_us". An "alloc" entry becomes an allocation with a fresh ID
// (1, 2, 3, ... in trace order) and a "free_requested" entry the free of
// the block at that address; all other actions are ignored
// ("free_completed", which marks when the memory became reusable after
// stream synchronisation, "segment_alloc", "segment_free", "snapshot",
// "oom", ...). The history may begin mid-run, or wrap, so a free of an
// address that is not live is counted in Trace.Skipped, as is an
// allocation of zero bytes; an allocation at a live address is an error.
// With more than one device, entries are merged by time_us, and addresses
// are per device. Only the plain-data subset of pickle is accepted (see
// pickle.go); errors name the byte offset in the decompressed pickle or,
// for a pickle of the wrong shape, the element (device_traces[0][17]).
//
// RMM logs, the CSV that rmm::mr::logging_resource_adaptor writes: the
// header "Thread,Time,Action,Pointer,Size,Stream", then one row per event
// with action "allocate", "allocate failure" or "free" ("deallocate" is
// accepted too), the pointer and stream in hexadecimal as printf's %p
// writes them (0x7f..., or "(nil)") and the size in decimal. An allocate
// gets a fresh ID; a free looks its pointer up. As with snapshots, a free
// of an unknown pointer and a zero-size allocate are counted in Skipped;
// "allocate failure" rows allocate nothing and are counted in Failures.
// Thread and Time are not read.
//
// # Errors and limits
//
// Every defect of an input is reported as a *ParseError, which matches
// ErrMalformed under errors.Is and names the file and the line (text, CSV),
// the byte offset (pickle syntax; gzip, where the offset is in the
// compressed stream) or the element (pickle shape). The parsers never
// panic and never allocate from a size field of the input: text and CSV
// are read a line at a time and bounded by MaxInputBytes; a pickle is
// bounded by MaxPickleBytes, scanned before decoding, and refused
// (ErrTooLarge) if its decoded form would be out of proportion to its
// length. The fuzz targets in the module's fuzz directory check all this.
//
// # Embedded data
//
// Names lists the embedded text traces and Load parses one; they were
// recorded on an NVIDIA H200 with PyTorch 2.11 while real models trained
// with varying batch and sequence sizes:
//
//	name      ops     peak live                  workload
//	tdnn      7,349   8,537,066,560 (7.95 GiB)   TDNN acoustic model, chunk 50-300 frames
//	resnet50  42,915  11,383,464,987 (10.60 GiB) ResNet-50, batch 16-128
//	lstm      3,278   6,652,772,488 (6.20 GiB)   3-layer LSTM, sequence 50-800
//
// The snapshots lstm and tdnn were derived from are embedded as well, and
// the tests check that they parse to exactly the same ops. Baselines
// returns the figures other allocators achieve on these traces.
//
// # Concurrency
//
// The parsers, Load, Names and Baselines keep no shared state and are safe
// to call from many goroutines at once. A Trace and a SizeSampler are not
// modified by their methods and may be read concurrently.
package trace
