// Package poolmetrics exports a pool's statistics (pool.Stats) to
// Prometheus: New returns a prometheus.Collector that reads Stats at each
// scrape. It lives apart from package pool so that the allocator does not
// depend on the Prometheus client.
//
// Register one collector per pool, with constant labels that tell pools
// apart where a process has several:
//
//	c, err := poolmetrics.New(p, prometheus.Labels{"gpu": "0"})
//	if err != nil { ... }
//	reg.MustRegister(c)
//
// Every metric is named tlsf_pool_*. Bytes are bytes; gauges give the
// state at the scrape, *_total counters count since the pool was made,
// and peaks are since New or the last Pool.ResetPeaks. A scrape takes the
// pool's lock once (Stats) and is safe at any time, concurrently with
// the pool's use; a scrape of a closed pool reports its last figures.
package poolmetrics
