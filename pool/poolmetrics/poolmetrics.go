package poolmetrics

import (
	"fmt"
	"strconv"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/pool"
	"github.com/prometheus/client_golang/prometheus"
)

// Collector is a prometheus.Collector of one pool's statistics.
type Collector struct {
	p      *pool.Pool
	gauges []gauge
	counts []counter
	calls  *prometheus.Desc
	paths  *prometheus.Desc
	bySize *prometheus.Desc
}

type gauge struct {
	desc *prometheus.Desc
	get  func(*pool.Stats) float64
}

type counter struct {
	desc *prometheus.Desc
	get  func(*pool.Stats) uint64
}

// New returns a collector of p's statistics; labels are added to every
// metric (nil for none). The backend is a label of its own ("backend":
// vmm, chunks or passthrough). Errors: pool.ErrBadOptions for a nil pool
// or a label named "backend".
func New(p *pool.Pool, labels prometheus.Labels) (*Collector, error) {
	if p == nil {
		return nil, fmt.Errorf("%w: poolmetrics.New: nil pool", pool.ErrBadOptions)
	}
	if _, ok := labels["backend"]; ok {
		return nil, fmt.Errorf("%w: poolmetrics.New: the label \"backend\" is the collector's own (the pool's backend)", pool.ErrBadOptions)
	}
	cl := prometheus.Labels{"backend": p.Backend().String()}
	for k, v := range labels {
		cl[k] = v
	}
	desc := func(name, help string, vars ...string) *prometheus.Desc {
		return prometheus.NewDesc("tlsf_pool_"+name, help, vars, cl)
	}
	c := &Collector{p: p}
	g := func(name, help string, get func(*pool.Stats) float64) {
		c.gauges = append(c.gauges, gauge{desc(name, help), get})
	}
	u := func(v uint64) float64 { return float64(v) }
	g("allocated_bytes", "Bytes of live allocations, at their block size.", func(s *pool.Stats) float64 { return u(s.Allocated) })
	g("allocated_peak_bytes", "Peak of allocated_bytes.", func(s *pool.Stats) float64 { return u(s.AllocatedPeak) })
	g("allocations", "Live allocations.", func(s *pool.Stats) float64 { return float64(s.Allocations) })
	g("allocations_peak", "Peak of allocations.", func(s *pool.Stats) float64 { return float64(s.AllocationsPeak) })
	g("active_bytes", "Bytes of live blocks and blocks freed on a stream awaiting its event.", func(s *pool.Stats) float64 { return u(s.Active) })
	g("active_peak_bytes", "Peak of active_bytes.", func(s *pool.Stats) float64 { return u(s.ActivePeak) })
	g("reserved_bytes", "Device memory the pool holds.", func(s *pool.Stats) float64 { return u(s.Reserved) })
	g("reserved_peak_bytes", "Peak of reserved_bytes.", func(s *pool.Stats) float64 { return u(s.ReservedPeak) })
	g("cached_bytes", "Bytes of free blocks held by per-P caches.", func(s *pool.Stats) float64 { return u(s.Cached) })
	g("caches_on", "1 once the per-P caches serve requests (goroutines contended for the pool's lock, or CacheOptions.Eager), else 0.", func(s *pool.Stats) float64 {
		if s.CachesOn {
			return 1
		}
		return 0
	})
	g("pending_bytes", "Bytes of blocks freed on a stream awaiting its event.", func(s *pool.Stats) float64 { return u(s.Pending) })
	g("index_free_bytes", "Free bytes in the TLSF index (for a VMM pool, address space included).", func(s *pool.Stats) float64 { return u(s.IndexFree) })
	g("largest_free_bytes", "Largest free block of the TLSF index.", func(s *pool.Stats) float64 { return u(s.LargestFree) })
	g("fragmentation_ratio", "1 - largest_free_bytes / index_free_bytes.", func(s *pool.Stats) float64 { return s.Fragmentation })

	k := func(name, help string, get func(*pool.Stats) uint64) {
		c.counts = append(c.counts, counter{desc(name, help), get})
	}
	k("allocs_total", "Successful allocations.", func(s *pool.Stats) uint64 { return s.Allocs })
	k("frees_total", "Successful frees.", func(s *pool.Stats) uint64 { return s.Frees })
	k("grows_total", "Growths of the pool's device memory.", func(s *pool.Stats) uint64 { return s.Grows })
	k("releases_total", "Releases of device memory to the driver.", func(s *pool.Stats) uint64 { return s.Releases })
	k("released_bytes_total", "Bytes released to the driver.", func(s *pool.Stats) uint64 { return s.ReleasedBytes })
	k("recycled_bytes_total", "Physical memory a VMM pool moved between addresses.", func(s *pool.Stats) uint64 { return s.RecycledBytes })
	k("out_of_memory_total", "Requests that failed with ErrOutOfMemory.", func(s *pool.Stats) uint64 { return s.OutOfMemory })
	k("retries_total", "Runs of the out-of-memory path.", func(s *pool.Stats) uint64 { return s.Retries })
	c.calls = desc("device_calls_total", "Driver calls the pool made, by entry point.", "call")
	c.paths = desc("device_calls_by_path_total", "Driver calls the pool made, by the part of the pool that made them (pool.Path) and entry point.", "path", "call")
	c.bySize = desc("allocs_by_size_total", "Successful allocations by block size: blocks of more than le_bytes/2 and at most le_bytes bytes.", "le_bytes")
	return c, nil
}

// Describe sends the descriptors of every metric.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, g := range c.gauges {
		ch <- g.desc
	}
	for _, k := range c.counts {
		ch <- k.desc
	}
	ch <- c.calls
	ch <- c.paths
	ch <- c.bySize
}

// Collect reads the pool's statistics once and sends every metric.
// Device calls and size buckets with a count of zero are left out.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.p.Stats()
	for _, g := range c.gauges {
		ch <- prometheus.MustNewConstMetric(g.desc, prometheus.GaugeValue, g.get(&s))
	}
	for _, k := range c.counts {
		ch <- prometheus.MustNewConstMetric(k.desc, prometheus.CounterValue, float64(k.get(&s)))
	}
	for i, n := range s.DeviceCalls {
		if n > 0 {
			ch <- prometheus.MustNewConstMetric(c.calls, prometheus.CounterValue, float64(n), device.Call(i).String())
		}
	}
	for p, calls := range s.DeviceCallsByPath {
		for i, n := range calls {
			if n > 0 {
				ch <- prometheus.MustNewConstMetric(c.paths, prometheus.CounterValue, float64(n), pool.Path(p).String(), device.Call(i).String())
			}
		}
	}
	for k, n := range s.AllocsBySize {
		if n > 0 {
			le := "1"
			if k > 0 {
				le = strconv.FormatUint(1<<k, 10)
				if k == 64 {
					le = "18446744073709551616"
				}
			}
			ch <- prometheus.MustNewConstMetric(c.bySize, prometheus.CounterValue, float64(n), le)
		}
	}
}
