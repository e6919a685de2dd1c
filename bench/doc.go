// Package bench holds the project's benchmarks over the shared traces:
// the TLSF index beside an address-ordered best-fit reference
// (BenchmarkReplay), the pool on the simulated H200 (BenchmarkPoolReplay,
// with memory figures as custom metrics, over the traces of traces/ as
// well: recorded after the policy was tuned, see traces/README.md), and
// the pool's small-block fast
// path (BenchmarkSmall*). Run them with `make bench`. They use public
// APIs and the project's internal trace and replay packages only; timing
// never decides a test here.
//
// The comparison with other allocators is not a Go benchmark: peers/
// (run.sh, see peers/README.md) replays the traces through this pool and
// PyTorch's, CUB's, the driver's and cudaMalloc side by side on a GPU,
// from one C++ loop, and writes RESULTS.md, the source of the README's
// comparison table.
package bench
