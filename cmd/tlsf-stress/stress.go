package main

// The stress workload shared by run and multi.
//
// Each goroutine owns a table of slots. An operation picks a slot at
// random: a full slot's block is verified and freed, an empty slot gets a
// new block, of a size drawn from the size source, unless the goroutine's
// share of the live-byte budget would be exceeded, in which case another
// of its blocks is freed instead. Every block gets a 32-bit pattern of its
// own, written over its whole length on the device (cuMemsetD32Async on
// the goroutine's stream, and the pattern's low byte in the last size mod
// 4 bytes, cuMemsetD8Async, where the device fills bytes) right after
// allocation, and read back before its free (cuMemcpyDtoH of the whole
// block, or of its first, middle and last 4 KiB, the tail bytes with the
// last). A word that is not the block's pattern is corruption; when it is
// another live block's pattern, the report names that block too, since two
// live blocks then share memory. Independently of the device, every block
// is checked on the host against the address ranges of all live blocks
// when it is handed out, which catches overlaps that sampled verification
// could miss.
//
// Patterns: the k-th block gets uint32(k × 0x9E3779B1), a bijection of
// the 32-bit integers (the multiplier is odd), so patterns repeat only
// after 2^32 allocations and neighbouring blocks differ in every byte;
// 0 and the simulated device's uninitialized word are skipped.

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
)

// Verification modes, the values of --verify.
const (
	verifyFull    = "full"
	verifySampled = "sampled"
	verifyNone    = "none"
)

// sampleBytes is the size of each region sampled verification reads:
// 4 KiB, one copy of a few µs that still covers a block's edges, where
// an off-by-one in a split or merge would show.
const sampleBytes = 4096

// copyChunk bounds one cuMemcpyDtoH of full verification (bytes): the
// host buffer each goroutine keeps.
const copyChunk = 4 << 20

// maxKeptProblems bounds the problems kept for the report; more are
// counted only.
const maxKeptProblems = 20

// stressConfig configures one stress workload.
type stressConfig struct {
	goroutines int
	ops        int64         // total operations (0: until duration)
	duration   time.Duration // 0: until ops
	sizes      func(r *rand.Rand) uint64
	slots      int    // live blocks per goroutine, at most
	maxLive    uint64 // bytes live at most, over all goroutines (0: no bound)
	verify     string
	perStream  bool // a stream per goroutine; else the default stream
	seed       uint64
	// share is the pool's share of the device in bytes (multi), 0 for
	// none: out-of-memory errors of requests that would have left the
	// live bytes within 90% of it are also counted apart.
	share uint64
}

// liveBlock is one allocated block of the workload.
type liveBlock struct {
	id      uint64
	ptr     uintptr
	size    uint64
	pattern uint32
}

func (b *liveBlock) String() string {
	return fmt.Sprintf("block #%d [%#x, +%d) pattern %#08x", b.id, b.ptr, b.size, b.pattern)
}

// stressReport is the outcome of a workload.
type stressReport struct {
	Ops, Allocs, Frees, OOMs int64
	OOMsWithin               int64 // out-of-memory errors within 90% of stressConfig.share
	OOMsStill                int64 // of them, still within it when the request returned
	VerifiedBytes            uint64
	VerifiedBlocks           int64
	PeakLive                 uint64
	Elapsed                  time.Duration
	Oversized                int64    // requests not made: above a goroutine's share of --max-live
	Problems                 []string // corruption, overlaps, lost blocks (first maxKeptProblems)
	ProblemCount             int64
	Errors                   []string // unexpected errors (first maxKeptProblems)
	ErrorCount               int64
	WorkCalls                device.Counts // driver calls of the workload itself: memsets, copies, syncs
}

// stress is one running workload.
type stress struct {
	cfg   stressConfig
	dev   device.Device
	bytes device.ByteSetter // dev's byte fills, for blocks' tails; nil without
	a     allocator
	ctx   context.Context
	stop  time.Time // zero: no deadline

	issued, done    atomic.Int64
	allocs, frees   atomic.Int64
	ooms            atomic.Int64
	oversized       atomic.Int64 // requests larger than a goroutine's share of cfg.maxLive, not made
	oomsWithin      atomic.Int64 // of them, within 90% of cfg.share
	oomsStill       atomic.Int64 // of those, still within it when the request returned
	verifiedBytes   atomic.Uint64
	verifiedBlocks  atomic.Int64
	live, peakLive  atomic.Uint64
	held            atomic.Uint64 // bytes of blocks allocated and not yet back from FreeOn
	nextID          atomic.Uint64
	work            [device.NumCalls]atomic.Uint64
	patterns        sync.Map // uint32 → *liveBlock, for live blocks
	mu              sync.Mutex
	ranges          []*liveBlock // live blocks by ptr (guarded by mu)
	problems, errs  []string     // guarded by mu
	nProbs, nErrors int64        // guarded by mu
}

// testHookFilled, when set (by tests only), is called after each block is
// filled with its pattern; a test uses it to corrupt device memory and
// check that verification notices.
var testHookFilled func(d device.Device, b *liveBlock)

// newStress prepares the workload cfg on allocator a over device d.
func newStress(ctx context.Context, d device.Device, a allocator, cfg stressConfig) *stress {
	bs, _ := d.(device.ByteSetter)
	return &stress{cfg: cfg, dev: d, bytes: bs, a: a, ctx: ctx}
}

// run runs the workload until its operations are done, its duration is
// over, or its context is cancelled; then every block still live is
// verified and freed, and the allocator is checked for lost blocks. It
// blocks; opsDone may be called meanwhile from other goroutines.
func (s *stress) run() *stressReport {
	a, d := s.a, s.dev
	start := s.runWorkers(s.worker)
	return s.report(start, func() {
		if err := a.checkEmpty(); err != nil {
			s.problem("%v", err)
		}
		if sd, ok := d.(*sim.Device); ok {
			for _, v := range sd.Violations() {
				s.problem("simulated device: %s", v)
			}
		}
	})
}

// runWorkers sets the workload's deadline (cfg.duration), runs work(g)
// for g from 0 to cfg.goroutines-1, each on a goroutine of its own, waits
// for them all, and returns the time they started.
func (s *stress) runWorkers(work func(g int)) time.Time {
	start := time.Now()
	if s.cfg.duration > 0 {
		s.stop = start.Add(s.cfg.duration)
	}
	var wg sync.WaitGroup
	for g := range s.cfg.goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			work(g)
		}()
	}
	wg.Wait()
	return start
}

// report returns the report of the workload, which ran from start (its
// counts and elapsed time taken first), once check has reported the
// problems found after it (lost blocks, a simulated device's violations).
func (s *stress) report(start time.Time, check func()) *stressReport {
	rep := &stressReport{
		Ops: s.done.Load(), Allocs: s.allocs.Load(), Frees: s.frees.Load(), OOMs: s.ooms.Load(), OOMsWithin: s.oomsWithin.Load(), OOMsStill: s.oomsStill.Load(),
		VerifiedBytes: s.verifiedBytes.Load(), VerifiedBlocks: s.verifiedBlocks.Load(),
		PeakLive: s.peakLive.Load(), Elapsed: time.Since(start), Oversized: s.oversized.Load(),
	}
	check()
	if n := s.oversized.Load(); n > 0 && rep.Allocs == 0 {
		s.error("no allocation made: all %d requests were larger than a goroutine's share of --max-live (%d bytes)",
			n, s.cfg.maxLive/uint64(max(1, s.cfg.goroutines)))
	}
	for i := range s.work {
		rep.WorkCalls[i] = s.work[i].Load()
	}
	s.mu.Lock()
	rep.Problems, rep.ProblemCount = s.problems, s.nProbs
	rep.Errors, rep.ErrorCount = s.errs, s.nErrors
	s.mu.Unlock()
	return rep
}

// opsDone returns the operations done so far; safe to call while running.
func (s *stress) opsDone() int64 { return s.done.Load() }

func (s *stress) problem(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nProbs++
	if len(s.problems) < maxKeptProblems {
		s.problems = append(s.problems, fmt.Sprintf(format, args...))
	}
}

func (s *stress) error(format string, args ...any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.nErrors++
	if len(s.errs) < maxKeptProblems {
		s.errs = append(s.errs, fmt.Sprintf(format, args...))
	}
}

// call counts one driver call of the workload and passes its error on.
func (s *stress) call(c device.Call, err error) error {
	s.work[c].Add(1)
	return err
}

// more reports whether another operation may start, and claims it.
func (s *stress) more() bool {
	if s.ctx.Err() != nil || (!s.stop.IsZero() && time.Now().After(s.stop)) {
		return false
	}
	if s.cfg.ops > 0 && s.issued.Add(1) > s.cfg.ops {
		return false
	}
	return true
}

// worker is goroutine g's loop (slotLoop), on a stream of its own with
// --stream per-goroutine.
func (s *stress) worker(g int) {
	var st device.Stream
	if s.cfg.perStream {
		var err error
		if st, err = s.dev.StreamCreate(); s.call(device.CallStreamCreate, err) != nil {
			s.error("goroutine %d: creating a stream: %v", g, err)
			return
		}
		defer func() {
			if err := s.a.forget(st); err != nil {
				s.error("goroutine %d: the allocator forgetting its stream: %v", g, err)
			}
			if err := s.call(device.CallStreamDestroy, s.dev.StreamDestroy(st)); err != nil {
				s.error("goroutine %d: destroying its stream: %v", g, err)
			}
		}()
	}
	w := &worker{s: s, st: st, buf: s.verifyBuf()}
	slotLoop(s, g, 1, w.alloc, w.verifyFree)
}

// slotLoop is goroutine g's loop of operations (see the file comment) on
// blocks of type T: alloc makes one of size bytes (nil when it failed,
// counted), free verifies and frees one. A block of size bytes counts
// weight × size bytes against the goroutine's share of cfg.maxLive. When
// no operation is left, the blocks still live are freed.
func slotLoop[T any](s *stress, g int, weight uint64, alloc func(size uint64) *T, free func(*T)) {
	r := rand.New(rand.NewPCG(s.cfg.seed, uint64(g)+1))
	type slot struct {
		b    *T
		cost uint64 // weight × the block's size
	}
	slots := make([]slot, max(1, s.cfg.slots))
	budget := uint64(math.MaxUint64)
	if s.cfg.maxLive > 0 {
		budget = s.cfg.maxLive / uint64(max(1, s.cfg.goroutines))
	}
	var live uint64
	release := func(i int) {
		live -= slots[i].cost
		free(slots[i].b)
		slots[i] = slot{}
	}
	for s.more() {
		i := r.IntN(len(slots))
		if slots[i].b != nil {
			release(i)
			s.done.Add(1)
			continue
		}
		size := s.cfg.sizes(r)
		if live+weight*size > budget {
			// Over this goroutine's share: free another block instead.
			// With none live, the request is larger than the whole share:
			// no operation, counted apart (report).
			freed := false
			for k := 1; k < len(slots); k++ {
				if j := (i + k) % len(slots); slots[j].b != nil {
					release(j)
					freed = true
					break
				}
			}
			if freed {
				s.done.Add(1)
			} else {
				s.oversized.Add(1)
			}
			continue
		}
		if b := alloc(size); b != nil {
			slots[i] = slot{b, weight * size}
			live += weight * size
		}
		s.done.Add(1)
	}
	for i := range slots {
		if slots[i].b != nil {
			release(i)
		}
	}
}

// verifyBuf returns a goroutine's host buffer for reading blocks back:
// copyChunk bytes for full verification, else enough for the samples.
func (s *stress) verifyBuf() []byte {
	// 3 bytes more than a span reads (spans get len - 3): the last span
	// takes the tail too.
	if s.cfg.verify == verifyFull {
		return make([]byte, copyChunk+3)
	}
	return make([]byte, min(copyChunk, 3*sampleBytes)+3)
}

// worker is one goroutine's state.
type worker struct {
	s   *stress
	st  device.Stream
	buf []byte // host buffer for copies
}

// newBlockID returns the next block's ID and pattern (see the file
// comment), skipping IDs whose pattern would be 0 or sim.Uninitialized.
func (s *stress) newBlockID() (uint64, uint32) {
	for {
		id := s.nextID.Add(1)
		if p := uint32(id) * 0x9E3779B1; p != 0 && p != sim.Uninitialized {
			return id, p
		}
	}
}

// alloc allocates, registers and fills a block of size bytes; nil when the
// allocation failed (counted).
func (w *worker) alloc(size uint64) *liveBlock {
	s := w.s
	// held counts the request from before the call: a block another
	// goroutine is being handed counts as in use for this one's check.
	held := s.held.Add(size)
	ptr, err := s.a.AllocOn(size, w.st)
	if err != nil {
		s.held.Add(^(size - 1))
		if s.cfg.share > 0 && isOOM(err) && s.withinShare(held) {
			s.oomsWithin.Add(1)
			// Another goroutine's request begun meanwhile (held counts it
			// from before its call) may have taken the live bytes above
			// the margin by the time the pool decided.
			if s.withinShare(s.held.Load() + size) {
				s.oomsStill.Add(1)
			}
		}
		s.allocFailed(err, "allocating %d bytes", size)
		return nil
	}
	b, o := s.register(ptr, size)
	if o != nil {
		s.problem("overlap: %v was handed out while %v is live (they share [%#x, %#x))",
			b, o, max(b.ptr, o.ptr), min(b.ptr+uintptr(b.size), o.ptr+uintptr(o.size)))
	}
	if words := size / 4; words > 0 {
		if err := s.call(device.CallMemsetD32Async, s.dev.MemsetD32Async(ptr, b.pattern, words, w.st)); err != nil {
			s.error("filling %v: %v", b, err)
		}
	}
	if tail := s.tail(size); tail > 0 {
		if err := s.call(device.CallMemsetD8Async, s.bytes.MemsetD8Async(ptr+uintptr(size-tail), byte(b.pattern), tail, w.st)); err != nil {
			s.error("filling the last %d bytes of %v: %v", tail, b, err)
		}
	}
	if testHookFilled != nil {
		testHookFilled(s.dev, b)
	}
	s.addLive(size)
	return b
}

// shareMargin: a pool should serve every request that leaves its live
// bytes within this fraction of its share (multi reports those it failed).
const shareMargin = 0.9

// withinShare reports whether live bytes lie within shareMargin of the
// pool's share.
func (s *stress) withinShare(live uint64) bool {
	return float64(live) <= shareMargin*float64(s.cfg.share)
}

// allocFailed counts a failed allocation: out of memory, or an error of
// the workload, reported as format and args followed by ": " and err.
func (s *stress) allocFailed(err error, format string, args ...any) {
	if isOOM(err) {
		s.ooms.Add(1)
		return
	}
	s.error(format+": %v", append(args, err)...)
}

// register counts a block of size bytes allocated at ptr, gives it its ID
// and pattern, and adds it to the live ranges and patterns. It returns the
// block and a live block it overlaps, if any, for the caller to report.
func (s *stress) register(ptr uintptr, size uint64) (b, overlap *liveBlock) {
	s.allocs.Add(1)
	id, pattern := s.newBlockID()
	b = &liveBlock{id: id, ptr: ptr, size: size, pattern: pattern}
	overlap = s.insertRange(b)
	s.patterns.Store(b.pattern, b)
	return b, overlap
}

// addLive adds size bytes to the live bytes and raises their peak.
func (s *stress) addLive(size uint64) {
	l := s.live.Add(size)
	for p := s.peakLive.Load(); l > p && !s.peakLive.CompareAndSwap(p, l); p = s.peakLive.Load() {
	}
}

// unregister removes b from the live ranges, patterns and bytes, before
// its free.
func (s *stress) unregister(b *liveBlock) {
	s.removeRange(b)
	s.patterns.CompareAndDelete(b.pattern, b)
	s.live.Add(^(b.size - 1))
}

// verifyFree verifies b's contents, unregisters it and frees it.
func (w *worker) verifyFree(b *liveBlock) {
	s := w.s
	if s.cfg.verify != verifyNone {
		w.verify(b)
	}
	s.unregister(b)
	err := s.a.FreeOn(b.ptr, w.st)
	s.held.Add(^(b.size - 1))
	if err != nil {
		s.error("freeing %v: %v", b, err)
		return
	}
	s.frees.Add(1)
}

// verify reads b back (whole or sampled) and reports the first word that
// is not its pattern.
func (w *worker) verify(b *liveBlock) {
	s := w.s
	tail := s.tail(b.size)
	n := b.size / 4 * 4 // the bytes the 32-bit memset wrote
	if n+tail == 0 {
		return
	}
	if w.st != 0 {
		// cuMemcpyDtoH waits for the legacy default stream only.
		if err := s.call(device.CallStreamSynchronize, s.dev.StreamSynchronize(w.st)); err != nil {
			s.error("synchronizing before verifying %v: %v", b, err)
			return
		}
	}
	spans := s.spans(n, len(w.buf)-3)
	if tail > 0 {
		// The last span, which ends at n, reads the tail too (buf has room).
		if len(spans) == 0 {
			spans = []span{{0, 0}}
		}
		spans[len(spans)-1].n += tail
	}
	for _, sp := range spans {
		buf := w.buf[:sp.n]
		if err := s.call(device.CallMemcpyDtoH, s.dev.MemcpyDtoH(buf, b.ptr+uintptr(sp.off))); err != nil {
			s.error("reading back %v at offset %d: %v", b, sp.off, err)
			return
		}
		s.verifiedBytes.Add(sp.n)
		for i := 0; i+4 <= len(buf); i += 4 {
			got := binary.LittleEndian.Uint32(buf[i:])
			if got == b.pattern {
				continue
			}
			off := sp.off + uint64(i)
			other := "no live block has that pattern (a stray write, or a block freed already)"
			if v, ok := s.patterns.Load(got); ok {
				other = fmt.Sprintf("the pattern of live %v: the two blocks share memory", v.(*liveBlock))
			}
			s.problem("corruption: %v: word at %#x (offset %d) holds %#08x, %s", b, b.ptr+uintptr(off), off, got, other)
			return
		}
		for i := len(buf) / 4 * 4; i < len(buf); i++ { // the tail, in the last span
			if got := buf[i]; got != byte(b.pattern) {
				off := sp.off + uint64(i)
				s.problem("corruption: %v: byte at %#x (offset %d) holds %#02x, not the pattern's low byte %#02x", b, b.ptr+uintptr(off), off, got, byte(b.pattern))
				return
			}
		}
	}
	s.verifiedBlocks.Add(1)
}

// tail returns the bytes past a block's last whole word that the workload
// fills and verifies (size mod 4), or 0 on a device without byte fills.
func (s *stress) tail(size uint64) uint64 {
	if s.bytes == nil {
		return 0
	}
	return size % 4
}

// span is a range a verification reads back: n bytes at offset off of
// its block.
type span struct{ off, n uint64 }

// spans are the ranges a verification reads of the first n bytes of a
// block (n a multiple of 4) with a host buffer of bufLen bytes: all of
// them, in reads of at most bufLen bytes (full verification, or n at most
// three samples), else the first, middle and last sampleBytes.
func (s *stress) spans(n uint64, bufLen int) []span {
	if s.cfg.verify == verifyFull || n <= 3*sampleBytes {
		var spans []span
		for off := uint64(0); off < n; off += uint64(bufLen) {
			spans = append(spans, span{off, min(uint64(bufLen), n-off)})
		}
		return spans
	}
	mid := (n/2 - sampleBytes/2) &^ 3
	return []span{{0, sampleBytes}, {mid, sampleBytes}, {n - sampleBytes, sampleBytes}}
}

// insertRange adds b to the live ranges and returns a live block that
// overlaps it, if any.
func (s *stress) insertRange(b *liveBlock) *liveBlock {
	s.mu.Lock()
	defer s.mu.Unlock()
	i, _ := slices.BinarySearchFunc(s.ranges, b.ptr, func(x *liveBlock, p uintptr) int {
		switch {
		case x.ptr < p:
			return -1
		case x.ptr > p:
			return 1
		}
		return 0
	})
	var o *liveBlock
	if i > 0 && s.ranges[i-1].ptr+uintptr(s.ranges[i-1].size) > b.ptr {
		o = s.ranges[i-1]
	} else if i < len(s.ranges) && s.ranges[i].ptr < b.ptr+uintptr(b.size) {
		o = s.ranges[i]
	}
	s.ranges = slices.Insert(s.ranges, i, b)
	return o
}

// removeRange removes b from the live ranges.
func (s *stress) removeRange(b *liveBlock) {
	s.mu.Lock()
	defer s.mu.Unlock()
	lo := s.lowerBound(b.ptr)
	if i := slices.Index(s.ranges[lo:], b); i >= 0 {
		s.ranges = slices.Delete(s.ranges, lo+i, lo+i+1)
	}
}

// lowerBound is the index of the first live range starting at or above p.
// mu held.
func (s *stress) lowerBound(p uintptr) int {
	i, _ := slices.BinarySearchFunc(s.ranges, p, func(x *liveBlock, p uintptr) int {
		if x.ptr < p {
			return -1
		}
		return 1
	})
	return i
}
