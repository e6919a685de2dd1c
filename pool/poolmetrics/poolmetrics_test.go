package poolmetrics_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
	"github.com/gpumem/tlsf/pool/poolmetrics"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
)

func TestCollectorReportsThePoolsStatistics(t *testing.T) {
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{Backend: pool.BackendChunks, Cache: pool.CacheOptions{Disable: true}})
	require.NoError(t, err)
	defer p.Close()
	a, err := p.Alloc(1000)
	require.NoError(t, err)
	b, err := p.Alloc(3 << 20)
	require.NoError(t, err)
	require.NoError(t, p.Free(a))
	_, err = p.Alloc(1 << 40)
	require.ErrorIs(t, err, pool.ErrOutOfMemory)

	c, err := poolmetrics.New(p, prometheus.Labels{"gpu": "0"})
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))

	want := `
# HELP tlsf_pool_allocated_bytes Bytes of live allocations, at their block size.
# TYPE tlsf_pool_allocated_bytes gauge
tlsf_pool_allocated_bytes{backend="chunks",gpu="0"} 3.145728e+06
# HELP tlsf_pool_allocations Live allocations.
# TYPE tlsf_pool_allocations gauge
tlsf_pool_allocations{backend="chunks",gpu="0"} 1
# HELP tlsf_pool_allocs_total Successful allocations.
# TYPE tlsf_pool_allocs_total counter
tlsf_pool_allocs_total{backend="chunks",gpu="0"} 2
# HELP tlsf_pool_frees_total Successful frees.
# TYPE tlsf_pool_frees_total counter
tlsf_pool_frees_total{backend="chunks",gpu="0"} 1
# HELP tlsf_pool_out_of_memory_total Requests that failed with ErrOutOfMemory.
# TYPE tlsf_pool_out_of_memory_total counter
tlsf_pool_out_of_memory_total{backend="chunks",gpu="0"} 1
# HELP tlsf_pool_allocs_by_size_total Successful allocations by block size: blocks of more than le_bytes/2 and at most le_bytes bytes.
# TYPE tlsf_pool_allocs_by_size_total counter
tlsf_pool_allocs_by_size_total{backend="chunks",gpu="0",le_bytes="1024"} 1
tlsf_pool_allocs_by_size_total{backend="chunks",gpu="0",le_bytes="4194304"} 1
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want),
		"tlsf_pool_allocated_bytes", "tlsf_pool_allocations", "tlsf_pool_allocs_total", "tlsf_pool_frees_total",
		"tlsf_pool_out_of_memory_total", "tlsf_pool_allocs_by_size_total"))

	s := p.Stats()
	require.Equal(t, float64(s.Reserved), gathered(t, reg, "tlsf_pool_reserved_bytes"))
	require.Zero(t, gathered(t, reg, "tlsf_pool_caches_on"), "caches disabled")
	require.Equal(t, float64(s.DeviceCalls.Total()), gathered(t, reg, "tlsf_pool_device_calls_total"))
	require.Equal(t, float64(s.DeviceCalls.Total()), gathered(t, reg, "tlsf_pool_device_calls_by_path_total"), "by path, the same calls")

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	require.Empty(t, problems)
	require.NoError(t, p.Free(b))
}

// gathered sums the samples of a metric family.
func gathered(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var sum float64
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			if g := m.GetGauge(); g != nil {
				sum += g.GetValue()
			}
			if c := m.GetCounter(); c != nil {
				sum += c.GetValue()
			}
		}
	}
	return sum
}

func ExampleNew() {
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{})
	if err != nil {
		panic(err)
	}
	defer p.Close()
	c, err := poolmetrics.New(p, prometheus.Labels{"gpu": "0"})
	if err != nil {
		panic(err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(c)
	// http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	n, _ := testutil.GatherAndCount(reg, "tlsf_pool_reserved_bytes", "tlsf_pool_allocated_bytes")
	fmt.Println("series:", n)
	// Output:
	// series: 2
}

func TestCollectorScrapesAClosedPool(t *testing.T) {
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{})
	require.NoError(t, err)
	_, err = p.Alloc(4096)
	require.NoError(t, err)
	require.NoError(t, p.Close())
	c, err := poolmetrics.New(p, nil)
	require.NoError(t, err)
	n, err := testutil.GatherAndCount(prometheusRegistry(t, c), "tlsf_pool_allocs_total")
	require.NoError(t, err)
	require.Equal(t, 1, n)
}

func TestNewRefusesANilPoolAndABackendLabel(t *testing.T) {
	_, err := poolmetrics.New(nil, nil)
	require.ErrorIs(t, err, pool.ErrBadOptions)
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{})
	require.NoError(t, err)
	defer p.Close()
	_, err = poolmetrics.New(p, prometheus.Labels{"backend": "mine"})
	require.ErrorIs(t, err, pool.ErrBadOptions)
}

func prometheusRegistry(t *testing.T, c prometheus.Collector) *prometheus.Registry {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	return reg
}

func TestCollectorSaysWhetherTheCachesServe(t *testing.T) {
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{Cache: pool.CacheOptions{Eager: true}})
	require.NoError(t, err)
	defer p.Close()
	c, err := poolmetrics.New(p, nil)
	require.NoError(t, err)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(c))
	require.Equal(t, 1.0, gathered(t, reg, "tlsf_pool_caches_on"))
}
