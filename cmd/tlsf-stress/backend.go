package main

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/pool"
)

// Backends, the values of --backend.
const (
	backendVMM         = "tlsf-vmm"    // pool.BackendVMM
	backendChunks      = "tlsf-chunks" // pool.BackendChunks
	backendPassthrough = "passthrough" // pool.BackendPassthrough: cuMemAlloc per block
	backendAsync       = "async"       // the driver's pool: cuMemAllocAsync/cuMemFreeAsync
	// backendVMMGoodFit is pool.BackendVMM with Options.GoodFit (TLSF's
	// O(1) good fit) and its caches for blocks of 1 MiB and less: the
	// default before best fit.
	backendVMMGoodFit = "tlsf-vmm-goodfit"
	// backendVMMWilderness is pool.BackendVMM with Options.Wilderness
	// (the free top of the heap kept for requests nothing else holds).
	backendVMMWilderness = "tlsf-vmm-wilderness"
)

var allBackends = []string{backendVMM, backendChunks, backendPassthrough, backendAsync, backendVMMGoodFit, backendVMMWilderness}

// parseBackends splits a comma-separated --backend list, rejecting
// unknown and repeated names.
func parseBackends(list []string) ([]string, error) {
	var out []string
	for _, item := range list {
		for _, b := range strings.Split(item, ",") {
			b = strings.TrimSpace(b)
			if b == "" {
				continue
			}
			if !slices.Contains(allBackends, b) {
				return nil, usagef("--backend %q: want one or more of %s", b, strings.Join(allBackends, ", "))
			}
			if slices.Contains(out, b) {
				return nil, usagef("--backend %q given twice", b)
			}
			out = append(out, b)
		}
	}
	if len(out) == 0 {
		return nil, usagef("--backend: no backend given")
	}
	return out, nil
}

// passthroughForced reports whether the environment makes every pool
// backend a passthrough one (pool.PassthroughFromEnv, TLSF_PASSTHROUGH=1,
// read by pool.New): tlsf-stress then names the backends by what runs
// (effectiveBackend), not by what --backend asked for. A value it does
// not know reads as false here; pool.New then fails with its error.
func passthroughForced() bool {
	on, _ := pool.PassthroughFromEnv()
	return on
}

// effectiveBackend is the backend that runs for --backend name: with
// TLSF_PASSTHROUGH=1 every pool backend (tlsf-vmm, tlsf-chunks and their
// variants) runs as passthrough, so its figures are passthrough's and
// carry its name; async is the driver's pool, which the variable does not
// touch.
func effectiveBackend(name string) string {
	if name != backendAsync && passthroughForced() {
		return backendPassthrough
	}
	return name
}

// effectiveBackends is effectiveBackend of each name of list, each
// result once, in list order.
func effectiveBackends(list []string) []string {
	var out []string
	for _, b := range list {
		if e := effectiveBackend(b); !slices.Contains(out, e) {
			out = append(out, e)
		}
	}
	return out
}

// passthroughNote is printed to standard error when TLSF_PASSTHROUGH=1
// changes what the pool backends are.
const passthroughNote = pool.PassthroughEnv + "=1: every pool backend (tlsf-vmm, tlsf-chunks and their variants) runs, and is reported, as passthrough: a driver call per block"

// allocator is what replays and stress runs drive: a pool, or the
// driver's stream-ordered pool. Safe for concurrent use.
type allocator interface {
	AllocOn(size uint64, s device.Stream) (uintptr, error)
	FreeOn(ptr uintptr, s device.Stream) error
	// FreeSizedOn is FreeOn given the size the allocation asked for, as
	// PyTorch's free passes it (pool.Pool.FreeSizedOn).
	FreeSizedOn(ptr uintptr, size uint64, s device.Stream) error
	// reserved is the device memory held now, in bytes; it may take a
	// lock or make a driver call that calls() does not count.
	reserved() (uint64, error)
	// peakReserved is the most device memory held since the allocator
	// was made, in bytes.
	peakReserved() (uint64, error)
	// calls counts the driver calls the allocator made.
	calls() device.Counts
	// check verifies that nothing is live after every block was freed,
	// and the allocator's invariants; nil if all is well.
	checkEmpty() error
	// forget is called before a stream the allocator saw is destroyed.
	forget(s device.Stream) error
	close() error
}

// isOOM reports whether err is an allocator's out-of-memory error.
func isOOM(err error) bool {
	return errors.Is(err, pool.ErrOutOfMemory) || errors.Is(err, device.ErrOutOfMemory)
}

// allocOptions are the pool options a backend is made with.
type allocOptions struct {
	base        pool.Options // --conf: options the fields below and the backend override
	capBytes    uint64       // pool.Options.MaxBytes; for async, the memory left free beside a filler (0: none)
	maxFraction float64      // pool.Options.MaxFraction (0: default)
	history     int          // pool.Options.History (0: off)
}

// newAllocator makes backend name on d.
func newAllocator(d device.Device, name string, o allocOptions) (allocator, error) {
	var be pool.Backend
	switch name {
	case backendVMM, backendVMMGoodFit, backendVMMWilderness:
		be = pool.BackendVMM
	case backendChunks:
		be = pool.BackendChunks
	case backendPassthrough:
		be = pool.BackendPassthrough
	case backendAsync:
		return newAsyncAlloc(d, o)
	default:
		return nil, fmt.Errorf("unknown backend %q", name)
	}
	po := o.base
	po.Backend = be
	if o.capBytes > 0 {
		po.MaxBytes = o.capBytes
	}
	if o.maxFraction > 0 {
		po.MaxFraction = o.maxFraction
	}
	if o.history > 0 {
		po.History = o.history
	}
	if name == backendVMMGoodFit {
		// The default before best fit: good fit, with the caches on from
		// the start (unless --conf caches:false).
		po.GoodFit, po.Cache.Eager = true, !po.Cache.Disable
	}
	po.Wilderness = po.Wilderness || name == backendVMMWilderness
	p, err := pool.New(d, po)
	if err != nil {
		return nil, err
	}
	return poolAlloc{p}, nil
}

// poolAlloc is a backend of package pool.
type poolAlloc struct{ *pool.Pool }

func (a poolAlloc) reserved() (uint64, error)     { return a.Stats().Reserved, nil }
func (a poolAlloc) peakReserved() (uint64, error) { return a.Stats().ReservedPeak, nil }
func (a poolAlloc) calls() device.Counts          { return a.Stats().DeviceCalls }
func (a poolAlloc) close() error                  { return a.Close() }
func (a poolAlloc) forget(s device.Stream) error  { return a.ForgetStream(s) }

func (a poolAlloc) checkEmpty() error {
	if st := a.Stats(); st.Allocations != 0 || st.Allocated != 0 {
		return fmt.Errorf("lost blocks: the pool counts %d allocations (%d bytes) live after every block was freed", st.Allocations, st.Allocated)
	}
	if err := a.Check(); err != nil {
		return fmt.Errorf("pool invariants: %w", err)
	}
	return nil
}

// asyncAlloc is the driver's stream-ordered pool (device.AsyncAllocator).
// It sets the default pool's release threshold to the maximum, so that
// the pool keeps freed memory across synchronizations as a caching
// allocator does, and puts it back to 0 (and trims the pool) at close.
// With a cap, it occupies the rest of the device's free memory with one
// cuMemAlloc, since the driver's pool has no cap of its own.
type asyncAlloc struct {
	dev    device.Device
	a      device.AsyncAllocator
	filler uintptr
	free0  uint64 // the device's free memory at the start (cuMemGetInfo)
	n      [device.NumCalls]atomic.Uint64
}

// asyncGranularity is the page of the driver's pool and of the filler that
// leaves a cap beside it, in bytes.
const asyncGranularity = 2 << 20

// asyncSettle bounds how long close waits for the device's free memory to
// come back after the trim (asyncAlloc.close).
const asyncSettle = 2 * time.Second

func newAsyncAlloc(d device.Device, o allocOptions) (*asyncAlloc, error) {
	aa, ok := d.(device.AsyncAllocator)
	if !ok {
		return nil, fmt.Errorf("%s: %T has no stream-ordered allocator: %w", backendAsync, d, device.ErrNotSupported)
	}
	if o.capBytes > 0 && o.capBytes < asyncGranularity {
		// As pool.New refuses MaxBytes below a page: the driver's pool
		// maps whole 2 MiB pages, so every request would fail.
		return nil, fmt.Errorf("%s: a cap of %d bytes is below the driver pool's allocation granularity of %d bytes: no allocation could ever succeed", backendAsync, o.capBytes, asyncGranularity)
	}
	a := &asyncAlloc{dev: d, a: aa}
	// Start from an empty pool: what earlier runs left is returned.
	if err := d.StreamSynchronize(0); err != nil {
		return nil, err
	}
	if err := a.count(device.CallMemPoolTrimTo, aa.MemPoolTrimTo(0)); err != nil {
		return nil, fmt.Errorf("%s: %w", backendAsync, err)
	}
	if err := a.count(device.CallMemPoolSetAttribute, aa.MemPoolSetAttribute(device.MemPoolReleaseThreshold, math.MaxUint64)); err != nil {
		return nil, fmt.Errorf("%s: %w", backendAsync, err)
	}
	free0, _, err := d.MemGetInfo()
	if err != nil {
		return nil, err
	}
	a.free0 = free0
	for _, attr := range []device.MemPoolAttribute{device.MemPoolReservedMemHigh, device.MemPoolUsedMemHigh} {
		if err := a.count(device.CallMemPoolSetAttribute, aa.MemPoolSetAttribute(attr, 0)); err != nil {
			return nil, fmt.Errorf("%s: %w", backendAsync, err)
		}
	}
	if o.capBytes > 0 {
		free, _, err := d.MemGetInfo()
		if err != nil {
			return nil, err
		}
		if fill := (free - min(free, o.capBytes)) / asyncGranularity * asyncGranularity; fill > 0 {
			if a.filler, err = d.MemAlloc(fill); err != nil {
				return nil, fmt.Errorf("%s: occupying %d bytes to leave a cap of %d: %w", backendAsync, fill, o.capBytes, err)
			}
		}
	}
	return a, nil
}

// count counts one call of kind c and passes its error through.
func (a *asyncAlloc) count(c device.Call, err error) error {
	a.n[c].Add(1)
	return err
}

func (a *asyncAlloc) AllocOn(size uint64, s device.Stream) (uintptr, error) {
	a.n[device.CallMemAllocAsync].Add(1)
	return a.a.MemAllocAsync(size, s)
}

func (a *asyncAlloc) FreeOn(ptr uintptr, s device.Stream) error {
	a.n[device.CallMemFreeAsync].Add(1)
	return a.a.MemFreeAsync(ptr, s)
}

// FreeSizedOn is FreeOn: cuMemFreeAsync takes no size.
func (a *asyncAlloc) FreeSizedOn(ptr uintptr, _ uint64, s device.Stream) error {
	return a.FreeOn(ptr, s)
}

func (a *asyncAlloc) reserved() (uint64, error) {
	return a.a.MemPoolGetAttribute(device.MemPoolReservedMemCurrent)
}

func (a *asyncAlloc) peakReserved() (uint64, error) {
	return a.a.MemPoolGetAttribute(device.MemPoolReservedMemHigh)
}

func (a *asyncAlloc) calls() device.Counts {
	var c device.Counts
	for i := range a.n {
		c[i] = a.n[i].Load()
	}
	return c
}

func (a *asyncAlloc) checkEmpty() error {
	if err := a.dev.StreamSynchronize(0); err != nil {
		return err
	}
	used, err := a.a.MemPoolGetAttribute(device.MemPoolUsedMemCurrent)
	if err != nil {
		return err
	}
	if used != 0 {
		return fmt.Errorf("lost blocks: the driver's pool has %d bytes in use after every block was freed", used)
	}
	return nil
}

// close frees the filler and puts the default pool back as it was: no
// release threshold, trimmed. Blocks still live stay allocated (the
// driver's pool cannot free what it does not know to be unused).
// forget: the driver's pool orders frees on a stream by itself, and a
// stream may be destroyed with frees still queued on it.
func (a *asyncAlloc) forget(device.Stream) error { return nil }

func (a *asyncAlloc) close() error {
	var errs []error
	if a.filler != 0 {
		errs = append(errs, a.dev.MemFree(a.filler))
	}
	errs = append(errs, a.a.MemPoolSetAttribute(device.MemPoolReleaseThreshold, 0))
	errs = append(errs, a.dev.StreamSynchronize(0))
	errs = append(errs, a.a.MemPoolTrimTo(0))
	// On the H200 the first replay after the driver's pool closed, in the
	// same process, took about 360 ms more: wait, up to asyncSettle, until
	// the device's free memory is back to what it was at the start
	// (within 64 MiB), so that this backend's teardown is its own.
	for t0 := time.Now(); time.Since(t0) < asyncSettle; time.Sleep(time.Millisecond) {
		if free, _, err := a.dev.MemGetInfo(); err != nil || free+64<<20 >= a.free0 {
			break
		}
	}
	return errors.Join(errs...)
}
