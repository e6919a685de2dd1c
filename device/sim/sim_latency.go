package sim

// The latency model: how long each driver call would take.
//
// Sim never sleeps; it adds each call's modelled duration to per-kind
// totals (SimTime, SimTimeByCall), so benchmarks and pool tests can
// compare strategies by driver time without a GPU and without flaky wall
// clocks.
//
// H200Latency's numbers. Measured on an H200 through this package's purego
// binding:
//   - every call: 0.47 µs of purego overhead;
//   - cuMemAlloc: about 40 µs for any size up to 16 MiB, 59 µs at 256 MiB,
//     222 µs at 2 GiB;
//   - cuMemFree: about 35 µs up to 16 MiB, 148 µs at 256 MiB, 874 µs at
//     2 GiB.
//   - VMM calls cost per physical allocation (handle) and mapping, not
//     per call nor per byte: µs per handle for cuMemCreate / cuMemMap /
//     cuMemSetAccess / cuMemUnmap / cuMemRelease, overhead included
//     (issue 11, 2026-12-01):
//     2 MiB handles   11.3 / 2.5 / 25.6 / 18.2 / 12.2;
//     20 MiB handles  11.3 / 2.2 / 24.6 / 15.4 / 19.3;
//     128 MiB handles 14.7 / 2.6 / 30.1 / 17.9 / 56.3.
//     cuMemSetAccess and cuMemUnmap over a range of several mappings cost
//     the sum over the mappings (batching buys nothing; Sim charges them
//     per mapping, doPer), so a pool's cold path costs per handle.
// Costs between the points are interpolated linearly in size and
// extrapolated beyond the last two. The rest are plausible defaults, not
// measurements, chosen to keep the relations that matter to a pool
// (events and queries are cheap; memory operations go at bandwidth):
//   - cuMemAddressReserve/Free 5 µs; cuMemGetInfo 2 µs; cuMemAllocPitch
//     like cuMemAlloc;
//   - stream create/destroy 5 µs; synchronize, wait, event calls 1 µs
//     (when nothing is pending: Sim does not model waiting);
//   - memset: 2.5 µs launch plus bytes at 3 TB/s (HBM3e);
//     cuMemcpyDtoH: 8 µs plus bytes at 25 GB/s (PCIe Gen5 x16, pageable);
//   - cuMemAllocAsync 1.1 µs and cuMemFreeAsync 1.2 µs (measured) when
//     the pool has the memory; pool attribute calls and trims cost the
//     overhead only, plus any release (sim_async.go).

import (
	"math"
	"time"

	"github.com/gpumem/tlsf/device"
)

// Latency is a model of driver call durations for Sim.
type Latency struct {
	// Overhead is paid by every call, failed ones included: the cost of
	// calling into the driver from Go (purego), in ns.
	Overhead time.Duration
	// Cost is the driver's time for a successful call of each kind, given
	// the bytes the call concerns: the allocation's size for allocations
	// and frees, the range's for VMM calls, memsets and copies; 0 for
	// calls without one. A nil entry costs nothing beyond Overhead.
	Cost [device.NumCalls]func(size uint64) time.Duration
}

// Of returns the modelled duration of one successful call of kind c on
// size bytes: Overhead plus Cost[c](size).
func (l *Latency) Of(c device.Call, size uint64) time.Duration {
	d := l.Overhead
	if c >= 0 && c < device.NumCalls && l.Cost[c] != nil {
		d += l.Cost[c](size)
	}
	return d
}

// LatencyPoint is one measurement: a call on Size bytes took Cost.
type LatencyPoint struct {
	Size uint64
	Cost time.Duration
}

// Piecewise returns a cost function through points (sorted by Size):
// constant at the first point's Cost below it, linear between points,
// extended along the last two points' slope beyond the last, and never
// below zero. It panics if points is empty or not sorted by Size.
func Piecewise(points ...LatencyPoint) func(size uint64) time.Duration {
	if len(points) == 0 {
		panic("device: Piecewise: no points")
	}
	for i := 1; i < len(points); i++ {
		if points[i].Size <= points[i-1].Size {
			panic("device: Piecewise: points not sorted by size")
		}
	}
	pts := append([]LatencyPoint(nil), points...)
	return func(size uint64) time.Duration {
		if size <= pts[0].Size || len(pts) == 1 {
			return pts[0].Cost
		}
		i := 1
		for i < len(pts)-1 && size > pts[i].Size {
			i++
		}
		a, b := pts[i-1], pts[i]
		frac := (float64(size) - float64(a.Size)) / (float64(b.Size) - float64(a.Size))
		d := float64(a.Cost) + frac*float64(b.Cost-a.Cost)
		return time.Duration(math.Max(0, math.Round(d)))
	}
}

// Bandwidth returns a cost function of fixed plus size bytes moved at
// bytesPerSecond.
func Bandwidth(fixed time.Duration, bytesPerSecond float64) func(size uint64) time.Duration {
	return func(size uint64) time.Duration {
		return fixed + time.Duration(math.Round(float64(size)/bytesPerSecond*1e9))
	}
}

// flat returns a cost function that ignores size.
func flat(d time.Duration) func(uint64) time.Duration {
	return func(uint64) time.Duration { return d }
}

// perHandle is a cost through the H200's measurements for handles of 2,
// 20 and 128 MiB, in µs with the call overhead included (taken off
// here: Overhead is charged apart).
func perHandle(at2, at20, at128 float64) func(uint64) time.Duration {
	const mib = 1 << 20
	us := func(v float64) time.Duration { return time.Duration(v*1000) - 470 }
	return Piecewise(
		LatencyPoint{2 * mib, us(at2)},
		LatencyPoint{20 * mib, us(at20)},
		LatencyPoint{128 * mib, us(at128)},
	)
}

// H200Latency returns the default model, from H200 measurements where
// there are some and plausible values elsewhere (see sim_latency.go).
// Each call returns a new Latency that the caller may modify.
func H200Latency() *Latency {
	const mib = 1 << 20
	const us = time.Microsecond
	alloc := Piecewise(
		LatencyPoint{16 * mib, 40 * us},
		LatencyPoint{256 * mib, 59 * us},
		LatencyPoint{2048 * mib, 222 * us},
	)
	free := Piecewise(
		LatencyPoint{16 * mib, 35 * us},
		LatencyPoint{256 * mib, 148 * us},
		LatencyPoint{2048 * mib, 874 * us},
	)
	l := &Latency{Overhead: 470 * time.Nanosecond}
	l.Cost = [device.NumCalls]func(uint64) time.Duration{
		device.CallMemGetInfo:     flat(2 * us),
		device.CallMemAlloc:       alloc,
		device.CallMemFree:        free,
		device.CallMemAllocPitch:  alloc,
		device.CallAddressReserve: flat(5 * us),
		device.CallAddressFree:    flat(5 * us),
		// Per handle or mapping, the overhead (0.47 µs) taken off.
		device.CallMemCreate:         perHandle(11.3, 11.3, 14.7),
		device.CallMemMap:            perHandle(2.5, 2.2, 2.6),
		device.CallMemSetAccess:      perHandle(25.6, 24.6, 30.1),
		device.CallMemUnmap:          perHandle(18.2, 15.4, 17.9),
		device.CallMemRelease:        perHandle(12.2, 19.3, 56.3),
		device.CallStreamCreate:      flat(5 * us),
		device.CallStreamDestroy:     flat(5 * us),
		device.CallStreamSynchronize: flat(1 * us),
		device.CallStreamWaitEvent:   flat(1 * us),
		device.CallEventCreate:       flat(1 * us),
		device.CallEventDestroy:      flat(1 * us),
		device.CallEventRecord:       flat(1 * us),
		device.CallEventQuery:        flat(1 * us),
		device.CallEventSynchronize:  flat(1 * us),
		device.CallMemsetD32:         Bandwidth(2500*time.Nanosecond, 3e12),
		device.CallMemsetD32Async:    Bandwidth(2500*time.Nanosecond, 3e12),
		device.CallMemcpyDtoH:        Bandwidth(8*us, 25e9),
		// Measured on the H200 (the pool's memory is already held; a
		// growth or release adds cuMemCreate/cuMemRelease, sim_async.go).
		device.CallMemAllocAsync: flat(1100 * time.Nanosecond),
		device.CallMemFreeAsync:  flat(1200 * time.Nanosecond),
	}
	return l
}
