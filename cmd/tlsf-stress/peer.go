package main

// run --devices: the stress workload across several GPUs of one host.
//
// One pool per listed device (pool.Devices), each granting every other
// listed device access to its memory (pool.Options.PeerAccess). Goroutine
// g allocates a block A on device list[g mod n] and a block B of the same
// size on device list[(g+1) mod n], fills A with its pattern on A's device
// (cuMemsetD32), copies A into B with a cuMemcpyDtoDAsync issued on B's
// device (so B's device reads A's memory through the peer mapping), and
// keeps the pair in a slot; freeing a pair first reads B back on its
// device (cuMemcpyDtoH, whole or sampled) and checks every word. A copy
// refused for want of access, a wrong word or an overlap is a problem.
// With one device (--devices 0) A and B are on the same GPU and the
// workload is run's with a device-to-device copy added.
//
// After the workload, the copy bandwidth of pool blocks is measured
// against that of plain cuMemAlloc blocks on the same devices with peer
// access enabled (cuCtxEnablePeerAccess): what cudaMemcpyPeer does
// between cudaMalloc blocks when peer access is on. Only on a GPU: the
// simulated device's times would be host time, not a measurement.

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/cuda"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
	"github.com/spf13/cobra"
)

// parseDevices parses --devices: distinct ordinals 0 to 63, comma-separated.
func parseDevices(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		k, err := strconv.Atoi(f)
		if err != nil || k < 0 || k > 63 {
			return nil, usagef("--devices %q: %q is not a device ordinal (0 to 63)", s, f)
		}
		if slices.Contains(out, k) {
			return nil, usagef("--devices %q: device %d given twice", s, k)
		}
		out = append(out, k)
	}
	return out, nil
}

// poolBackend returns the pool backend of name, one of the pool's own
// backends (tlsf-vmm, tlsf-chunks, passthrough); false for any other.
func poolBackend(name string) (pool.Backend, bool) {
	switch name {
	case backendVMM:
		return pool.BackendVMM, true
	case backendChunks:
		return pool.BackendChunks, true
	case backendPassthrough:
		return pool.BackendPassthrough, true
	}
	return pool.BackendAuto, false
}

// peerDevices are the opened devices of --devices, in list order.
type peerDevices struct {
	kind  string
	note  string
	ords  []int
	devs  []device.Device
	close func()
}

// openPeerDevices opens the listed ordinals: CUDA GPUs (cuda.Open), or
// the GPUs of a simulated host (sim.NewHost with contents kept), with
// --device's fallback rule.
func openPeerDevices(g *globalFlags, ords []int) (*peerDevices, error) {
	pd := &peerDevices{kind: g.device, ords: ords}
	if pd.kind != deviceSim {
		var opened []*cuda.Device
		closeAll := func() {
			for _, d := range opened {
				_ = d.Close()
			}
		}
		for _, k := range ords {
			d, err := cuda.Open(k)
			if err != nil {
				closeAll()
				if pd.kind == "" && len(opened) == 0 && (errors.Is(err, device.ErrNoDriver) || errors.Is(err, device.ErrNoDevice)) {
					pd.kind = deviceSim
					pd.note = fmt.Sprintf("no CUDA GPU %d (%v): using a simulated host", k, err)
					break
				}
				return nil, fmt.Errorf("opening CUDA device %d: %w", k, err)
			}
			opened = append(opened, d)
			pd.devs = append(pd.devs, d)
		}
		if pd.kind != deviceSim {
			pd.kind, pd.close = deviceCUDA, closeAll
			return pd, nil
		}
		pd.devs = nil
	}
	h := sim.NewHost(slices.Max(ords)+1, sim.Config{Shadow: true, Capacity: uint64(g.simCapacity)})
	for _, k := range ords {
		pd.devs = append(pd.devs, h.Device(k))
	}
	pd.close = func() {
		for _, d := range h.Devices() {
			_ = d.Close()
		}
	}
	return pd, nil
}

// peerResult is run --devices's outcome: its --json object (doc.go).
type peerResult struct {
	Device              string             `json:"device"`
	DeviceKind          string             `json:"device_kind"`
	Devices             []int              `json:"devices"`
	Backend             string             `json:"backend"`
	Goroutines          int                `json:"goroutines"`
	Verify              string             `json:"verify"`
	Ops                 int64              `json:"ops"`
	Allocs              int64              `json:"allocs"`
	Frees               int64              `json:"frees"`
	OutOfMemory         int64              `json:"out_of_memory"`
	Copies              int64              `json:"copies"`
	PeerCopies          int64              `json:"peer_copies"`
	CopiedBytes         uint64             `json:"copied_bytes"`
	ElapsedSeconds      float64            `json:"elapsed_s"`
	OpsPerSecond        float64            `json:"ops_per_s"`
	VerifiedBlocks      int64              `json:"verified_blocks"`
	VerifiedBytes       uint64             `json:"verified_bytes"`
	PeakLiveBytes       uint64             `json:"peak_live_bytes"`
	PerDevice           []peerDeviceResult `json:"per_device"`
	WorkloadDeviceCalls uint64             `json:"workload_device_calls"`
	CopyBytes           uint64             `json:"copy_bench_bytes"`
	PoolCopyGBps        float64            `json:"pool_copy_gbps"`
	PlainCopyGBps       float64            `json:"plain_copy_gbps"`
	CopyRatio           float64            `json:"copy_ratio"`
	ProblemCount        int64              `json:"problem_count"`
	Problems            []string           `json:"problems"`
	ErrorCount          int64              `json:"error_count"`
	Errors              []string           `json:"errors"`
	Interrupted         bool               `json:"interrupted,omitempty"` // as runResult's
	OK                  bool               `json:"ok"`
}

// peerDeviceResult is one device's pool figures.
type peerDeviceResult struct {
	Ordinal           int               `json:"ordinal"`
	PeakReservedBytes uint64            `json:"peak_reserved_bytes"`
	DeviceCalls       uint64            `json:"device_calls"`
	DeviceCallsByName map[string]uint64 `json:"device_calls_by_name"`
	PeerAccess        []int             `json:"peer_access"`
}

// peerRun is one running --devices workload. It borrows stress's
// bookkeeping (operation budget, live ranges, patterns, problems).
type peerRun struct {
	s     *stress
	devs  []device.Device
	pas   []device.PeerAccessor
	pools []*pool.Pool

	copies, peerCopies atomic.Int64
	copied             atomic.Uint64
}

// peerPair is a live pair: A filled on its device, B its copy.
type peerPair struct {
	a, b     *liveBlock
	src, dst int // indexes into devs
}

func runPeer(cmd *cobra.Command, g *globalFlags, o *runOpts, ords []int) error {
	out, errw := cmd.OutOrStdout(), cmd.ErrOrStderr()
	be, ok := poolBackend(o.backend)
	if !ok {
		return usagef("--devices takes a pool backend (tlsf-vmm, tlsf-chunks, passthrough), not %q", o.backend)
	}
	pd, err := openPeerDevices(g, ords)
	if err != nil {
		return err
	}
	defer pd.close()
	if pd.note != "" {
		fmt.Fprintln(errw, "tlsf-stress:", pd.note)
	}
	r := &peerRun{devs: pd.devs}
	for _, d := range pd.devs {
		pa, ok := d.(device.PeerAccessor)
		if !ok {
			return fmt.Errorf("device %d (%s) has no peer access", d.Ordinal(), d.Name())
		}
		r.pas = append(r.pas, pa)
	}
	total, err := deviceTotal(pd.devs[0])
	if err != nil {
		return err
	}
	cfg, err := o.config(total)
	if err != nil {
		return err
	}
	peers, err := pool.DeviceSetOf(ords...)
	if err != nil {
		return usagef("%v", err)
	}
	byOrd := map[int]device.Device{}
	for _, d := range pd.devs {
		byOrd[d.Ordinal()] = d
	}
	po := g.pool // --conf
	po.Backend, po.MaxBytes, po.PeerAccess = be, o.cap.resolve(total), peers
	ps, err := pool.NewDevicesOn(func(k int) (device.Device, error) {
		if d := byOrd[k]; d != nil {
			return d, nil
		}
		return nil, device.ErrNoDevice
	}, po)
	if err != nil {
		return err
	}
	for _, k := range ords {
		p, err := ps.Get(k)
		if err != nil {
			_ = ps.Close()
			return err
		}
		r.pools = append(r.pools, p)
	}
	r.s = newStress(cmd.Context(), nil, nil, cfg)
	stopProgress := showProgress(errw, r.s, &o.workloadFlags)
	rep := r.run()
	stopProgress()
	res := r.summarize(pd, o, rep)
	res.Interrupted = cmd.Context().Err() != nil
	if pd.kind == deviceCUDA && !res.Interrupted {
		r.bench(res)
	}
	if err := ps.Close(); err != nil {
		res.ErrorCount++
		res.Errors = append(res.Errors, "closing the pools: "+err.Error())
	}
	res.OK = res.ProblemCount == 0 && res.ErrorCount == 0
	if o.json {
		if err := json.NewEncoder(out).Encode(res); err != nil {
			return err
		}
	} else {
		printPeerSummary(out, res)
	}
	if !res.OK {
		return errFailed
	}
	return nil
}

// run runs the workload (see the file comment) and returns the report.
func (r *peerRun) run() *stressReport {
	s := r.s
	start := s.runWorkers(func(g int) {
		defer func() {
			if p := recover(); p != nil {
				s.error("goroutine %d: panic: %v", g, p)
			}
		}()
		r.worker(g)
	})
	return s.report(start, func() {
		for i, p := range r.pools {
			if err := (poolAlloc{p}).checkEmpty(); err != nil {
				s.problem("device %d: %v", r.devs[i].Ordinal(), err)
			}
			if sd, ok := r.devs[i].(*sim.Device); ok {
				for _, v := range sd.Violations() {
					s.problem("simulated device %d: %s", sd.Ordinal(), v)
				}
			}
		}
	})
}

// worker is goroutine g's loop: pairs from device list[g mod n] to
// list[(g+1) mod n], each counting twice its size against the budget.
func (r *peerRun) worker(g int) {
	n := len(r.devs)
	src, dst := g%n, (g+1)%n
	buf := r.s.verifyBuf()
	slotLoop(r.s, g, 2,
		func(size uint64) *peerPair { return r.alloc(size, src, dst) },
		func(pr *peerPair) { r.verifyFree(pr, buf) })
}

// allocBlock allocates and registers a block of size bytes on pool i.
func (r *peerRun) allocBlock(i int, size uint64) *liveBlock {
	s := r.s
	ptr, err := r.pools[i].Alloc(size)
	if err != nil {
		s.allocFailed(err, "allocating %d bytes on device %d", size, r.devs[i].Ordinal())
		return nil
	}
	b, o := s.register(ptr, size)
	if o != nil {
		s.problem("overlap: %v was handed out while %v is live", b, o)
	}
	s.addLive(size)
	return b
}

// freeBlock unregisters and frees b on pool i.
func (r *peerRun) freeBlock(i int, b *liveBlock) {
	s := r.s
	s.unregister(b)
	if err := r.pools[i].Free(b.ptr); err != nil {
		s.error("freeing %v on device %d: %v", b, r.devs[i].Ordinal(), err)
		return
	}
	s.frees.Add(1)
}

// alloc makes a pair: A on src filled with its pattern, B on dst holding
// A's copy (B keeps A's pattern: verification checks B against it).
func (r *peerRun) alloc(size uint64, src, dst int) *peerPair {
	s := r.s
	a := r.allocBlock(src, size)
	if a == nil {
		return nil
	}
	b := r.allocBlock(dst, size)
	if b == nil {
		r.freeBlock(src, a)
		return nil
	}
	s.patterns.CompareAndDelete(b.pattern, b)
	b.pattern = a.pattern
	n := size / 4 * 4
	if n > 0 {
		if err := s.call(device.CallMemsetD32, r.devs[src].MemsetD32(a.ptr, a.pattern, n/4)); err != nil {
			s.error("filling %v on device %d: %v", a, r.devs[src].Ordinal(), err)
		}
		// cuMemsetD32 returns before the GPU is done, and nothing orders
		// one device's default stream after another's: wait for the fill.
		if src != dst {
			if err := s.call(device.CallStreamSynchronize, r.devs[src].StreamSynchronize(0)); err != nil {
				s.error("waiting for the fill of %v on device %d: %v", a, r.devs[src].Ordinal(), err)
			}
		}
		err := s.call(device.CallMemcpyDtoDAsync, r.pas[dst].MemcpyDtoDAsync(b.ptr, a.ptr, n, 0))
		if err != nil {
			s.problem("copy on device %d from %v (device %d) to %v: %v", r.devs[dst].Ordinal(), a, r.devs[src].Ordinal(), b, err)
		} else {
			r.copies.Add(1)
			if src != dst {
				r.peerCopies.Add(1)
			}
			r.copied.Add(n)
		}
	}
	return &peerPair{a: a, b: b, src: src, dst: dst}
}

// verifyFree reads B back on its device, checks it against A's pattern,
// and frees both blocks.
func (r *peerRun) verifyFree(pr *peerPair, buf []byte) {
	s := r.s
	if n := pr.b.size / 4 * 4; n > 0 && s.cfg.verify != verifyNone {
		r.verify(pr, buf, n) // cuMemcpyDtoH waits for the copy
	} else if err := s.call(device.CallStreamSynchronize, r.devs[pr.dst].StreamSynchronize(0)); err != nil {
		// A's pool orders its free on A's device only: the copy, on B's,
		// must be done before A is freed.
		s.error("waiting for the copy into %v on device %d: %v", pr.b, r.devs[pr.dst].Ordinal(), err)
	}
	r.freeBlock(pr.src, pr.a)
	r.freeBlock(pr.dst, pr.b)
}

func (r *peerRun) verify(pr *peerPair, buf []byte, n uint64) {
	s, b, d := r.s, pr.b, r.devs[pr.dst]
	for _, sp := range s.spans(n, len(buf)-3) {
		part := buf[:sp.n]
		// cuMemcpyDtoH on the legacy default stream waits for the copy.
		if err := s.call(device.CallMemcpyDtoH, d.MemcpyDtoH(part, b.ptr+uintptr(sp.off))); err != nil {
			s.error("reading back %v on device %d at offset %d: %v", b, d.Ordinal(), sp.off, err)
			return
		}
		s.verifiedBytes.Add(sp.n)
		for i := 0; i+4 <= len(part); i += 4 {
			if got := binary.LittleEndian.Uint32(part[i:]); got != b.pattern {
				s.problem("corruption: copy %v on device %d of %v on device %d: word at offset %d holds %#08x",
					b, d.Ordinal(), pr.a, r.devs[pr.src].Ordinal(), sp.off+uint64(i), got)
				return
			}
		}
	}
	s.verifiedBlocks.Add(1)
}

// summarize builds the outcome; the pools must still be open.
func (r *peerRun) summarize(pd *peerDevices, o *runOpts, rep *stressReport) *peerResult {
	problems, errs, opsPerSecond := rep.outcome()
	res := &peerResult{
		Device: pd.devs[0].Name(), DeviceKind: pd.kind, Devices: pd.ords, Backend: o.backend,
		Goroutines: o.goroutines, Verify: o.verify,
		Ops: rep.Ops, Allocs: rep.Allocs, Frees: rep.Frees, OutOfMemory: rep.OOMs,
		Copies: r.copies.Load(), PeerCopies: r.peerCopies.Load(), CopiedBytes: r.copied.Load(),
		ElapsedSeconds: rep.Elapsed.Seconds(), OpsPerSecond: opsPerSecond,
		VerifiedBlocks: rep.VerifiedBlocks, VerifiedBytes: rep.VerifiedBytes,
		PeakLiveBytes: rep.PeakLive, WorkloadDeviceCalls: rep.WorkCalls.Total(),
		ProblemCount: rep.ProblemCount, Problems: problems, ErrorCount: rep.ErrorCount, Errors: errs,
	}
	for i, p := range r.pools {
		st := p.Stats()
		peers := p.PeerAccess()
		if peers == nil {
			peers = []int{}
		}
		res.PerDevice = append(res.PerDevice, peerDeviceResult{
			Ordinal: r.devs[i].Ordinal(), PeakReservedBytes: st.ReservedPeak,
			DeviceCalls: st.DeviceCalls.Total(), DeviceCallsByName: st.DeviceCalls.Map(), PeerAccess: peers,
		})
	}
	return res
}

// copyBenchReps is the number of timed copies of each kind.
const copyBenchReps = 20

// bench times copies from device list[0] to list[1 mod n] between pool
// blocks and between plain cuMemAlloc blocks with peer access enabled.
// Failures are reported as errors of the run.
func (r *peerRun) bench(res *peerResult) {
	src, dst := 0, 1%len(r.devs)
	_, total, err := r.devs[src].MemGetInfo()
	if err != nil {
		res.ErrorCount++
		res.Errors = append(res.Errors, "copy benchmark: "+err.Error())
		return
	}
	size := min(uint64(256<<20), total/16) &^ 4095
	res.CopyBytes = size
	timeCopies := func(dstPtr, srcPtr uintptr) (float64, error) {
		d, pa := r.devs[dst], r.pas[dst]
		if err := pa.MemcpyDtoDAsync(dstPtr, srcPtr, size, 0); err != nil { // warm-up
			return 0, err
		}
		if err := d.StreamSynchronize(0); err != nil {
			return 0, err
		}
		start := time.Now()
		for range copyBenchReps {
			if err := pa.MemcpyDtoDAsync(dstPtr, srcPtr, size, 0); err != nil {
				return 0, err
			}
		}
		if err := d.StreamSynchronize(0); err != nil {
			return 0, err
		}
		return float64(size) * copyBenchReps / time.Since(start).Seconds() / 1e9, nil
	}
	fail := func(what string, err error) {
		res.ErrorCount++
		res.Errors = append(res.Errors, fmt.Sprintf("copy benchmark, %s: %v", what, err))
	}
	// both allocates a block of size bytes on src and one on dst with
	// alloc, and returns them with release, which frees them with free,
	// dst's first; ok is false, the failure reported as what, when either
	// allocation failed.
	both := func(what string, alloc func(i int) (uintptr, error), free func(i int, p uintptr) error) (a, b uintptr, release func(), ok bool) {
		a, err := alloc(src)
		if err != nil {
			fail(what, err)
			return 0, 0, nil, false
		}
		if b, err = alloc(dst); err != nil {
			fail(what, err)
			_ = free(src, a)
			return 0, 0, nil, false
		}
		return a, b, func() { _ = free(dst, b); _ = free(src, a) }, true
	}
	a, b, release, ok := both("pool block",
		func(i int) (uintptr, error) { return r.pools[i].Alloc(size) },
		func(i int, p uintptr) error { return r.pools[i].Free(p) })
	if !ok {
		return
	}
	defer release()
	if res.PoolCopyGBps, err = timeCopies(b, a); err != nil {
		fail("pool blocks", err)
		return
	}
	pa, pb, releasePlain, ok := both("cuMemAlloc",
		func(i int) (uintptr, error) { return r.devs[i].MemAlloc(size) },
		func(i int, p uintptr) error { return r.devs[i].MemFree(p) })
	if !ok {
		return
	}
	defer releasePlain()
	if err := r.pas[src].EnablePeerAccess(r.devs[dst].Ordinal()); err != nil {
		fail("cuCtxEnablePeerAccess", err)
		return
	}
	if res.PlainCopyGBps, err = timeCopies(pb, pa); err != nil {
		fail("cuMemAlloc blocks", err)
		return
	}
	if res.PlainCopyGBps > 0 {
		res.CopyRatio = res.PoolCopyGBps / res.PlainCopyGBps
	}
}

func printPeerSummary(w io.Writer, r *peerResult) {
	fmt.Fprintf(w, "run%s: %d ops in %.2fs (%.0f ops/s) on devices %v, %s (%s), backend %s, %d goroutines\n",
		interruptedNote(r.Interrupted), r.Ops, r.ElapsedSeconds, r.OpsPerSecond, r.Devices, r.Device, r.DeviceKind, r.Backend, r.Goroutines)
	fmt.Fprintf(w, "  allocs %d, frees %d, out of memory %d\n", r.Allocs, r.Frees, r.OutOfMemory)
	fmt.Fprintf(w, "  copies %d (%d between devices), %s copied; verified (%s) %d blocks, %s read back\n",
		r.Copies, r.PeerCopies, gib(r.CopiedBytes), r.Verify, r.VerifiedBlocks, gib(r.VerifiedBytes))
	for _, d := range r.PerDevice {
		fmt.Fprintf(w, "  device %d: peak reserved %s, peer access for %v, device calls %d %s\n",
			d.Ordinal, gib(d.PeakReservedBytes), d.PeerAccess, d.DeviceCalls, formatCalls(d.DeviceCallsByName))
	}
	if r.DeviceKind == deviceCUDA {
		fmt.Fprintf(w, "  copy of %s, %d times: pool blocks %.1f GB/s, cuMemAlloc blocks %.1f GB/s, ratio %.3f\n",
			gib(r.CopyBytes), copyBenchReps, r.PoolCopyGBps, r.PlainCopyGBps, r.CopyRatio)
	}
	fmt.Fprintf(w, "  problems %d, errors %d\n", r.ProblemCount, r.ErrorCount)
	for _, p := range r.Problems {
		fmt.Fprintln(w, "  PROBLEM:", p)
	}
	for _, e := range r.Errors {
		fmt.Fprintln(w, "  ERROR:", e)
	}
}
