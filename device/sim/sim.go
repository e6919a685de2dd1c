package sim

// Sim: a simulated GPU for tests and CI.
//
// Sim implements Device without a GPU. It is the stand-in for every CI test
// of the pool, so it aims at two things: behaving like the driver wherever
// a pool could tell the difference, and being deterministic, so a failing
// test fails the same way twice.
//
// One physical GPU, several processes. A simGPU holds what processes
// share: the capacity, the bytes in use across all of them, and the one
// mutex every Sim method takes. New makes the GPU and its first process;
// NewProcess adds another process (another *Device) on the same GPU. Each
// process has its own address space, handles, streams, counters and
// faults, as a real process has its own CUDA context; only capacity is
// shared, so one process's allocations lower the free memory another sees
// and can make its allocations fail. Occupy and Vacate stand for processes
// outside the test. One lock for all is simple and plenty: Sim is not a
// fast path, and a single lock makes every call atomic, so "a failed call
// changes nothing" holds by validating everything before the first write.
//
// Address space (sim_va.go). Each process owns a 4 TiB window of virtual
// addresses near 0x7f0000000000, where the driver's pointers live on
// x86-64 Linux; windows of different processes are disjoint, so a pointer
// passed to the wrong process faults instead of hitting a stranger's
// allocation. Two GPUs made by separate New calls are separate machines:
// each one's first process has the same window, so their pointers may be
// equal (a test of a pointer from another pool's device needs NewProcess,
// or NewHost for several GPUs of one machine, whose windows are
// disjoint). Linear allocations and VMM reservations both take ranges
// from one lowest-first-fit free list, so they never overlap and freed
// ranges are reused low first, as the driver tends to.
//
// Physical memory. A simPhys is one physical allocation: a linear
// allocation (MemAlloc, MemAllocPitch) or a MemCreate handle. It carries
// the capacity it consumes and, with Config.Shadow, its contents
// (sim_shadow.go): an interval map of 32-bit fill words, so a memset of
// many GiB costs one entry. Contents belong to the physical allocation,
// not to addresses: a handle unmapped and mapped elsewhere keeps them; a
// different handle mapped at the same address does not see them. Memory
// never written reads as Uninitialized.
//
// VMM (sim_vmm.go) follows the driver's rules: mappings only inside
// reservations, whole handles at offset 0, access granted with
// MemSetAccess before memset or copy may touch them, unmaps covering whole
// mappings, and a handle's memory freed only once it is released and
// unmapped everywhere (the driver's reference count).
//
// Streams and events (sim_stream.go). Work runs when it is issued unless a
// test holds its stream (HoldStream) or it waits for an event whose work
// is held. Held work stays queued: events after it report not done, and
// its writes land only when the hold is lifted (ReleaseStream, or a
// synchronize that must wait for it). Vector clocks over streams give the
// happens-before order that events, waits and host synchronisation
// establish; Sim records a violation (Violations) when memory with queued
// work is freed or unmapped, or when work or a host access touches bytes
// that queued work on another stream will write without being ordered
// after it. That is how a pool test catches reuse of memory the GPU still
// uses.
//
// Time (sim_latency.go) is accounted per call from a latency model and
// never slept. Fault injection (sim_fault.go) makes chosen calls fail, by
// count or by a seeded PRNG, without side effects.

import (
	"fmt"
	"math/bits"
	"runtime"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/tlsf/device"
)

// Uninitialized is the 32-bit word that memory never written reads as,
// stored little-endian like any word: bytes 0x0d 0xf0 0xad 0xba repeating
// from every 4-byte aligned address. Without Config.Shadow, all memory
// reads as this.
const Uninitialized uint32 = 0xBAADF00D

// Defaults for Config's zero fields.
const (
	// An H200's memory as nvidia-smi reports it (H200Capacity).
	simDefaultCapacity = H200Capacity
	// 2 MiB: cuMemGetAllocationGranularity (minimum) on every NVIDIA GPU
	// since Pascal, the size of a large GPU page.
	simDefaultGranularity = 2 << 20
	// 512 bytes: cuMemAllocPitch rounds pitches to 512 on current GPUs
	// (measured on the H200: widths 4, 2052, 16000 give 512, 2560, 16384).
	simDefaultPitchAlignment = 512
	// 32 bytes: CU_DEVICE_ATTRIBUTE_TEXTURE_PITCH_ALIGNMENT as published
	// device-property dumps show it on Pascal, Turing and Ampere GPUs. No
	// H200 dump was at hand; Hopper is assumed to keep the value.
	simDefaultTexturePitchAlignment = 32
	simDefaultName                  = "Simulated H200"
)

// simLinearAlign is the alignment of MemAlloc's pointers and the unit in
// which linear allocations consume capacity (bytes). The driver promises
// 256-byte alignment and gives at least 512 in practice. It consumes
// whole 2 MiB pages, packing small allocations into them, which Sim does
// not model: rounding each allocation to 512 bytes keeps the accounting
// exact and predictable for tests.
const simLinearAlign = 512

// Config configures New. The zero value of every field selects the
// default given with it, which models an H200.
type Config struct {
	// Capacity is the GPU's memory in bytes, shared by all processes;
	// MemGetInfo reports it as the total. Default H200Capacity,
	// 150754820096 bytes (143771 MiB, an H200's memory as nvidia-smi
	// reports it; the driver's cuMemGetInfo total is a little less).
	Capacity uint64
	// Granularity is the VMM allocation granularity in bytes, a power of
	// two of at least 512. Default 2 MiB.
	Granularity uint64
	// NoVMM makes VMMSupported report false and every VMM call fail with
	// ErrNotSupported.
	NoVMM bool
	// Latency is the model of call durations; nil selects H200Latency().
	// It is shared by the GPU's processes and must not change after
	// New.
	Latency *Latency
	// Seed seeds the PRNG behind FailRate; the same seed and the same
	// sequence of calls give the same failures.
	Seed uint64
	// Shadow keeps the contents of device memory, so MemcpyDtoH returns
	// what memsets wrote. Without it, every read returns Uninitialized
	// (addresses are still validated).
	Shadow bool
	// Name is what Name reports. Default "Simulated H200".
	Name string
	// Ordinal is what Ordinal reports. Default 0.
	Ordinal int
	// PitchAlignment is the multiple, in bytes, to which MemAllocPitch
	// rounds row pitches; a power of two. Default 512.
	PitchAlignment uint64
	// TexturePitchAlignment is what TexturePitchAlignment reports, in
	// bytes. Default 32 (see simDefaultTexturePitchAlignment).
	TexturePitchAlignment uint64
	// ContextBytes is the device memory each process's context holds
	// from New or NewProcess until Close, as a CUDA context does, taken
	// from the shared capacity (as much of it as is free). Default 0;
	// H200ContextBytes is what a context holds on an H200.
	ContextBytes uint64
	// RealTime makes each call also take its modelled duration in real
	// time, after it has done its work and outside the GPU's lock (a
	// busy wait that yields the processor, sleeping through all but the
	// last millisecond of a longer wait), so that processes sharing the
	// simulated GPU interleave as those on a real one do: while one
	// waits for a cuMemCreate, the others run and take or give back
	// memory. Default false: calls return at once and only SimTime counts
	// their duration.
	RealTime bool
}

// H200Capacity is the default Capacity, in bytes: 143771 MiB, an H200's
// memory as nvidia-smi reports it (driver 580.159.04; the board carries
// 144 GiB of HBM3e, and the driver keeps the rest). cuMemGetInfo's total
// on that GPU and driver is a little less, 150109880320 bytes (about
// 143156 MiB: total_bytes in bench/multi/h200), which is what a real
// H200's MemGetInfo reports.
const H200Capacity = 150754820096

// H200ContextBytes is the device memory one CUDA context holds on an H200
// (driver 580.159.04, 2026-12-01): cuMemGetInfo's total minus free is 526
// MiB with one process, 1,574 MiB with three. A pool capped by
// MaxFraction counts its process's (pool.Options.MaxFraction); one capped
// in bytes does not.
const H200ContextBytes = 526 << 20

// simGPU is what all processes on one simulated GPU share.
type simGPU struct {
	mu       *sync.Mutex // guards everything in every Sim on this GPU (and on its Host's other GPUs)
	capacity uint64      // bytes
	used     uint64      // bytes in use: every process's used plus occupied plus contexts
	occupied uint64      // bytes taken by Occupy
	contexts uint64      // bytes held by processes' contexts (Config.ContextBytes)
	procs    []*Device   // every process, in creation order
	index    int         // this GPU's index on its Host (0 without one)
	ngpus    int         // GPUs on its Host (0 or 1 without one)
}

// Device is a deterministic simulated GPU implementing device.Device: one process's
// view of it. See the comment at the top of sim.go for the design.
//
// All methods are safe for concurrent use; calls on all processes of one
// GPU are serialised by one mutex, so each call is atomic. A failed call
// changes nothing but the counters and the simulated time.
type Device struct {
	g    *simGPU
	cfg  Config // defaults filled in
	lat  *Latency
	proc int                               // index among the GPU's processes
	hook atomic.Pointer[func(device.Call)] // SetHook; called outside g.mu

	// Guarded by g.mu.
	closed     bool
	ctxBytes   uint64 // Config.ContextBytes taken at creation, held until Close
	counts     device.Counts
	times      [device.NumCalls]time.Duration
	used       uint64 // capacity this process consumes, bytes
	va         simVA
	regions    []*simRegion // linear allocations and reservations, by start
	handles    map[device.MemHandle]*simPhys
	nextHandle uint64
	streams    map[device.Stream]*simStream // every stream ever made, destroyed ones too
	live       []*simStream                 // streams not yet retired, in creation order
	nextStream uint64
	events     map[device.Event]*simEvent // events not destroyed
	nextEvent  uint64
	host       simClock // what the host has seen complete
	faults     simFaults
	violations []string
	apool      simAsyncPool // the default pool of MemAllocAsync (sim_async.go)

	// Several GPUs (sim_host.go): nil unless made by NewHost.
	onHost     *simHost
	peerLinear uint64 // bit b: device b enabled peer access to this device's linear memory
}

// New returns the first process on a new simulated GPU configured by
// cfg, on a machine of its own: its address window is that of every
// other New's first process (the package doc's "Address space"). It panics if cfg is inconsistent: a granularity, pitch alignment or
// texture pitch alignment that is not a power of two, or a granularity
// below 512 bytes.
func New(cfg Config) *Device {
	if cfg.Capacity == 0 {
		cfg.Capacity = simDefaultCapacity
	}
	if cfg.Granularity == 0 {
		cfg.Granularity = simDefaultGranularity
	}
	if cfg.Latency == nil {
		cfg.Latency = H200Latency()
	}
	if cfg.Name == "" {
		cfg.Name = simDefaultName
	}
	if cfg.PitchAlignment == 0 {
		cfg.PitchAlignment = simDefaultPitchAlignment
	}
	if cfg.TexturePitchAlignment == 0 {
		cfg.TexturePitchAlignment = simDefaultTexturePitchAlignment
	}
	for _, f := range []struct {
		name string
		v    uint64
	}{
		{"Granularity", cfg.Granularity},
		{"PitchAlignment", cfg.PitchAlignment},
		{"TexturePitchAlignment", cfg.TexturePitchAlignment},
	} {
		if bits.OnesCount64(f.v) != 1 {
			panic(fmt.Sprintf("sim: New: %s %d is not a power of two", f.name, f.v))
		}
	}
	if cfg.Granularity < simLinearAlign {
		panic(fmt.Sprintf("sim: New: Granularity %d is below %d bytes", cfg.Granularity, simLinearAlign))
	}
	g := &simGPU{mu: new(sync.Mutex), capacity: cfg.Capacity, ngpus: 1}
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.newProcess(cfg)
}

// NewProcess returns another process on the same simulated GPU, configured
// like s: it shares the capacity (and the lock) with every other process
// and has its own address space, handles, streams, counters, faults and
// hook. Its handles and pointers are not valid in other processes.
func (s *Device) NewProcess() *Device {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	return s.g.newProcess(s.cfg)
}

// simMaxWindows is how many processes get disjoint address windows; more
// processes reuse windows (their address spaces are separate anyway).
const simMaxWindows = 32

// simVATop is where process 0's address window starts; process p's window
// starts p windows lower. 0x7f0000000000 is where the driver's pointers
// appear on x86-64 Linux.
const simVATop uint64 = 0x7f00_0000_0000

// simVASpan is each process's window of virtual addresses, in bytes: 4 TiB,
// room for reservations of many times an H200's capacity. Reservations
// beyond it fail with ErrOutOfMemory, as the driver's do when its address
// space runs out.
const simVASpan uint64 = 1 << 42

func (g *simGPU) newProcess(cfg Config) *Device {
	p := len(g.procs)
	// The GPUs of a Host share one address space (unified virtual
	// addressing): GPU k's processes take the windows after those of the
	// GPUs before it, interleaved so that process 0 of every GPU, the
	// Host's own process, comes first.
	w := p*g.ngpus + g.index
	base := simVATop - uint64(w%simMaxWindows)*simVASpan
	s := &Device{
		g:       g,
		cfg:     cfg,
		lat:     cfg.Latency,
		proc:    p,
		va:      newSimVA(uintptr(base), simVASpan),
		handles: make(map[device.MemHandle]*simPhys),
		streams: make(map[device.Stream]*simStream),
		events:  make(map[device.Event]*simEvent),
	}
	def := &simStream{h: 0, idx: 0}
	s.streams[0] = def
	s.live = []*simStream{def}
	s.faults.init(cfg.Seed, p)
	s.ctxBytes = min(cfg.ContextBytes, g.capacity-g.used)
	g.used += s.ctxBytes
	g.contexts += s.ctxBytes
	g.procs = append(g.procs, s)
	return s
}

// simTag builds the deterministic handle values of one process: the
// process number in bits 40-47, a kind tag in bits 32-39 and a counter
// below, so handles never repeat and name their owner in a debugger.
func (s *Device) simTag(kind uint64, n uint64) uint64 {
	return uint64(s.proc+1)<<40 | kind<<32 | n
}

// Handle kind tags for simTag.
const (
	simTagStream = 0x5
	simTagEvent  = 0xe
	simTagHandle = 0xa
)

// do runs one driver call of kind c: the hook (outside the lock), then
// under the lock the counter, the overhead, the closed check, injected
// faults, and f, which does the work and returns the size in bytes the
// latency model charges for it. A failed call pays only the overhead.
func (s *Device) do(c device.Call, f func() (size uint64, err error)) error {
	if h := s.hook.Load(); h != nil {
		(*h)(c)
	}
	spent, err := s.doLocked(c, f)
	if s.cfg.RealTime {
		wait(spent)
	}
	return err
}

// doLocked is do's part under the lock; it returns the modelled time the
// call spent.
func (s *Device) doLocked(c device.Call, f func() (size uint64, err error)) (time.Duration, error) {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	before := s.times[c]
	err := s.account(c, f)
	return s.times[c] - before, err
}

// account counts and charges one call and runs f (s.g.mu held).
func (s *Device) account(c device.Call, f func() (size uint64, err error)) error {
	s.counts[c]++
	s.times[c] += s.lat.Overhead
	if s.closed {
		return simErr(c, device.ErrInvalidValue, "device is closed")
	}
	if err := s.faults.inject(c, s.counts[c]); err != nil {
		return err
	}
	size, err := f()
	if err == nil && s.lat.Cost[c] != nil {
		s.times[c] += s.lat.Cost[c](size)
	}
	return err
}

// waitSleepAbove: wait sleeps through all but this much of a longer wait
// and spins the rest, so that a process waiting milliseconds for a call
// (a large cuMemRelease) leaves its CPU to the others, as a real one
// blocked in the driver does; a timer is not precise below it.
const waitSleepAbove = time.Millisecond

// wait returns after d of real time (Config.RealTime): it sleeps through
// most of a wait longer than waitSleepAbove and spins the rest, yielding
// the processor, since driver calls last microseconds, below what a timer
// sleeps reliably.
func wait(d time.Duration) {
	end := time.Now().Add(d)
	if d > waitSleepAbove {
		time.Sleep(d - waitSleepAbove)
	}
	for time.Now().Before(end) {
		runtime.Gosched()
	}
}

// doPer is do for a call that works on several mappings at once
// (cuMemUnmap, cuMemSetAccess over a range): f returns the size of each,
// and the call costs Overhead once plus Cost per mapping, as on an H200,
// where batching a range buys nothing (sim_latency.go).
func (s *Device) doPer(c device.Call, f func() (sizes []uint64, err error)) error {
	return s.do(c, func() (uint64, error) {
		sizes, err := f()
		if err == nil && s.lat.Cost[c] != nil && len(sizes) > 1 {
			// do charges the first; charge the rest here (s.g.mu held).
			for _, n := range sizes[1:] {
				s.times[c] += s.lat.Cost[c](n)
			}
		}
		if len(sizes) == 0 {
			return 0, err
		}
		return sizes[0], err
	})
}

// simErr is an error of call c wrapping sentinel, with detail.
func simErr(c device.Call, sentinel error, format string, args ...any) error {
	return fmt.Errorf("device: sim %s: %s: %w", c, fmt.Sprintf(format, args...), sentinel)
}

// Ordinal returns Config.Ordinal.
func (s *Device) Ordinal() int { return s.cfg.Ordinal }

// Name returns Config.Name (default "Simulated H200").
func (s *Device) Name() string { return s.cfg.Name }

// TexturePitchAlignment returns Config.TexturePitchAlignment in bytes
// (default 32).
func (s *Device) TexturePitchAlignment() uint64 { return s.cfg.TexturePitchAlignment }

// VMMSupported reports !Config.NoVMM.
func (s *Device) VMMSupported() bool { return !s.cfg.NoVMM }

// AllocationGranularity returns Config.Granularity in bytes (default
// 2 MiB), or ErrNotSupported with NoVMM. It is not a counted call.
func (s *Device) AllocationGranularity() (uint64, error) {
	if s.cfg.NoVMM {
		return 0, fmt.Errorf("device: sim cuMemGetAllocationGranularity: %w", device.ErrNotSupported)
	}
	return s.cfg.Granularity, nil
}

// MemGetInfo returns the free and total memory of the GPU in bytes: total
// is Config.Capacity, free is what no process (and no Occupy) uses.
func (s *Device) MemGetInfo() (free, total uint64, err error) {
	err = s.do(device.CallMemGetInfo, func() (uint64, error) {
		free, total = s.g.capacity-s.g.used, s.g.capacity
		return 0, nil
	})
	return free, total, err
}

// charge takes n bytes of the GPU's capacity for this process, or fails
// with ErrOutOfMemory for call c, taking nothing.
func (s *Device) charge(c device.Call, n uint64) error {
	if free := s.g.capacity - s.g.used; n > free {
		return simErr(c, device.ErrOutOfMemory, "%d bytes wanted, %d free of %d", n, free, s.g.capacity)
	}
	s.g.used += n
	s.used += n
	return nil
}

// uncharge returns n bytes of capacity that this process had taken.
func (s *Device) uncharge(n uint64) {
	s.g.used -= n
	s.used -= n
}

// Occupy takes bytes of the GPU's capacity as an outside process would,
// lowering what MemGetInfo reports free to every process. It fails with
// ErrOutOfMemory, taking nothing, if fewer bytes are free. Safe for
// concurrent use, also from a hook (SetHook).
func (s *Device) Occupy(bytes uint64) error {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if free := s.g.capacity - s.g.used; bytes > free {
		return fmt.Errorf("device: sim Occupy: %d bytes wanted, %d free: %w", bytes, free, device.ErrOutOfMemory)
	}
	s.g.used += bytes
	s.g.occupied += bytes
	return nil
}

// Vacate gives back bytes that Occupy took (on any process of this GPU).
// It panics if more is vacated than is occupied: that is a bug in the
// test.
func (s *Device) Vacate(bytes uint64) {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	if bytes > s.g.occupied {
		panic(fmt.Sprintf("device: sim Vacate(%d): only %d bytes occupied", bytes, s.g.occupied))
	}
	s.g.used -= bytes
	s.g.occupied -= bytes
}

// Close marks this process closed: later driver calls on it fail with
// ErrInvalidValue, as calls into a destroyed context fail. It frees
// nothing the process allocated, so what it still holds stays counted
// against the GPU's capacity and leak checks after Close still see it;
// only its context's own memory (Config.ContextBytes) is given back. Introspection
// (Counts, Used, Violations, ...) keeps working. Close is idempotent and
// always returns nil.
func (s *Device) Close() error {
	s.g.mu.Lock()
	defer s.g.mu.Unlock()
	s.closed = true
	// The context's own memory goes with it.
	s.g.used -= s.ctxBytes
	s.g.contexts -= s.ctxBytes
	s.ctxBytes = 0
	return nil
}

// SetHook makes f run at the start of every driver call on this process
// (every Call kind, failed calls too), before the call takes the Sim's
// lock, with the call's kind. f may call other processes of the same GPU,
// for example to take memory between a pool's MemGetInfo and its
// allocation; calls f makes on this process run f again. nil removes the
// hook. Safe for concurrent use.
func (s *Device) SetHook(f func(c device.Call)) {
	if f == nil {
		s.hook.Store(nil)
		return
	}
	s.hook.Store(&f)
}

// regionAt returns the region containing addr and its index, or nil.
func (s *Device) regionAt(addr uintptr) (*simRegion, int) {
	i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].start > addr }) - 1
	if i >= 0 && addr-s.regions[i].start < uintptr(s.regions[i].size) {
		return s.regions[i], i
	}
	return nil, -1
}

// insertRegion adds r, keeping s.regions sorted by start.
func (s *Device) insertRegion(r *simRegion) {
	i := sort.Search(len(s.regions), func(i int) bool { return s.regions[i].start > r.start })
	s.regions = append(s.regions, nil)
	copy(s.regions[i+1:], s.regions[i:])
	s.regions[i] = r
}

// removeRegion removes s.regions[i] and returns its addresses to the free
// list.
func (s *Device) removeRegion(i int) {
	r := s.regions[i]
	s.regions = append(s.regions[:i], s.regions[i+1:]...)
	s.va.release(r.start, r.size)
}

var _ device.Device = (*Device)(nil)
