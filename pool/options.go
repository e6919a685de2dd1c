package pool

import (
	"fmt"
	"log/slog"
	"math"
	"os"
	"strings"
	"time"

	"github.com/gpumem/tlsf/tlsf"
)

// Backend selects where a pool's memory comes from.
type Backend int

const (
	// BackendAuto is BackendVMM where the device supports virtual memory
	// management, else BackendChunks.
	BackendAuto Backend = iota
	// BackendVMM reserves one virtual address range and maps physical
	// memory into it on demand (cuMemAddressReserve, cuMemCreate,
	// cuMemMap, cuMemSetAccess): one physical allocation per growth, up to
	// 128 MiB, or one per granule (2 MiB on an H200) in a capped pool or
	// under ReleaseFraction; the index sees one range that grows, and
	// physical allocations lying wholly under free blocks can be returned
	// (cuMemUnmap, cuMemRelease).
	BackendVMM
	// BackendChunks takes memory in chunks from cuMemAlloc, each chunk an
	// index region, and returns chunks that become wholly free.
	BackendChunks
	// BackendPassthrough sends every request to the driver: Alloc calls
	// cuMemAlloc, AllocPitch cuMemAllocPitch, Free cuMemFree, so tools such
	// as compute-sanitizer see each allocation. Same API and statistics.
	BackendPassthrough
)

var backendNames = [...]string{"auto", "vmm", "chunks", "passthrough"}

func (b Backend) String() string {
	if b >= 0 && int(b) < len(backendNames) {
		return backendNames[b]
	}
	return fmt.Sprintf("Backend(%d)", int(b))
}

// PassthroughEnv is the environment variable that, set to 1, makes every
// pool a passthrough pool whatever its Options say (PassthroughFromEnv
// reads it).
const PassthroughEnv = "TLSF_PASSTHROUGH"

// PassthroughFromEnv reports whether PassthroughEnv asks for passthrough
// pools: true for 1, true, yes or on; false for unset, empty, 0, false,
// no or off (letter case and surrounding spaces ignored). Any other value
// is an error wrapping ErrBadOptions, which New returns (ParseConf and
// NewDevices do not read the variable): a value such as
// "enabled" would otherwise leave the pool in place unseen, while a memory
// checker run with it expects a driver call per block. It reads the
// environment only; safe for concurrent use.
func PassthroughFromEnv() (bool, error) {
	v := os.Getenv(PassthroughEnv)
	switch strings.ToLower(strings.TrimSpace(v)) {
	case "1", "true", "yes", "on":
		return true, nil
	case "", "0", "false", "no", "off":
		return false, nil
	}
	return false, fmt.Errorf("%w: %s=%q, want 1 (passthrough) or 0 (also true/false, yes/no, on/off)", ErrBadOptions, PassthroughEnv, v)
}

// Options configure a Pool. The zero value is a good default for one
// process on one GPU.
//
// The policy knobs are fractions of the device's memory as cuMemGetInfo
// reports it, so that one setting fits a big job and many small ones:
//
//   - free: the device's free memory at the moment of each decision,
//     which excludes what this pool holds (InitialFraction, GrowFraction);
//   - total: the device's total memory (MaxFraction, FreeFloorFraction),
//     the same for every process, so that equal fractions give equal
//     shares (package doc, "Sharing a GPU").
//
// A fraction of zero takes the default or disables its knob, as each field
// says; negative, NaN or infinite fractions and fractions above 1 are
// rejected with ErrBadOptions.
type Options struct {
	// Backend selects the memory source (default BackendAuto).
	Backend Backend
	// Passthrough is BackendPassthrough, whatever Backend says. The
	// environment variable TLSF_PASSTHROUGH=1 sets it too
	// (PassthroughFromEnv; a value it does not know fails New).
	Passthrough bool

	// InitialFraction of free memory is reserved when the pool is made
	// (default 0: nothing until the first allocation), at most
	// MaxFraction's cap (New refuses a MaxBytes, or a VMM pool's
	// VirtualSize, below it: ErrBadOptions).
	InitialFraction float64
	// GrowFraction: each growth takes max(request, GrowFraction × free),
	// rounded up to the allocation granularity, within the cap. Default
	// 1/4096: 36 MiB on an empty H200 (35 MiB rounded up to 2 MiB pages),
	// small enough that reserved memory tracks live memory within a few
	// percent, large enough that a growth (several driver calls per
	// granule) is rare.
	GrowFraction float64
	// MaxFraction caps reserved memory at MaxFraction × the device's
	// total memory (cuMemGetInfo at New) less what that share leaves for
	// the process's CUDA context (the device's memory in use at New, at
	// most total/256 and half the share), whatever other processes hold:
	// K pools with 1/K each get equal shares in any start order (to within
	// what a first process's context held below total/256), and on a GPU
	// whose contexts hold at most total/256 each (about 132 GiB and more,
	// such as an H200) they can all hold them at once (see the package
	// doc, "Sharing a GPU"). At most 0.5 also declares the device shared:
	// a VMM pool then grows in handles of up to a 2048th of its cap (from
	// a cap of 8 GiB) rather than one page each (fewer driver calls when
	// jobs share the GPU; alone, a smallest feasible cap up to 0.6%
	// higher). MaxBytes counts no context and declares nothing. Default 1:
	// no cap beyond the device.
	MaxFraction float64
	// MaxBytes caps reserved memory in bytes (default 0: no cap). With
	// MaxFraction, the smaller cap applies. The cap is checked after the
	// pool has released what it caches, not before. A pooled backend's New
	// refuses a cap below the allocation granularity (no allocation could
	// succeed); a passthrough pool caps the driver allocations' sizes
	// (AllocPitch: pitch × height), so any cap above 0 admits an Alloc up
	// to it.
	MaxBytes uint64
	// ReleaseFraction, when above 0, keeps reserved memory within
	// (1 + ReleaseFraction) × the peak of the memory in use (live blocks
	// at their block size, blocks pending on streams, blocks in
	// caches): when mapping more would cross that line, a VMM pool first
	// unmaps pages lying wholly under its largest free blocks and maps
	// their physical memory where it is needed (a chunk pool frees wholly
	// free chunks). Measured against the peak, so memory needed at the
	// peak of a loop stays mapped between its steps; only what
	// fragmentation of the address range would add beyond it is recycled.
	//
	// Default 0: off. A VMM pool then keeps every page below the top of
	// its range mapped, as PyTorch's expandable segments do (1.02–1.19 ×
	// peak live on the shared traces, 1.14 on ResNet-50 inference at batch
	// sizes 1–256), maps each growth as one physical allocation, and a
	// training loop's steps make no driver call once the first has run.
	// Above 0, a pool with no cap maps handles of at most f/2 of that peak,
	// halved each time large ones kept it from moving enough memory (a
	// pool with a cap as well maps one-page handles, or a 2048th of the
	// cap under a MaxFraction of one half or less: on lstm and tdnn 6 to
	// 11 times the driver time below cold, 6 to 7 times warm), and memory
	// moves between steps where fragmentation would otherwise grow the
	// range: on an H200 a handle moved costs about 50 µs (cuMemUnmap,
	// cuMemMap, cuMemSetAccess).
	// Measured on the simulated H200 (2026-12-07, one goroutine, so the
	// caches off; peak reserved over peak live after a cold and ten warm
	// replays; the modelled driver time per operation of the cold replay ·
	// of a warm one), 0.05 · 0.03: lstm 1.050 (4.9 · 3.1 µs) · 1.030 (7.7 ·
	// 8.5 µs), resnet50 1.020 (0.4 · 0) · 1.020, tdnn 1.047 (9.3 · 4.7 µs) ·
	// 1.027 (12.7 · 8.4 µs); on the traces in bench/traces, ResNet-50
	// inference 1.040 (19.8 · 5.5 µs) · 1.016 (16.8 · 4.9 µs), Llama 1.041
	// · 1.029, DeepLabV3 1.034 · 1.029, ViT-B/16 1.029 · 1.030, BERT 1.003
	// · 1.004, MobileNetV3 1.004 as without. With the caches on (Eager;
	// the default before): lstm 1.050 (4.9 · 1.2 µs) · 1.030 (7.8 · 2.0
	// µs), tdnn 1.039 (7.8 · 4.7 µs) · 1.030 (11.8 · 11.0 µs), inference
	// 1.049 (20.9 · 5.1 µs) · 1.019 (17.3 · 4.8 µs): which placement a
	// trace's moves favour is the chance of its sizes. Peak reserved
	// stays within 1 + f of the peak in use on those traces at 0.01 and
	// 0.05 (one case in 36 above: MobileNetV3 with GoodFit at 0.01, 1.015).
	// Default off because a warm step that moves memory costs driver calls
	// that a step on a pool keeping its memory does not make.
	// Unused memory is returned under pressure either way
	// (FreeFloorFraction, out of memory) and by Trim.
	ReleaseFraction float64
	// FreeFloorFraction: when the device's free memory falls below
	// FreeFloorFraction × total (another process needs memory), the pool
	// returns unused memory: a background scavenger (scavenge.go) checks
	// every 10 ms, idle pool or not, and returns the shortfall, up to 32
	// handles per check (64 MiB of one-page handles, up to 4 GiB of 128 MiB
	// ones); frees that take the pool's lock also check, every
	// ReleaseCheckInterval of them. Close stops the scavenger. Default 0:
	// off (the scavenger then runs IdleRelease's rule alone).
	FreeFloorFraction float64
	// IdleRelease: a pool that made no allocation request or free for
	// this long returns all the memory it holds unused once another
	// process has started or grown since New or its last release (what
	// others hold on the device, by cuMemGetInfo read at most every 100
	// ms while idle, rose by 64 MiB: a CUDA context alone holds more).
	// So a job started after another went idle gets the idle job's memory
	// within about IdleRelease plus the time to unmap it, with no option
	// set in either (scavenge.go, "Idle": the pace, the cost, and the
	// neighbour it leaves to FreeFloorFraction). The idle pool maps
	// memory again when it resumes: its next requests pay a cold start
	// (tens of ms for 100 GiB of 128 MiB handles on an H200). A pool alone
	// on its GPU keeps its memory through pauses, but for this process's
	// own memory outside the pool, which the device counts with the
	// others' (64 MiB more of it makes the next pause a release, once); a
	// pool never used keeps InitialFraction's reserve. Default (0):
	// 500 ms. Negative: never.
	IdleRelease time.Duration
	// NoScavenger turns the background scavenger off: FreeFloorFraction
	// is then checked on locked frees only, and IdleRelease never applies.
	// For tests that need every driver call made by the caller's own calls
	// (fault injection by call count, statistics compared with the
	// device's between calls).
	NoScavenger bool

	// VirtualSize is the size in bytes of a VMM pool's virtual address
	// range (default: twice the device's total memory). It is rounded up
	// to the allocation granularity (so 1 gives one 2 MiB page on the
	// H200). It bounds the pool's address range, used or free: no single
	// block is larger. Above tlsf.MaxSize, or below the initial reserve
	// (InitialFraction of free memory; New): ErrBadOptions.
	VirtualSize uint64
	// SLLog2 is log2 of the index's second-level lists per power of two,
	// 1 to tlsf.MaxSLLog2 (default 6: 64 lists, so good-fit rounding wastes
	// under 1.6% of a block; measured on the shared traces in bench/).
	SLLog2 uint

	// GoodFit places requests the caches do not serve by TLSF's good fit
	// (tlsf.Index.Alloc, TLSF §3.3): the request rounded up to its size
	// class (up to 1/2^SLLog2 more) and the head of the first non-empty
	// list at or above it, in O(1). Default false: best fit within the
	// request's own second-level list (tlsf.Index.AllocFit): the block is
	// the request rounded up to 256 bytes, and a free block of the
	// request's own list that holds it is taken before the next list's,
	// in O(tlsf.FitScan) (where no later list has a block, the rest of the
	// own list is read rather than fail: tlsf.Index.AllocFit). Blocks the caches serve keep their size class
	// (cached blocks of a class are alike), as do aligned requests
	// (AllocPitch); the statistics count every block at the size the pool
	// gave it (Pool.blockSize), a passthrough pool's included, and Size
	// gives that size (a passthrough pool's: what the driver allocated).
	//
	// Why best fit by default: measured on the simulated H200
	// (2026-12-07, one goroutine, peak reserved over peak live after a
	// cold and ten warm replays), lstm 1.032, resnet50 1.020, tdnn 1.193,
	// against good fit with 1 MiB caches on from the start (the default
	// before): 1.142, 1.023, 1.182, and PyTorch's expandable segments'
	// 1.120, 1.020, 1.204; smallest feasible caps 1.001, 1.004, 1.002
	// against 1.010, 1.003, 1.004. On the H200 (with the caches on from the
	// start, as they then were), real training through PyTorch
	// (bench/e2e, two runs) peaked at 10.73–10.74 and 24.38 GiB
	// reserved for ResNet-50 and GPT-2 against 10.80 and 24.54–24.61
	// (expandable segments 10.70 and 24.42), at the same step time;
	// tlsf-stress multi on the H200 made 1.56, 1.40 and 1.88 driver
	// calls per operation at K = 2, 3, 4 against 1.90, 1.71 and 2.38.
	// The cost is the replays' CPU time: 44, 51 and 43 ns per
	// operation warm against 34, 46 and 40 on a 2-core VM
	// (BenchmarkPoolReplay's vmm and vmm-goodfit-c1m, pinned to one core,
	// medians of ten).
	GoodFit bool

	// Wilderness keeps a VMM pool's free top of the heap (the free block at
	// the end of its mapped range, which a growth extends) for requests no
	// other free block holds, from the start: the wilderness preservation
	// heuristic (tlsf.Config.Wilderness). Default false: best fit takes the
	// top when it is the tightest block, until the heap must grow while a
	// quarter of its memory lies free outside its top, in pieces that
	// together would hold the request (severe fragmentation), when the pool
	// keeps the top, as with Wilderness, until every block is freed and the
	// heap starts over (Stats.TopKept; where the last free leaves its
	// block pending, with several streams or RecordStream, at the next
	// Trim). Measured on the simulated H200
	// (2026-12-07, one goroutine, peak reserved over peak live after a
	// cold and ten warm replays; default · Wilderness), on the shared
	// traces: lstm 1.032 · 1.117, resnet50 1.020 · 1.0195, tdnn 1.193 ·
	// 1.193; on six traces recorded later to test the pool on workloads it
	// was not tuned on (bench/traces): ResNet-50 inference at batch 1–256
	// 1.142 · 1.145 (1.290 before the switch on severe fragmentation),
	// BERT 1.0028 · 1.0037, DeepLabV3 1.034 · 1.038, Llama (bf16) 1.059 ·
	// 1.058, MobileNetV3 1.0037 · 1.006, ViT-B/16 1.028 · 1.031; PyTorch's
	// expandable segments on
	// the H200: 1.120, 1.020, 1.204, 1.148, 1.004, 1.036, 1.068, 1.006,
	// 1.034. Ignored by other backends. The TLSF_ALLOC_CONF key "wilderness"
	// sets it.
	Wilderness bool

	// Cache configures the per-P small-block caches (see Cache).
	Cache CacheOptions

	// Guard, when above 0, puts a red zone of Guard bytes after every
	// block from Alloc and AllocOn, filled with a pattern on allocation
	// and verified on free and by Check; an overrun is reported as
	// ErrCorrupted (guard.go). At most MaxGuard bytes; needs a device with
	// byte fills (device.ByteSetter: cuda and sim). Statistics exclude
	// red zones (AllocatedPeak is then the exact peak of live blocks,
	// blocks held by caches not counted). The TLSF_ALLOC_CONF key "guard"
	// sets it. Default 0: off, at no cost.
	Guard uint64
	// History keeps the last History allocation events (allocations,
	// frees, growths, releases, failures) in a ring buffer for History and
	// Snapshot, as torch.cuda.memory._record_memory_history does (default
	// 0: off). About 80 bytes an event; while on, every Alloc and Free
	// takes the history's lock: a 4 KiB Alloc+Free pair from the caches
	// took 172 ns instead of 34 on a 2-core VM (BenchmarkSmallAllocFreeHistory
	// in bench/; see history.go). Negative: ErrBadOptions.
	History int
	// HistoryStacks records the Go call stack of each allocation with its
	// event (runtime.Callers, up to 32 frames: about 250 ns and up to 256
	// bytes an allocation; that pair took 420 ns). Snapshots give them as
	// frames.
	HistoryStacks bool
	// OnOutOfMemory, when set, is called with the request in bytes before
	// an allocation fails with ErrOutOfMemory: after the pool has flushed
	// its caches, waited for pending frees and moved what the request
	// needs, or at once when the same request failed just before with no
	// free since, into the pool or its caches (share.go). The pool's lock
	// is not held: the hook may free memory (run the Go GC and finalizers
	// that free device memory, drop caches of its own) and may call the
	// pool. The pool then retries once (flush, wait, move, search, grow)
	// and fails only if that fails too. It may be called from several
	// goroutines at once, up to 1024 calls at a time (maxOOMHooks): a hook
	// that allocates from the pool and fails calls itself again, as deep
	// as that, and a request that fails beyond it fails without calling
	// the hook. It is not called for a request that can never succeed
	// (its block above the cap or the device's total memory), which fails
	// at once, nor by a passthrough pool's AllocPitch.
	OnOutOfMemory func(request uint64)
	// Logger, when set, receives events as they happen: growth and
	// release of device memory (Debug), Trim (Info), out of memory (Warn),
	// with sizes in bytes. It is called with the pool's lock held: its
	// handler must not call the pool.
	Logger *slog.Logger
	// PeerAccess is the set of device ordinals (of the same host) that may read
	// and write the pool's memory, e.g. for cuMemcpyDtoDAsync issued on
	// another GPU. A VMM pool grants each of them access to every mapping,
	// present and future (cuMemSetAccess with one CUmemAccessDesc per
	// device); a chunk or passthrough pool enables peer access on the
	// context (cuCtxEnablePeerAccess). The pool's own ordinal is a no-op.
	// New fails with ErrNoPeerAccess, naming the pair, when the device is
	// not a device.PeerAccessor or a listed device cannot access it
	// (cuDeviceCanAccessPeer), and with the device's error (ErrNoDevice for
	// an unknown ordinal) naming the pair where the driver's check fails.
	// Default nil: the pool's device alone. See also Pool.GrantPeerAccess,
	// which takes any ordinal. (peers.go)
	PeerAccess DeviceSet
}

// CacheOptions configure the per-P caches that serve small blocks without
// taking the pool's lock.
type CacheOptions struct {
	// Disable turns the caches off: every request takes the lock. With
	// Eager too, New returns ErrBadOptions.
	Disable bool
	// Eager turns the caches on from the start. Default false: a pool
	// starts with its caches off (its requests take the lock and best
	// fit) and turns them on for good once goroutines contend for its
	// lock (8 acquisitions found it held within 4,096 locked operations:
	// "When the caches engage" in cache.go has the rule and its
	// measurements), so that one goroutine's blocks merge with their free
	// neighbours at once and land where best fit puts them, and many
	// goroutines' small requests do not queue on the lock. Stats.CachesOn
	// says which. Best fit with a MaxSize above 32 KiB (above 2^(SLLog2+9)
	// bytes), whose size classes are coarser than best fit's 256 bytes,
	// engages them from the start.
	// The TLSF_ALLOC_CONF key "caches" sets it (true: Eager; auto: the
	// default; false: Disable).
	Eager bool
	// MaxSize is the largest request in bytes served from caches
	// (default 4 KiB; with GoodFit, 1 MiB). Cached blocks keep their size
	// class and are placed apart from best fit: on the lstm trace
	// (2026-12-01, caches on from New), best fit with caches of up to
	// 8 KiB gave 1.033 × peak live reserved, with caches of 16 KiB to
	// 1 MiB 1.120 (the default's figures are in Options.GoodFit). Larger
	// caches save the pool's lock for more requests (a 2-core VM: 44
	// against 35 ns per operation on lstm).
	MaxSize uint64
	// MaxFraction bounds the bytes all caches hold together to
	// MaxFraction × reserved (default 1/16), split in equal shares among
	// the Ps and the central lists; but no share is below 4 MiB, so that
	// a pool holding little memory still caches a working set of small
	// blocks: below 4 MiB × (GOMAXPROCS + 1) × 1/MaxFraction reserved,
	// the caches may hold up to 4 MiB per P and 4 MiB in the central
	// lists (a P sheds to half its share when it holds more than all of
	// it).
	MaxFraction float64
}

// Defaults.
const (
	defaultGrowFraction    = 1.0 / 4096
	defaultReleaseFraction = 0
	defaultSLLog2          = 6
	// ReleaseCheckInterval: frees under the lock between two checks of the
	// device's free memory (one cuMemGetInfo, about 1 µs).
	ReleaseCheckInterval = 4096
	defaultCacheMaxSize  = 4 << 10
	goodFitCacheMaxSize  = 1 << 20
	defaultCacheFraction = 1.0 / 16
	defaultIdleRelease   = 500 * time.Millisecond
)

// withDefaults validates o and fills in defaults. The environment's
// PassthroughEnv is New's to read (newPool), not this validation's, which
// ParseConf and NewDevices run too.
func (o Options) withDefaults() (Options, error) {
	fracs := []struct {
		name string
		v    *float64
		def  float64
	}{
		{"InitialFraction", &o.InitialFraction, 0},
		{"GrowFraction", &o.GrowFraction, defaultGrowFraction},
		{"MaxFraction", &o.MaxFraction, 1},
		{"ReleaseFraction", &o.ReleaseFraction, defaultReleaseFraction},
		{"FreeFloorFraction", &o.FreeFloorFraction, 0},
		{"Cache.MaxFraction", &o.Cache.MaxFraction, defaultCacheFraction},
	}
	for _, f := range fracs {
		v := *f.v
		if math.IsNaN(v) || v < 0 || v > 1 {
			return o, fmt.Errorf("%w: %s = %v, want a fraction in [0, 1]", ErrBadOptions, f.name, v)
		}
		if v == 0 {
			*f.v = f.def
		}
	}
	if o.InitialFraction > o.MaxFraction {
		return o, fmt.Errorf("%w: InitialFraction %v above MaxFraction %v", ErrBadOptions, o.InitialFraction, o.MaxFraction)
	}
	if o.Backend < BackendAuto || o.Backend > BackendPassthrough {
		return o, fmt.Errorf("%w: unknown backend %d", ErrBadOptions, int(o.Backend))
	}
	if o.Passthrough {
		o.Backend = BackendPassthrough
	}
	if o.SLLog2 == 0 {
		o.SLLog2 = defaultSLLog2
	}
	if o.SLLog2 > tlsf.MaxSLLog2 {
		return o, fmt.Errorf("%w: SLLog2 %d above %d", ErrBadOptions, o.SLLog2, tlsf.MaxSLLog2)
	}
	if o.VirtualSize > tlsf.MaxSize {
		return o, fmt.Errorf("%w: VirtualSize %d above %d", ErrBadOptions, o.VirtualSize, uint64(tlsf.MaxSize))
	}
	if o.Guard > MaxGuard {
		return o, fmt.Errorf("%w: Guard %d above %d bytes", ErrBadOptions, o.Guard, MaxGuard)
	}
	if o.History < 0 || o.History > MaxHistory {
		return o, fmt.Errorf("%w: History %d, want 0 (off) to %d events", ErrBadOptions, o.History, MaxHistory)
	}
	if o.Cache.Eager && o.Cache.Disable {
		return o, fmt.Errorf("%w: Cache.Eager and Cache.Disable both set (caches on from the start, and off)", ErrBadOptions)
	}
	if o.IdleRelease == 0 {
		o.IdleRelease = defaultIdleRelease
	}
	if o.Cache.MaxSize == 0 {
		o.Cache.MaxSize = defaultCacheMaxSize
		if o.GoodFit {
			o.Cache.MaxSize = goodFitCacheMaxSize
		}
	}
	return o, nil
}
