package fuzz

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/poolmodel"
	"github.com/gpumem/tlsf/pool"
	"github.com/gpumem/tlsf/tlsf"
)

// FuzzPool runs a program of allocations, frees, trims, memory pressure
// and injected driver faults on a pool over a simulated GPU with shadow
// memory, and checks after every operation that:
//
//   - p.Check passes, and the Sim's own Check passes with no violations
//     (no memory freed or unmapped under queued work);
//   - Stats.Reserved equals what the Sim holds for the process (its
//     Mapped bytes; the requested bytes of its linear allocations for a
//     passthrough pool, whose allocations are the driver's own);
//   - Allocated and Allocations equal the live blocks at their size-class
//     sizes;
//   - every error wraps the sentinel the input calls for: a misuse error
//     (zero or huge size, double, interior or foreign free) exactly, and
//     for a valid request only ErrOutOfMemory, ErrTooLarge (a VMM pool's
//     virtual range) or, while faults were injected, the driver's error;
//   - a misuse error changes no statistic but the counters of device
//     calls, out-of-memory events and retries; any other failure changes
//     no live allocation and no counter of allocations and frees, and,
//     before any fault, raises neither reserved memory nor its peak;
//   - no two live blocks overlap, and every live block still holds the
//     pattern written into it at allocation (checked before it is freed,
//     and for all live blocks after each trim);
//
// and at the end, once faults stop, that every live block frees, the pool
// serves again, Trim returns everything, and Close leaves nothing mapped.
//
// Input: a header (backend, caches, capacity, Sim granularity and seed,
// Options, and up to three faults), then operations: an opcode byte (the
// constants below) and its arguments. Seeds are in
// testdata/fuzz/FuzzPool.
func FuzzPool(f *testing.F) {
	f.Fuzz(func(t *testing.T, in []byte) {
		runPool(t, in)
	})
}

// Pool opcodes, one byte each, taken modulo numPoolOps.
const (
	opPAlloc = iota
	opPAlloc2
	opPAlloc3
	opPAllocOn
	opPAllocPitch
	opPFree
	opPFree2
	opPFreeTwice
	opPBadFree
	opPTrim
	opPPressure
	opPFault
	opPHold
	opPUse
	numPoolOps
)

// poolCalls are the driver calls a pool makes; allocCalls those that
// allocate memory (they fail with ErrOutOfMemory as well as with
// ErrInjected).
var (
	poolCalls = []device.Call{
		device.CallMemGetInfo, device.CallMemAlloc, device.CallMemFree, device.CallMemAllocPitch,
		device.CallAddressReserve, device.CallAddressFree, device.CallMemCreate, device.CallMemRelease,
		device.CallMemMap, device.CallMemUnmap, device.CallMemSetAccess, device.CallStreamSynchronize,
		device.CallStreamWaitEvent, device.CallEventCreate, device.CallEventDestroy, device.CallEventRecord,
		device.CallEventQuery, device.CallEventSynchronize,
	}
	allocCalls = []device.Call{device.CallMemAlloc, device.CallMemAllocPitch, device.CallMemCreate, device.CallAddressReserve}
)

// liveBlock is an allocation the program holds.
type liveBlock struct {
	ptr     uintptr
	extent  uint64 // bytes the caller may use: the request, or pitch × height
	rounded uint64 // what Stats counts for it
	stream  device.Stream
	pat     uint32 // the word it is filled with
}

type poolRun struct {
	t        testing.TB
	sd       *sim.Device
	other    *sim.Device // another process on the same GPU
	p        *pool.Pool
	backend  pool.Backend
	sizes    *tlsf.Index // the pool's size classes
	opts     pool.Options
	streams  []device.Stream
	live     []liveBlock
	freed    []uintptr // recently freed pointers, newest last
	nextPat  uint32
	faulted  bool                   // a fault was set at some point
	faults   map[device.Call]bool   // the kinds ever faulted
	occupied uint64                 // bytes taken with Occupy
	held     map[device.Stream]bool // streams held with HoldStream
	checks   int
}

func runPool(t testing.TB, in []byte) {
	r := &reader{b: in}
	backend := pick(r, pool.BackendVMM, pool.BackendChunks, pool.BackendPassthrough)
	cacheOff := r.bool()
	capacity := pick(r, uint64(64<<20), 256<<20, 1<<30)
	gran := pick(r, uint64(2<<20), 512<<10, 1<<20) // a VMM pool walks its pages in Check: not too many
	sd := sim.New(sim.Config{Capacity: capacity, Granularity: gran, Shadow: true, Seed: uint64(r.u8())})
	opts := pool.Options{
		Backend:           backend,
		GrowFraction:      pick(r, 0, 1.0/4096, 1.0/64, 0.25, 1),
		ReleaseFraction:   pick(r, 0, 0.005, 0.25, 1),
		MaxFraction:       pick(r, 0, 0.5, 0.9, 1),
		MaxBytes:          pick(r, 0, capacity/4, capacity/2, 2*capacity),
		InitialFraction:   pick(r, 0, 0, 0.01, 0.2),
		FreeFloorFraction: pick(r, 0, 0.5),
		NoScavenger:       true, // driver calls only from the ops: faults land where the input says
		SLLog2:            pick(r, uint(0), 1, 3, 6),
		VirtualSize:       pick(r, 0, capacity/2, 2*capacity),
		Cache: pool.CacheOptions{
			Disable:     cacheOff,
			Eager:       !cacheOff, // one goroutine never engages them otherwise
			MaxSize:     pick(r, uint64(0), 4096, 256<<10),
			MaxFraction: pick(r, 0, 0.01, 1),
		},
	}
	// Good fit where the input picked 256 KiB caches: both placements are
	// fuzzed, and inputs decode as they did before best fit was the
	// default.
	opts.GoodFit = opts.Cache.MaxSize == 256<<10
	run := &poolRun{t: t, sd: sd, other: sd.NewProcess(), backend: backend, opts: opts, nextPat: 0x5eed0000,
		faults: map[device.Call]bool{}, held: map[device.Stream]bool{}}
	run.streams = []device.Stream{0}
	for range 2 {
		s, err := sd.StreamCreate()
		if err != nil {
			t.Fatal(err)
		}
		run.streams = append(run.streams, s)
	}
	faultsFirst := r.bool()
	nFaults := r.intn(4)
	if faultsFirst {
		for range nFaults {
			run.fault(r)
		}
	}
	p, err := pool.New(sd, opts)
	if err != nil {
		if !errors.Is(err, pool.ErrBadOptions) && !(run.faulted && isDeviceError(err)) {
			t.Fatalf("New(%+v): %v", opts, err)
		}
		// A failed New returns what it took, unless returning it failed
		// too: then nothing is left to retry with.
		cleanupFaulted := run.faults[device.CallMemRelease] || run.faults[device.CallMemUnmap] || run.faults[device.CallMemFree]
		if m := sd.Mapped(); m != 0 && !cleanupFaulted {
			t.Fatalf("New failed with %v and left %d bytes mapped", err, m)
		}
		return
	}
	run.p = p
	run.sizes, err = tlsf.New(tlsf.Config{Granularity: 256, SLLog2: opts.SLLog2 + 6*boolInt(opts.SLLog2 == 0)})
	if err != nil {
		t.Fatal(err)
	}
	if !faultsFirst {
		for range nFaults {
			run.fault(r)
		}
	}
	run.check("New")
	for n := 0; n < maxOps && r.more(); n++ {
		name := run.step(r, int(r.u8())%numPoolOps)
		run.check(fmt.Sprintf("op %d: %s", n, name))
	}
	run.finish()
}

func boolInt(b bool) uint {
	if b {
		return 1
	}
	return 0
}

// isDeviceError reports whether err carries a driver error (injected, or
// the driver's out-of-memory).
func isDeviceError(err error) bool {
	return errors.Is(err, device.ErrInjected) || errors.Is(err, device.ErrOutOfMemory)
}

// fault decodes one fault and sets it on the Sim.
func (run *poolRun) fault(r *reader) {
	c := poolCalls[r.intn(len(poolCalls))]
	err := device.ErrInjected
	if slices.Contains(allocCalls, c) && r.bool() {
		err = device.ErrOutOfMemory
	}
	if r.bool() {
		run.sd.FailRate(c, pick(r, 0.01, 0.1, 0.5), err)
	} else {
		run.sd.FailNth(c, 1+uint64(r.intn(32)), err)
	}
	run.faulted = true
	run.faults[c] = true
}

func (run *poolRun) step(r *reader, op int) string {
	switch op {
	case opPAlloc, opPAlloc2, opPAlloc3:
		size := r.size(256, pick(r, uint(16), 22, 31))
		run.alloc(size, 0)
		return fmt.Sprintf("Alloc(%d)", size)
	case opPAllocOn:
		s := run.streams[r.intn(len(run.streams))]
		size := r.size(256, 20)
		run.alloc(size, s)
		return fmt.Sprintf("AllocOn(%d, %#x)", size, uintptr(s))
	case opPAllocPitch:
		w, h := 1+uint64(r.u16()), 1+uint64(r.u8())
		switch r.u8() % 8 {
		case 0:
			w = 0
		case 1:
			h = 0
		case 2:
			w, h = 1<<32, 1<<32+1
		}
		run.allocPitch(w, h)
		return fmt.Sprintf("AllocPitch(%d, %d)", w, h)
	case opPFree, opPFree2:
		if len(run.live) == 0 {
			return "nothing to free"
		}
		b := run.live[r.intn(len(run.live))]
		run.free(b)
		return fmt.Sprintf("Free(%#x)", b.ptr)
	case opPFreeTwice:
		if len(run.live) == 0 {
			return "nothing to free twice"
		}
		b := run.live[r.intn(len(run.live))]
		if !run.free(b) {
			return "free failed"
		}
		run.check("first free")
		run.misuse(fmt.Sprintf("second Free(%#x)", b.ptr), []error{pool.ErrDoubleFree}, func() error { return run.p.FreeOn(b.ptr, b.stream) })
		return fmt.Sprintf("Free(%#x) twice", b.ptr)
	case opPBadFree:
		return run.badFree(r)
	case opPTrim:
		before := run.p.Stats()
		n, err := run.p.Trim()
		if err != nil {
			run.failed("Trim", err, before)
		}
		run.verifyAll("Trim")
		return fmt.Sprintf("Trim() = %d", n)
	case opPPressure:
		free, _, _ := run.other.MemGetInfo()
		if r.bool() && run.occupied > 0 {
			run.sd.Vacate(run.occupied)
			run.occupied = 0
			return "Vacate"
		}
		n := free / 256 * uint64(1+r.intn(256)) / 256 * 256
		if err := run.sd.Occupy(n); err == nil {
			run.occupied += n
		}
		return fmt.Sprintf("Occupy(%d)", n)
	case opPFault:
		if r.bool() {
			run.sd.ClearFaults()
			return "ClearFaults"
		}
		run.fault(r)
		return "fault"
	case opPHold:
		s := run.streams[1+r.intn(len(run.streams)-1)]
		if r.bool() {
			if err := run.sd.HoldStream(s); err != nil {
				run.t.Fatal(err)
			}
			run.held[s] = true
			return fmt.Sprintf("HoldStream(%#x)", uintptr(s))
		}
		run.release(s)
		return fmt.Sprintf("ReleaseStream(%#x)", uintptr(s))
	case opPUse:
		// Work on a live block's stream: a new pattern, queued behind a
		// hold if its stream is held.
		if len(run.live) == 0 {
			return "nothing to use"
		}
		i := r.intn(len(run.live))
		run.fill("use", &run.live[i])
		return fmt.Sprintf("use %#x on %#x", run.live[i].ptr, uintptr(run.live[i].stream))
	}
	panic("unreachable")
}

// misuseErrors are the sentinels of bad input: they change nothing.
var misuseErrors = []error{pool.ErrInvalidSize, pool.ErrTooLarge, pool.ErrDoubleFree, pool.ErrUnknownPointer, pool.ErrClosed, pool.ErrBadOptions}

func (run *poolRun) alloc(size uint64, s device.Stream) {
	name := fmt.Sprintf("AllocOn(%d, %#x)", size, uintptr(s))
	if size == 0 {
		run.misuse(name, []error{pool.ErrInvalidSize}, func() error { _, err := run.p.AllocOn(size, s); return err })
		return
	}
	if size > tlsf.MaxSize {
		run.misuse(name, []error{pool.ErrTooLarge}, func() error { _, err := run.p.AllocOn(size, s); return err })
		return
	}
	before := run.p.Stats()
	ptr, err := run.p.AllocOn(size, s)
	if err != nil {
		if errors.Is(err, pool.ErrTooLarge) {
			// Only a VMM pool refuses a valid size as too large: one above
			// its virtual range. It must change nothing.
			if run.backend != pool.BackendVMM {
				run.t.Fatalf("%s: %v", name, err)
			}
			run.unchanged(name, err, before)
			return
		}
		run.failed(name, err, before)
		return
	}
	run.placed(name, liveBlock{ptr: ptr, extent: size, rounded: run.blockSize(size, s), stream: s})
}

// blockSize is the size Stats count a block of size bytes allocated on
// stream s at (poolmodel.BlockSize).
func (run *poolRun) blockSize(size uint64, s device.Stream) uint64 {
	return poolmodel.BlockSize(run.opts, func(n uint64) uint64 { _, r := run.sizes.SizeClass(n); return r }, size, s)
}

func (run *poolRun) allocPitch(w, h uint64) {
	name := fmt.Sprintf("AllocPitch(%d, %d)", w, h)
	do := func() error { _, _, err := run.p.AllocPitch(w, h); return err }
	switch {
	case w == 0 || h == 0:
		run.misuse(name, []error{pool.ErrInvalidSize}, do)
		return
	case w > tlsf.MaxSize || h > tlsf.MaxSize/w:
		run.misuse(name, []error{pool.ErrTooLarge}, do)
		return
	}
	before := run.p.Stats()
	ptr, pitch, err := run.p.AllocPitch(w, h)
	if err != nil {
		run.failed(name, err, before)
		return
	}
	if pitch < w || pitch%512 != 0 || ptr%512 != 0 { // the Sim's pitch unit
		run.t.Fatalf("%s: pointer %#x, pitch %d", name, ptr, pitch)
	}
	_, rounded := run.sizes.SizeClass(pitch * h)
	run.placed(name, liveBlock{ptr: ptr, extent: pitch * h, rounded: rounded})
}

// placed checks a new block against the live ones and fills it.
func (run *poolRun) placed(name string, b liveBlock) {
	t := run.t
	if b.ptr%256 != 0 {
		t.Fatalf("%s: pointer %#x not 256-byte aligned", name, b.ptr)
	}
	for _, o := range run.live {
		if b.ptr < o.ptr+uintptr(o.extent) && o.ptr < b.ptr+uintptr(b.extent) {
			t.Fatalf("%s: [%#x +%d) overlaps live [%#x +%d)", name, b.ptr, b.extent, o.ptr, o.extent)
		}
	}
	run.fill(name, &b)
	run.live = append(run.live, b)
	run.freed = slices.DeleteFunc(run.freed, func(p uintptr) bool { return p == b.ptr })
}

// fill writes a new pattern into block b on its stream, as a kernel
// would: queued if the stream is held. On the default stream the write is
// synchronous (cuMemsetD32).
func (run *poolRun) fill(name string, b *liveBlock) {
	run.nextPat++
	b.pat = run.nextPat
	var err error
	if b.stream == 0 {
		err = run.sd.MemsetD32(b.ptr, b.pat, b.extent/4)
	} else {
		err = run.sd.MemsetD32Async(b.ptr, b.pat, b.extent/4, b.stream)
	}
	if err != nil {
		run.t.Fatalf("%s: block [%#x +%d) cannot be written: %v", name, b.ptr, b.extent, err)
	}
}

func (run *poolRun) release(s device.Stream) {
	if err := run.sd.ReleaseStream(s); err != nil {
		run.t.Fatal(err)
	}
	delete(run.held, s)
}

// free frees a live block, after checking its contents, and reports
// whether the pool accepted it.
func (run *poolRun) free(b liveBlock) bool {
	name := fmt.Sprintf("FreeOn(%#x, %#x)", b.ptr, uintptr(b.stream))
	run.verify(name, b)
	before := run.p.Stats()
	if err := run.p.FreeOn(b.ptr, b.stream); err != nil {
		run.failed(name, err, before)
		return false
	}
	run.live = slices.DeleteFunc(run.live, func(o liveBlock) bool { return o.ptr == b.ptr })
	run.freed = append(run.freed, b.ptr)
	if len(run.freed) > 16 {
		run.freed = run.freed[1:]
	}
	return true
}

func (run *poolRun) badFree(r *reader) string {
	switch r.u8() % 3 {
	case 0:
		if len(run.live) > 0 {
			b := run.live[r.intn(len(run.live))]
			if b.extent > 1 {
				ptr := b.ptr + uintptr(1+r.u64()%(b.extent-1))
				run.misuse(fmt.Sprintf("Free(%#x) inside [%#x +%d)", ptr, b.ptr, b.extent), []error{pool.ErrUnknownPointer},
					func() error { return run.p.Free(ptr) })
				return "interior free"
			}
		}
	case 1:
		if len(run.freed) > 0 {
			ptr := run.freed[r.intn(len(run.freed))]
			// Freed earlier: the memory may since have gone back to the
			// driver, which makes the pointer unknown.
			run.misuse(fmt.Sprintf("late second Free(%#x)", ptr), []error{pool.ErrDoubleFree, pool.ErrUnknownPointer},
				func() error { return run.p.Free(ptr) })
			return "late double free"
		}
	}
	// A pointer far from anything the pool holds (not 0: Free(0) is a no-op).
	ptr := pick(r, uintptr(256), 0x1000, 1<<40, ^uintptr(0)&^255, ^uintptr(0))
	run.misuse(fmt.Sprintf("Free(%#x)", ptr), []error{pool.ErrUnknownPointer}, func() error { return run.p.Free(ptr) })
	return "foreign free"
}

// comparable strips the statistics a failed call may change.
func comparable(s pool.Stats) pool.Stats {
	s.DeviceCalls, s.DeviceCallsByPath = device.Counts{}, pool.PathCounts{}
	s.OutOfMemory, s.Retries = 0, 0
	return s
}

// misuse runs f, which must fail with one of want and change nothing.
func (run *poolRun) misuse(name string, want []error, f func() error) {
	before := run.p.Stats()
	err := f()
	if !slices.ContainsFunc(want, func(w error) bool { return errors.Is(err, w) }) {
		run.t.Fatalf("%s: got %v, want one of %v", name, err, want)
	}
	run.unchanged(name, err, before)
}

func (run *poolRun) unchanged(name string, err error, before pool.Stats) {
	if after := run.p.Stats(); comparable(after) != comparable(before) {
		run.t.Fatalf("%s failed with %v but changed the statistics:\nbefore %+v\nafter  %+v", name, err, before, after)
	}
}

// failed checks the failure of a valid call: out of memory, or a driver
// error while faults were set; no live allocation changed.
func (run *poolRun) failed(name string, err error, before pool.Stats) {
	t := run.t
	switch {
	case errors.Is(err, pool.ErrOutOfMemory):
	case run.faulted && errors.Is(err, device.ErrInjected):
	default:
		t.Fatalf("%s: %v", name, err)
	}
	if slices.ContainsFunc(misuseErrors, func(w error) bool { return errors.Is(err, w) }) {
		t.Fatalf("%s: a valid call failed with a misuse error: %v", name, err)
	}
	after := run.p.Stats()
	type live struct {
		allocated, allocatedPeak   uint64
		allocations, allocationsPk int64
		allocs, frees              uint64
		inUse                      uint64
	}
	view := func(s pool.Stats) live {
		return live{s.Allocated, s.AllocatedPeak, s.Allocations, s.AllocationsPeak, s.Allocs, s.Frees, s.Active - s.Pending}
	}
	if view(after) != view(before) {
		t.Fatalf("%s failed with %v but changed live allocations:\nbefore %+v\nafter  %+v", name, err, before, after)
	}
	// Nor does it leave the pool more memory, or a higher peak of it
	// (Pool.allocMiss gives back what a growth for it kept), where no
	// driver call failed that could keep that memory from going back.
	if !run.faulted && (after.Reserved > before.Reserved || after.ReservedPeak > before.ReservedPeak) {
		t.Fatalf("%s failed with %v but raised reserved memory: %d to %d, peak %d to %d", name, err,
			before.Reserved, after.Reserved, before.ReservedPeak, after.ReservedPeak)
	}
}

// deviceBytes is what the Sim holds for the pool: Stats.Reserved must
// equal it.
func (run *poolRun) deviceBytes() uint64 {
	if run.backend == pool.BackendPassthrough {
		return run.sd.Stats().LinearBytes
	}
	return run.sd.Mapped()
}

func (run *poolRun) check(when string) {
	t := run.t
	if err := run.p.Check(); err != nil {
		t.Fatalf("%s: Check: %v", when, err)
	}
	if run.checks++; run.checks%8 == 0 { // the Sim's Check is costly
		if err := run.sd.Check(); err != nil {
			t.Fatalf("%s: Sim Check: %v", when, err)
		}
	}
	if v := run.sd.Violations(); len(v) > 0 {
		t.Fatalf("%s: Sim violations: %q", when, v)
	}
	st := run.p.Stats()
	if dev := run.deviceBytes(); st.Reserved != dev {
		t.Fatalf("%s: Reserved %d, the device holds %d for the pool", when, st.Reserved, dev)
	}
	var allocated uint64
	for _, b := range run.live {
		allocated += b.rounded
	}
	if st.Allocated != allocated || st.Allocations != int64(len(run.live)) {
		t.Fatalf("%s: Allocated %d in %d, live blocks hold %d in %d", when, st.Allocated, st.Allocations, allocated, len(run.live))
	}
}

// verify checks that block b still holds its pattern: its first and last
// bytes and samples in between.
func (run *poolRun) verify(when string, b liveBlock) {
	words := b.extent / 4
	if words == 0 || b.stream != 0 && len(run.held) > 0 {
		// Nothing written, or the writes may still be queued: behind a
		// hold, or behind an event of a held stream. Writes on the default
		// stream are synchronous.
		return
	}
	const sample = 64
	n := words * 4
	offs := []uint64{0}
	for k := uint64(1); k < 8; k++ {
		offs = append(offs, n*k/8&^3)
	}
	offs = append(offs, n-min(n, sample))
	var want [4]byte
	binary.LittleEndian.PutUint32(want[:], b.pat)
	buf := make([]byte, sample)
	for _, off := range offs {
		got := buf[:min(sample, n-off)]
		if err := run.sd.MemcpyDtoH(got, b.ptr+uintptr(off)); err != nil {
			run.t.Fatalf("%s: reading live block [%#x +%d) at +%d: %v", when, b.ptr, b.extent, off, err)
		}
		for i := 0; i < len(got); i += 4 {
			if !bytes.Equal(got[i:i+4], want[:]) {
				run.t.Fatalf("%s: live block [%#x +%d) clobbered at +%d: % x, want % x", when, b.ptr, b.extent, off+uint64(i), got[i:i+4], want)
			}
		}
	}
}

func (run *poolRun) verifyAll(when string) {
	for _, b := range run.live {
		run.verify(when, b)
	}
}

// finish stops the faults and the pressure, frees everything, checks the
// pool serves again and returns all memory, and closes it.
func (run *poolRun) finish() {
	t, p := run.t, run.p
	run.sd.ClearFaults()
	for s := range run.held {
		run.release(s)
	}
	if run.occupied > 0 {
		run.sd.Vacate(run.occupied)
		run.occupied = 0
	}
	run.verifyAll("finish")
	for len(run.live) > 0 {
		b := run.live[0]
		if err := p.FreeOn(b.ptr, b.stream); err != nil {
			t.Fatalf("finish: FreeOn(%#x) without faults: %v", b.ptr, err)
		}
		run.live = run.live[1:]
		run.check("finish: free")
	}
	for _, size := range []uint64{4096, 3 << 20} {
		ptr, err := p.Alloc(size)
		if err != nil {
			t.Fatalf("finish: Alloc(%d) on an empty pool without faults: %v", size, err)
		}
		run.placed("finish", liveBlock{ptr: ptr, extent: size, rounded: run.blockSize(size, 0)})
		run.check("finish: alloc")
	}
	for _, b := range run.live {
		run.verify("finish", b)
		if err := p.Free(b.ptr); err != nil {
			t.Fatalf("finish: Free(%#x): %v", b.ptr, err)
		}
	}
	run.live = nil
	if _, err := p.Trim(); err != nil {
		t.Fatalf("finish: Trim: %v", err)
	}
	run.check("finish: trim")
	if st := p.Stats(); st.Reserved != 0 || st.Active != 0 || st.Cached != 0 {
		t.Fatalf("finish: nothing live after Trim, yet %+v", st)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("finish: Close: %v", err)
	}
	if m := run.sd.Mapped(); m != 0 {
		t.Fatalf("finish: %d bytes still mapped after Close", m)
	}
	if err := run.sd.Check(); err != nil {
		t.Fatalf("finish: Sim Check: %v", err)
	}
	if st := run.sd.Stats(); st.Handles != 0 || st.LinearAllocs != 0 || st.Reservations != 0 || st.Events != 0 {
		t.Fatalf("finish: after Close the Sim holds %+v", st)
	}
	if v := run.sd.Violations(); len(v) > 0 {
		t.Fatalf("finish: Sim violations: %q", v)
	}
	if _, err := p.Alloc(256); !errors.Is(err, pool.ErrClosed) {
		t.Fatalf("Alloc after Close: %v", err)
	}
}
