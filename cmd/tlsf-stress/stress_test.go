package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// runSchema is run's --json schema as doc.go lists it.
var runSchema = map[string]string{
	"device": "string", "device_kind": "string", "backend": "string", "conf": "string", "goroutines": "int",
	"stream": "string", "verify": "string", "ops": "int", "allocs": "int", "frees": "int",
	"out_of_memory": "int", "elapsed_s": "number", "ops_per_s": "number",
	"verified_blocks": "int", "verified_bytes": "int", "peak_live_bytes": "int",
	"peak_reserved_bytes": "int", "cap_bytes": "int", "device_calls": "int",
	"device_calls_by_name": "object", "workload_device_calls": "int", "pool": "object",
	"problem_count": "int", "problems": "array", "error_count": "int", "errors": "array", "ok": "bool",
	"oversized_requests": "int",
}

func TestRunVerifiesOnSim(t *testing.T) {
	for _, tc := range []struct {
		backend, stream, verify string
	}{
		{backendVMM, streamDefault, verifySampled},
		{backendChunks, streamPerGoroutine, verifySampled},
		{backendPassthrough, streamDefault, verifyFull},
		{backendAsync, streamPerGoroutine, verifySampled},
	} {
		t.Run(tc.backend+"/"+tc.stream+"/"+tc.verify, func(t *testing.T) {
			args := []string{"run", "--device", "sim", "--json", "--ops", "3000", "-g", "3", "--slots", "16",
				"--backend", tc.backend, "--stream", tc.stream, "--verify", tc.verify, "--sizes", "log-uniform"}
			if tc.verify == verifyFull {
				args = append(args, "--max-size", "256KiB")
			}
			out, errs, status := cli(t, args...)
			require.Equal(t, exitOK, status, "%s\n%s", out, errs)
			lines := jsonLines(t, out)
			require.Len(t, lines, 1)
			m := lines[0]
			for k, typ := range runSchema {
				if k == "pool" && tc.backend == backendAsync {
					assert.NotContains(t, m, k, "async has no pool statistics")
					continue
				}
				if k == "conf" {
					assert.NotContains(t, m, k, "no --conf")
					continue
				}
				require.Contains(t, m, k)
				switch typ {
				case "array":
					assert.IsType(t, []any{}, m[k], k)
				case "bool":
					assert.IsType(t, true, m[k], k)
				}
			}
			for k := range m {
				assert.Contains(t, runSchema, k, "undocumented field")
			}
			assert.Equal(t, true, m["ok"])
			assert.Equal(t, "3000", fmt.Sprint(m["ops"]))
			assert.Equal(t, m["allocs"], m["frees"], "every block freed")
			assert.Equal(t, m["frees"], m["verified_blocks"], "every block verified")
		})
	}
}

func TestRunTraceSizesAndTable(t *testing.T) {
	out, errs, status := cli(t, "run", "--device", "sim", "--ops", "2000", "-g", "2", "--sizes", "lstm", "--slots", "8")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, out, "run: 2000 ops")
	assert.Contains(t, out, "problems 0, errors 0")
	assert.Contains(t, out, "pool: grows")
	_, errs, status = cli(t, "run", "--device", "sim", "--sizes", "no-such-trace")
	assert.Equal(t, exitFailed, status)
	assert.Contains(t, errs, "no-such-trace")
}

// withFillHook installs testHookFilled for the test.
func withFillHook(t *testing.T, f func(d device.Device, b *liveBlock)) {
	t.Helper()
	testHookFilled = f
	t.Cleanup(func() { testHookFilled = nil })
}

func TestRunDetectsCorruption(t *testing.T) {
	// A stray write into block #5, inside its first 4 KiB.
	var victim *liveBlock
	withFillHook(t, func(d device.Device, b *liveBlock) {
		if b.id == 5 {
			victim = b
			require.NoError(t, d.MemsetD32(b.ptr+64, 0x0badc0de, 1))
		}
	})
	out, _, status := cli(t, "run", "--device", "sim", "--ops", "400", "-g", "1", "--min-size", "8KiB", "--max-size", "64KiB")
	assert.Equal(t, exitFailed, status, out)
	require.NotNil(t, victim)
	assert.Contains(t, out, "problems 1")
	assert.Contains(t, out, "PROBLEM: corruption: "+victim.String())
	assert.Contains(t, out, fmt.Sprintf("word at %#x (offset 64) holds 0x0badc0de", victim.ptr+64))
	assert.Contains(t, out, "no live block has that pattern")
}

func TestStressNamesTheBlockWhosePatternIsFound(t *testing.T) {
	// Another live block's pattern in block #3's last bytes: the report
	// names both blocks.
	sd := sim.New(sim.Config{Shadow: true, Capacity: 1 << 30})
	a, err := newAllocator(sd, backendVMM, allocOptions{})
	require.NoError(t, err)
	other := &liveBlock{id: 1000, ptr: 0x7e0000000000, size: 4096, pattern: 0x12345678}
	var victim *liveBlock
	withFillHook(t, func(d device.Device, b *liveBlock) {
		if b.id == 3 {
			victim = b
			require.NoError(t, d.MemsetD32(b.ptr+uintptr(b.size)-8, other.pattern, 1))
		}
	})
	cfg := stressConfig{goroutines: 1, ops: 20, slots: 8, verify: verifySampled, seed: 1,
		sizes: func(*rand.Rand) uint64 { return 1 << 20 }}
	s := newStress(context.Background(), sd, a, cfg)
	s.patterns.Store(other.pattern, other)
	rep := s.run()
	require.NoError(t, a.close())
	require.NotNil(t, victim)
	require.EqualValues(t, 1, rep.ProblemCount, rep.Problems)
	assert.Equal(t, fmt.Sprintf("corruption: %v: word at %#x (offset %d) holds 0x12345678, the pattern of live %v: the two blocks share memory",
		victim, victim.ptr+1<<20-8, 1<<20-8, other), rep.Problems[0])
}

// overlapAlloc hands out, on its nth allocation, the address of a live
// block again, as a broken allocator would.
type overlapAlloc struct {
	allocator
	mu    sync.Mutex
	n, at int
	last  uintptr
	fake  uintptr
}

func (a *overlapAlloc) AllocOn(size uint64, s device.Stream) (uintptr, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	if a.n == a.at && a.last != 0 {
		a.fake = a.last
		return a.last, nil
	}
	p, err := a.allocator.AllocOn(size, s)
	a.last = p
	return p, err
}

func (a *overlapAlloc) FreeOn(ptr uintptr, s device.Stream) error {
	a.mu.Lock()
	if ptr == a.fake {
		a.fake = 0
		a.mu.Unlock()
		return nil
	}
	a.mu.Unlock()
	return a.allocator.FreeOn(ptr, s)
}

func TestStressDetectsOverlapOnHost(t *testing.T) {
	sd := sim.New(sim.Config{Shadow: true, Capacity: 1 << 30})
	inner, err := newAllocator(sd, backendChunks, allocOptions{})
	require.NoError(t, err)
	a := &overlapAlloc{allocator: inner, at: 3}
	cfg := stressConfig{
		goroutines: 1, ops: 3, slots: 64, verify: verifyNone, seed: 1,
		sizes: func(*rand.Rand) uint64 { return 1 << 16 },
	}
	rep := newStress(context.Background(), sd, a, cfg).run()
	require.NoError(t, inner.close())
	require.NotZero(t, rep.ProblemCount)
	assert.True(t, strings.HasPrefix(rep.Problems[0], "overlap: block #3 ["), rep.Problems[0])
	assert.Contains(t, rep.Problems[0], "while block #2")
	assert.Contains(t, rep.Problems[0], fmt.Sprintf("%#x", a.last))
}

func TestStressReportsLostBlocks(t *testing.T) {
	// An allocator that forgets to free: the pool still counts the block.
	sd := sim.New(sim.Config{Shadow: true, Capacity: 1 << 30})
	inner, err := newAllocator(sd, backendVMM, allocOptions{})
	require.NoError(t, err)
	a := &leakyAlloc{allocator: inner}
	cfg := stressConfig{goroutines: 1, ops: 10, slots: 4, verify: verifySampled, seed: 1,
		sizes: func(*rand.Rand) uint64 { return 4096 }}
	rep := newStress(context.Background(), sd, a, cfg).run()
	require.NoError(t, inner.close())
	require.NotZero(t, rep.ProblemCount)
	assert.Contains(t, strings.Join(rep.Problems, "\n"), "lost blocks")
}

type leakyAlloc struct {
	allocator
	skipped bool
}

func (a *leakyAlloc) FreeOn(ptr uintptr, s device.Stream) error {
	if !a.skipped {
		a.skipped = true
		return nil
	}
	return a.allocator.FreeOn(ptr, s)
}

func TestMultiOnSimSharesCapacity(t *testing.T) {
	// Enough operations that each process's live target (1.5× its share)
	// is reached whatever the interleaving of its goroutines: with 1500
	// a loaded machine sometimes kept every process under its cap.
	out, errs, status := cli(t, "multi", "--device", "sim", "--sim-capacity", "2GiB", "--procs", "3",
		"--ops", "5000", "-g", "2", "--json")
	require.Equal(t, exitOK, status, "%s\n%s", out, errs)
	lines := jsonLines(t, out)
	require.Len(t, lines, 3)
	var ooms int64
	for i, m := range lines {
		assert.Equal(t, fmt.Sprint(i), fmt.Sprint(m["proc"]))
		assert.Equal(t, true, m["ok"], "%v", m)
		assert.Equal(t, m["allocs"], m["frees"])
		assert.Contains(t, m, "max_fraction")
		for _, k := range []string{"share", "device_calls_per_op", "fairness", "total_bytes", "out_of_memory_within_90pct_of_share", "out_of_memory_still_within_90pct_of_share"} {
			assert.Contains(t, m, k)
		}
		var fair, fraction, total, capBytes float64
		fmt.Sscan(fmt.Sprint(m["fairness"]), &fair)
		assert.GreaterOrEqual(t, fair, 1.0)
		// The share failures are counted against is the pool's cap, which
		// leaves the simulated contexts room.
		fmt.Sscan(fmt.Sprint(m["max_fraction"]), &fraction)
		fmt.Sscan(fmt.Sprint(m["total_bytes"]), &total)
		fmt.Sscan(fmt.Sprint(m["cap_bytes"]), &capBytes)
		assert.Less(t, capBytes, fraction*total, "the cap counts the contexts")
		assert.Greater(t, capBytes, fraction*total/2)
		var n int64
		fmt.Sscan(fmt.Sprint(m["out_of_memory"]), &n)
		ooms += n
	}
	assert.Positive(t, ooms, "1.5× oversubscribed: some allocations must fail, cleanly")

	// --sim-real-time: the same, driver calls taking their time.
	out, errs, status = cli(t, "multi", "--device", "sim", "--sim-real-time", "--sim-capacity", "2GiB", "--procs", "2", "--ops", "500", "--json")
	require.Equal(t, exitOK, status, errs)
	assert.Len(t, jsonLines(t, out), 2)

	out, errs, status = cli(t, "multi", "--device", "sim", "--sim-capacity", "2GiB", "--procs", "2", "--ops", "500")
	require.Equal(t, exitOK, status, errs)
	assert.Contains(t, out, "simulated processes sharing one simulated GPU")
	assert.Contains(t, out, "out-of-memory errors:")
	assert.Contains(t, out, "of them from requests within 90% of the share")
	assert.Contains(t, out, "still within it when they returned (target 0")
	assert.Contains(t, out, "fairness: max share / min share")
	assert.Contains(t, out, "calls/op")
}

// --sim-real-time reaches the simulated GPU's configuration.
func TestSimRealTimeConfiguresTheSimulatedGPU(t *testing.T) {
	for _, on := range []bool{false, true} {
		ds, err := openDevices(&globalFlags{device: deviceSim, simRealTime: on}, false)
		require.NoError(t, err)
		assert.Equal(t, on, ds.sd.RealTime)
		ds.close()
	}
}

// A child process gets the simulated GPU's flags.
func TestMultiChildArgsCarryTheSimFlags(t *testing.T) {
	o := &childOpts{}
	g := &globalFlags{simCapacity: sizeFlag(4 << 30), simRealTime: true}
	args := o.args(g, deviceSim)
	assert.Contains(t, args, "--sim-real-time")
	assert.Contains(t, args, "--sim-capacity")
	assert.NotContains(t, (&childOpts{}).args(&globalFlags{}, deviceSim), "--sim-real-time")
}

func TestMultiExecRunsChildProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("starts child processes")
	}
	out, errs, status := cli(t, "multi", "--device", "sim", "--exec", "--sim-capacity", "1GiB", "--procs", "2",
		"--ops", "400", "-g", "1", "--json")
	require.Equal(t, exitOK, status, "%s\n%s", out, errs)
	lines := jsonLines(t, out)
	require.Len(t, lines, 2)
	pids := map[string]bool{}
	for _, m := range lines {
		assert.Equal(t, true, m["ok"], "%v", m)
		assert.Equal(t, "0", fmt.Sprint(m["exit_status"]))
		pids[fmt.Sprint(m["pid"])] = true
	}
	assert.Len(t, pids, 2, "two processes")
}

// oomAlloc fails every allocation with pool.ErrOutOfMemory; with during
// set, it runs it first, as if another goroutine's allocation landed
// while the request was in the pool.
type oomAlloc struct {
	allocator
	during func()
}

func (a *oomAlloc) AllocOn(size uint64, s device.Stream) (uintptr, error) {
	if a.during != nil {
		a.during()
	}
	return 0, pool.ErrOutOfMemory
}

// Failures within 90% of the share are counted from the live bytes before
// the request; those still within it when it returned, separately.
func TestStressCountsFailuresWithinTheShare(t *testing.T) {
	sd := sim.New(sim.Config{Shadow: true, Capacity: 1 << 30})
	inner, err := newAllocator(sd, backendVMM, allocOptions{})
	require.NoError(t, err)
	defer func() { require.NoError(t, inner.close()) }()
	cfg := stressConfig{goroutines: 1, ops: 10, slots: 4, verify: verifyNone, seed: 1, share: 1 << 20,
		sizes: func(*rand.Rand) uint64 { return 4096 }}

	rep := newStress(context.Background(), sd, &oomAlloc{allocator: inner}, cfg).run()
	assert.Equal(t, int64(10), rep.OOMsWithin)
	assert.Equal(t, int64(10), rep.OOMsStill, "nothing else allocated meanwhile")

	// Another goroutine's block of a whole share lands during the first
	// request and stays: that request began within the margin and ended
	// above it; the later ones begin above it.
	a := &oomAlloc{allocator: inner}
	s := newStress(context.Background(), sd, a, cfg)
	a.during = func() {
		if s.held.Load() < 1<<20 {
			s.held.Add(1 << 20)
		}
	}
	rep = s.run()
	assert.Equal(t, int64(10), rep.OOMs)
	assert.Equal(t, int64(1), rep.OOMsWithin)
	assert.Zero(t, rep.OOMsStill, "above the margin by the time it returned")
}

// FreeSizedOn is FreeOn for the wrappers above: the embedded allocator's
// would bypass their FreeOn.
func (a *overlapAlloc) FreeSizedOn(ptr uintptr, _ uint64, s device.Stream) error {
	return a.FreeOn(ptr, s)
}

func (a *leakyAlloc) FreeSizedOn(ptr uintptr, _ uint64, s device.Stream) error {
	return a.FreeOn(ptr, s)
}

// The bytes past a block's last whole word are filled and verified too
// (blocks under 4 bytes were not verified at all): a stray write into the
// last byte of a 4 KiB + 3 block, or into a 2-byte block, is corruption.
func TestRunDetectsCorruptionInTheTail(t *testing.T) {
	for _, size := range []string{"4099", "2"} {
		var victim *liveBlock
		withFillHook(t, func(d device.Device, b *liveBlock) {
			if b.id == 5 {
				victim = b
				require.NoError(t, d.(device.ByteSetter).MemsetD8Async(b.ptr+uintptr(b.size-1), ^byte(b.pattern), 1, 0))
			}
		})
		out, _, status := cli(t, "run", "--device", "sim", "--ops", "400", "-g", "1", "--min-size", size, "--max-size", size)
		assert.Equal(t, exitFailed, status, out)
		require.NotNil(t, victim)
		assert.Contains(t, out, "problems 1")
		assert.Contains(t, out, fmt.Sprintf("PROBLEM: corruption: %v: byte at %#x (offset %d)", victim, victim.ptr+uintptr(victim.size-1), victim.size-1))
	}
}
