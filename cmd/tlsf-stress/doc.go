// Command tlsf-stress replays allocation traces through the TLSF device
// memory pool (package pool) and its peers, and stress-tests the pool with
// verified random workloads, on a CUDA GPU or on the simulated H200
// (sim.Device).
//
// Usage:
//
//	tlsf-stress                        replay every embedded trace with every backend, with --min-cap
//	tlsf-stress replay [flags] TRACE...
//	tlsf-stress run [flags]
//	tlsf-stress multi --procs K [flags]
//	tlsf-stress export [--out DIR] TRACE...
//	tlsf-stress sanitize [--backend B] [--case C,...]  planted bugs for compute-sanitizer (sanitize.go)
//
// Every subcommand takes --device cuda|sim (default: cuda where a CUDA
// driver and GPU 0 are found, else sim) and --sim-capacity BYTES (the
// simulated GPU's memory; default an H200's 143771 MiB) and
// --sim-real-time (the simulated GPU's driver calls take their modelled
// H200 durations in real time, outside its lock, so that multi's
// simulated processes interleave as on a GPU: sim.Config.RealTime; runs
// take longer); either of the two chooses the simulated device where
// --device is left out, and --device cuda refuses them), and --conf KEY:VALUE,... (options of every pool
// backend, in the syntax of TLSF_ALLOC_CONF and pool.ParseConf, such as
// release_fraction:0.05 or wilderness:true, the keys capi/tlsf.h lists
// for tlsf_configure; backend and passthrough are --backend's, device and
// sim_capacity --device's and --sim-capacity's, max_bytes and max_fraction
// --cap's and multi's --fraction's; a backend's name wins over a key it
// sets, as tlsf-vmm-goodfit's GoodFit; export makes no pool and ignores
// it). Byte counts are written as --conf writes them (pool.ParseBytes):
// the suffixes KiB, MiB, GiB, TiB or K, M, G, T are binary, KB, MB, GB,
// TB decimal, B bytes, in any case, with a decimal number where there is
// a suffix (1.5GiB). A cap
// written with a decimal point and no suffix, such as 0.5, is a fraction
// of the device's total memory, in bytes (MaxBytes: it counts no context,
// unlike multi's --fraction, a MaxFraction). With TLSF_PASSTHROUGH=1 in
// the environment every pool backend runs as passthrough (pool.New reads
// it): the command says so on standard error and reports those backends
// as passthrough, once each.
//
// Without arguments the command replays every embedded trace with all
// its backends on the GPU, or on the simulated device where there is
// none, finds each backend's smallest feasible cap (replay --min-cap),
// and prints the table described below and one verdict line per trace:
// our best pool backend's min cap over peak live against the best
// peer's, naming the peer and where its figure comes from, e.g.
//
//	verdict resnet50: tlsf-vmm-wilderness min cap 1.003× live vs 1.029× for the best peer (torch, H200, baseline.json): lower
//
// It needs nothing but the module: go run ./cmd/tlsf-stress. Where no
// GPU is found it says so once, on standard error (--device sim chooses
// the simulated device without the note). --sim-capacity 0 is the
// default; below the simulated GPU's 2 MiB granularity, or above 1 TiB
// (as the C ABI's sim_capacity: a VMM pool reserves twice the device's
// memory of the 4 TiB of address space a simulated process has), it is
// refused.
//
// The replay table has a row per trace and backend and, below ours, the
// peers' rows; the "measured" column says where each row's figures come
// from: "this run (sim)" or "this run (cuda)", or "H200, baseline.json"
// for the peers' figures recorded on an H200. On the simulated device the
// header says that our ns/op is host time, not comparable with the
// peers' GPU times. Every failed replay gets a line under the table with
// its first error; then come the verdicts (by peak reserved over live
// where --min-cap was not given), one per trace replayed with a pool
// backend: its best one among those whose replays failed no allocation
// (where every one failed, the line says so and compares nothing). Peers
// in a verdict are those of baseline.json, for an embedded trace (the
// same name, operations and peak live bytes: a file of that name is
// another trace), and, on a GPU, the driver's pool (async) measured by
// the run.
//
// # Backends
//
//	tlsf-vmm      pool.BackendVMM: one virtual range, pages mapped on demand
//	tlsf-chunks   pool.BackendChunks: cuMemAlloc'd chunks
//	passthrough   pool.BackendPassthrough: cuMemAlloc/cuMemFree per block
//	async         the driver's stream-ordered pool (cuMemAllocAsync,
//	              cuMemFreeAsync; device.AsyncAllocator), with its release
//	              threshold at the maximum so that it keeps freed memory
//	              like a caching allocator, and trimmed when done
//	tlsf-vmm-goodfit  tlsf-vmm with pool.Options.GoodFit (TLSF's O(1) good
//	              fit, per-P caches for blocks of 1 MiB and less, on from
//	              the start: the default before best fit)
//	tlsf-vmm-wilderness  tlsf-vmm with pool.Options.Wilderness (the free
//	              top of the heap kept for requests no other free block
//	              holds)
//
// With --cap, the pools are made with pool.Options.MaxBytes; the driver's
// pool has no cap of its own, so the async backend occupies the rest of
// the device's free memory with one cuMemAlloc instead. On the simulated
// device, async is Sim's emulation of the driver's pool, which never
// fragments (see device/sim_async.go): its figures are lower bounds.
//
// # replay
//
// replay [--backend LIST] [--cap BYTES|FRACTION] [--min-cap] [--json]
// [--plot FILE] [--snapshot FILE] TRACE...
//
// A TRACE is a file, told apart by content (package trace): this
// project's text format, a PyTorch memory snapshot pickle, or an RMM
// logging_resource_adaptor CSV log, each plain or gzip; or the name of an
// embedded trace (lstm, resnet50, tdnn), which wins over a file of that
// name in the working directory (./lstm reads the file). No TRACE means all embedded
// traces. A malformed file is an error naming the file and the line (or
// byte offset, or pickle element).
//
// Each trace is compiled (IDs to dense slots, replay.Compile) and then
// replayed per backend on one allocator on a fresh device (on a GPU, the
// same device, with each allocator closed and the driver's pool trimmed
// in between): the first replay warms the allocator (cold_ns_per_op),
// more replays run untimed until the process has spent 1 s in such
// replays (replay.WarmUpTime: in practice, those of its first trace), and
// --warm-runs more (default 10, at most 1000) are timed; ns_per_op is their median, the
// warm cost per alloc or free, as are the peers' figures (trace.Baselines, measured on an H200)
// that the table prints beside ours. Blocks a trace leaves live are freed
// after each replay. Trace streams other than 0 map to streams created
// for the replay. On the simulated device ns_per_op is host time only
// (Sim never sleeps); device_ns_per_op adds the modelled driver time.
//
// --min-cap finds by bisection (replay.MinCap, to 2 MiB) the smallest cap
// under which one replay on a fresh allocator has no failed allocation.
// --plot FILE writes live bytes and each backend's reserved bytes over the
// first replay (about 2000 samples) as SVG or PNG, by FILE's extension;
// with several traces, to FILE-TRACE.ext each (the command names each file
// it writes). --snapshot FILE replays each trace once more with the first
// pool backend of --backend, recording its history
// (pool.Options.History), and writes the pool's snapshot, taken before
// the blocks left live are freed, as the pickle that PyTorch's
// torch.cuda.memory._snapshot() returns (pool.Snapshot.WritePickle; with
// several traces, FILE-TRACE.ext each). PyTorch's viewer renders it:
// drop it on pytorch.org/memory_viz, or run
// python3 -m torch.cuda._memory_viz trace_plot FILE -o FILE.html. It is
// also a trace this command replays. Every file either would write is
// checked before the replays start: it can be written, it is none of the
// trace files read, and no two traces share a name.
//
// With --json, replay prints one JSON object per line, per trace and
// backend, with these fields (bytes are bytes, times ns):
//
//	trace                string   trace name ("resnet50")
//	source               string   file, or data/NAME.trace.gz for an embedded trace
//	format               string   "text", "pytorch-snapshot" or "rmm-csv"
//	backend              string   tlsf-vmm, tlsf-chunks, passthrough, async, tlsf-vmm-goodfit or tlsf-vmm-wilderness
//	conf                 string   --conf as given, on pool backends' objects; absent without it
//	device               string   device name ("NVIDIA H200", "Simulated H200"; with --sim-capacity, "Simulated H200 with 4.00 GiB")
//	device_kind          string   "cuda" or "sim"
//	ops                  int      operations of the timed replay (failed allocations and their frees excluded)
//	peak_live_bytes      uint64   peak of live bytes as the trace sizes them (trace.PeakLive)
//	peak_reserved_bytes  uint64   most device memory the allocator held, over all its replays
//	reserved_over_live   float64  peak_reserved_bytes / peak_live_bytes
//	cap_bytes            uint64   the cap in force (0: none)
//	min_cap_bytes        uint64   with --min-cap only: the smallest cap with no failed allocation
//	min_cap_over_live    float64  with --min-cap only: min_cap_bytes / peak_live_bytes
//	min_cap_runs         int      with --min-cap only: replays the bisection ran
//	ns_per_op            float64  warm wall time per op: the median of the warm replays
//	min_ns_per_op        float64  the fastest warm replay's wall time per op
//	warm_runs            int      warm replays timed (--warm-runs)
//	warm_up_runs         int      untimed replays between the cold and the timed ones (replay.WarmUp: the process's first trace and backend run about a second of them, later ones one); their failed allocations count nowhere
//	cold_ns_per_op       float64  wall time per op of the first replay
//	device_ns_per_op     float64  sim only: modelled driver time per op, warm replays
//	cold_device_ns_per_op float64 sim only: modelled driver time per op of the first replay, New included
//	device_calls         uint64   driver calls the allocator made, creation and all replays (the warm-up's included)
//	warm_device_calls    uint64   of those, during the timed warm replays (all of them)
//	device_calls_by_name object   driver entry point → calls, the non-zero ones
//	failed_allocs        int      allocations that failed in the first replay
//	warm_failed_allocs   int      allocations that failed in the warm replays
//	first_error          string   the first allocation error, if any (omitted otherwise)
//	skipped_records      int      records of the trace its parser ignored (frees of no live block, zero-byte allocations: a snapshot begun mid-run)
//
// # export
//
// export [--out DIR] TRACE... writes each trace (any format replay reads,
// or an embedded name; none: all embedded) to DIR/NAME.ops as an op list
// for replayers outside Go (bench/peers drives every peer allocator from
// one C++ loop with it). Blocks become dense slot numbers, reused last in,
// first out, so that SLOTS is the most blocks live at once, and streams
// dense indices (0: the trace's stream 0, then others in order of first
// use), so a replayer needs no hash map. Records, one a line, decimal:
//
//	tlsf-ops 1 OPS SLOTS STREAMS PEAK_LIVE   header; OPS records follow
//	a SLOT SIZE STREAM                       allocate SIZE bytes into empty SLOT on STREAM
//	f SLOT                                   free the block in SLOT, on its allocation's stream
//
// It prints one JSON object per trace: trace, source, format, file, ops,
// allocs, frees, slots, streams, peak_live_bytes, skipped. Two traces of
// one name are a usage error (they would share a file).
//
// # run
//
// run [--backend B] [-g N] [--ops N] [--duration D] [--sizes SRC]
// [--verify full|sampled|none] [--stream default|per-goroutine]
// [--cap C] [--max-live C] [--slots N] [--seed N] [--json]
//
// N goroutines (default GOMAXPROCS, at most 4096) allocate and free blocks at random
// for --ops operations (default 100000) or --duration, sizes drawn from a
// trace's size distribution (--sizes NAME|FILE) or log-uniform between
// --min-size and --max-size (default 256 B to 64 MiB), at most --slots
// live blocks per goroutine (default 64, at most 2^20, and 2^24 over all
// goroutines) and --max-live bytes in all (default a
// quarter of the device). Every block is filled on the device with a
// 32-bit pattern of its own (cuMemsetD32Async on the default stream or a
// stream per goroutine; its last size mod 4 bytes with the pattern's low
// byte, cuMemsetD8Async) and read back before it is freed (cuMemcpyDtoH of
// the whole block, or of its first, middle and last 4 KiB); every block
// is also checked on the host against the address ranges of the live
// blocks. Any corrupted word or overlap is reported with its addresses and
// the blocks involved. At the end the allocator must hold nothing live
// (no lost blocks) and pass its invariant check (pool.Check). On the
// simulated device memory contents are simulated (sim.Config.Shadow), so
// verification is real, and the simulator's violations (stream-order
// misuse) are problems too. A progress bar is drawn on a terminal, plain
// lines every --progress-interval otherwise. Out-of-memory errors are
// counted, not failures.
//
// run --json prints one object: device, device_kind, backend, conf (--conf
// as given, for a pool backend; absent without it), goroutines,
// stream, verify, ops, allocs, frees, out_of_memory, elapsed_s, ops_per_s,
// verified_blocks, verified_bytes, peak_live_bytes, peak_reserved_bytes,
// cap_bytes, device_calls and device_calls_by_name (the allocator's),
// workload_device_calls (fills, copies, syncs), pool (TLSF backends:
// grows, releases, released_bytes, retries, out_of_memory, cached_bytes,
// cached_blocks, fragmentation, reserved_bytes, at the end, and
// device_calls_by_path: the pool's driver calls by the path that made them,
// pool.Path's names, each an object of driver entry point → calls, the
// non-zero ones), problem_count,
// problems (the first 20), error_count, errors, oversized_requests
// (requests drawn above a goroutine's share of --max-live: not made, not
// counted in ops, though --ops counts them), interrupted (true only
// when a signal stopped the run, else absent), ok.
//
// # run --devices
//
// run --devices 0,1 [run's flags] runs the workload across several GPUs
// of one host (peer.go): a pool per listed device (pool.Devices), each
// granting the others access (pool.Options.PeerAccess). Goroutine g
// allocates a block on device list[g mod n] and one of the same size on
// list[(g+1) mod n], fills the first (cuMemsetD32), copies it into the
// second with cuMemcpyDtoDAsync issued on the second's device, and reads
// the copy back there before freeing both; a refused copy, a wrong word or
// an overlap is a problem. --devices 0 runs it on one GPU (copies within
// it). On a GPU, the run ends by timing 20 copies of min(256 MiB, total/16)
// from list[0] to list[1 mod n] between pool blocks and between plain
// cuMemAlloc blocks with peer access enabled (what cudaMemcpyPeer does).
// Backends: tlsf-vmm, tlsf-chunks, passthrough. On the simulated device
// the GPUs are those of a sim.Host. --json prints one object: device,
// device_kind, devices, backend, goroutines, verify, ops, allocs, frees,
// out_of_memory, copies, peer_copies, copied_bytes, elapsed_s, ops_per_s,
// verified_blocks, verified_bytes, peak_live_bytes, per_device (ordinal,
// peak_reserved_bytes, device_calls, device_calls_by_name, peer_access),
// workload_device_calls, copy_bench_bytes, pool_copy_gbps,
// plain_copy_gbps, copy_ratio (GPU only, and not when interrupted; else
// 0), problem_count, problems, error_count, errors, interrupted (as
// run's), ok.
//
// # multi
//
// multi --procs K [--fraction F] [--oversubscribe X] [--exec] [run's flags]
//
// K processes share the device, each with a pool capped by
// pool.Options.MaxFraction F (default 1/K), each running run's workload
// with a live target of X (default 1.5) times total/K, so that together
// they oversubscribe the device and meet out-of-memory errors, which must
// be clean: no corruption, no lost blocks, no crash. K is at most what
// leaves half the device beside the K CUDA contexts (about 130 on an
// H200). On a GPU the command
// re-executes itself K times (hidden subcommand multi-child); each child
// prints its outcome as one JSON line, run's object plus proc, pid,
// max_fraction, exit_status, total_bytes, share (peak reserved over total
// memory), device_calls_per_op (the pool's driver calls per operation),
// out_of_memory_within_90pct_of_share (failed requests that would have
// left the live bytes, counted from before the request, within 90% of
// the share: the pool's cap, MaxFraction × total less what it leaves for
// the process's context), out_of_memory_still_within_90pct_of_share (those of them
// still within it when the request returned, counting the blocks and
// requests of the process's other goroutines then: in the others another
// goroutine's request, begun meanwhile, took the live bytes above it) and
// fairness (max share / min share
// over all processes, filled in by the parent), and the parent prints a
// table with share and calls/op per process, a line with the
// out-of-memory counts and a fairness line (or, with --json, the
// children's lines).
// Each process prints progress lines, prefixed [proc i], every
// --progress-interval. A simulated GPU cannot span processes, so
// on the simulated device the K processes are goroutines, each a
// sim.Device process (NewProcess) sharing one simulated capacity;
// --exec runs real children there too, each with a simulated GPU of its
// own.
//
// # Exit status
//
// 0 when all went well; 1 for failures: corruption, overlaps, lost
// blocks, unexpected errors, a crashed child, a replay whose free failed,
// or allocations that failed in a replay without --cap (with --cap they
// are the measurement); 2 for a bad command line; 130 when SIGINT or
// SIGTERM stopped a run that found no failure: run and multi then report
// the operations done (run's first line says "interrupted", multi's
// status column too, the JSON's "interrupted" is true; multi interrupts
// its child processes, which report too), replay and the command alone
// the rows replayed (between traces: a trace's replay runs to its end),
// and a second interrupt ends the program at once. export and sanitize
// end at once, as by default.
package main
