package main

// The replay report: one table for all traces, a line per allocator
// failure, and a verdict per trace.

import (
	"fmt"
	"io"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/gpumem/tlsf/internal/trace"
)

// baselineSource says where the peers' figures come from.
const baselineSource = "H200, baseline.json"

// printReplayTable writes the results as one table, our rows of each
// trace followed by the peers' figures on the H200 (trace.Baselines),
// each row saying where its figures were measured; then the reason of
// every failed replay and one verdict line per trace.
func printReplayTable(w io.Writer, ds *devices, results []*replayResult) {
	sd := ds.kind == deviceSim
	here := "this run (" + ds.kind + ")"
	fmt.Fprintf(w, "Replay on %s (%s). ns/op is the warm cost per alloc or free: each trace is\n", ds.name(), ds.kind)
	warm := 0
	if len(results) > 0 {
		warm = results[0].WarmRuns
	}
	fmt.Fprintf(w, "replayed once to warm the allocator (cold ns/op), then timed on it %d times (--warm-runs):\n", warm)
	fmt.Fprintln(w, "ns/op is the median of those warm replays, min ns/op their minimum. Peers' figures are warm too.")
	fmt.Fprintln(w, "device calls counts the driver calls of every replay: the cold one, the warm-up ones and the timed ones.")
	fmt.Fprintf(w, "Rows measured %q come from this replay; rows measured %q are peers'\n", here, baselineSource)
	fmt.Fprintln(w, "figures recorded on an NVIDIA H200 (internal/trace/data/baseline.json), peak live as the trace sizes it;")
	fmt.Fprintln(w, "bench/peers/run.sh measures every peer side by side with this pool (bench/RESULTS.md).")
	if ds.conf != "" {
		fmt.Fprintf(w, "Pool backends ran with --conf %s.\n", ds.conf)
	}
	if sd {
		fmt.Fprintln(w, "On the simulated device our ns/op is host time only, not comparable with the peers' GPU")
		fmt.Fprintln(w, "times; drv ns/op is the modelled H200 driver time per op of the warm replays, cold drv ns/op")
		fmt.Fprintln(w, "that of the first. Async on the simulated device never")
		fmt.Fprintln(w, "fragments: its memory figures are lower bounds.")
	}
	baselines, _ := trace.Baselines()
	cols := []string{"trace", "allocator", "measured", "ops", "ns/op", "min ns/op", "cold ns/op"}
	if sd {
		cols = append(cols, "drv ns/op", "cold drv ns/op")
	}
	cols = append(cols, "peak reserved", "reserved/live", "min cap/live", "device calls", "failed")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	row := func(cells ...string) {
		// Every row has every cell, the separator rows too: tabwriter
		// aligns a column only over consecutive lines that have it.
		for len(cells) < len(cols) {
			cells = append(cells, "")
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t")+"\t")
	}
	row(cols...)
	for i, r := range results {
		if i > 0 && !sameTrace(r, results[i-1]) {
			row()
		}
		cells := []string{r.Trace, r.Backend, here, fmt.Sprint(r.Ops), fmt.Sprintf("%.0f", r.NsPerOp),
			fmt.Sprintf("%.0f", r.MinNsPerOp), fmt.Sprintf("%.0f", r.ColdNsPerOp)}
		if sd {
			cells = append(cells, optFloat(r.DeviceNsPerOp, "%.0f"), optFloat(r.ColdDeviceNsPerOp, "%.0f"))
		}
		failed := fmt.Sprint(r.FailedAllocs)
		if r.FailedAllocs > 0 {
			failed += " (see below)"
		}
		cells = append(cells, gib(r.PeakReservedBytes), fmt.Sprintf("%.3f", r.ReservedOverLive),
			optFloat(r.MinCapOverLive, "%.3f"), fmt.Sprint(r.DeviceCalls), failed)
		row(cells...)
		if i+1 < len(results) && sameTrace(results[i+1], r) {
			continue
		}
		bl, ok := baselineOf(baselines, r)
		if !ok {
			continue
		}
		for _, name := range slices.Sorted(maps.Keys(bl.Peers)) {
			p := bl.Peers[name]
			cells := []string{r.Trace, "peer " + name, baselineSource, fmt.Sprint(bl.Ops), zeroDash(p.WarmNsPerOp, "%.0f"), "", ""}
			if sd {
				cells = append(cells, "", "")
			}
			rsv := "-"
			if p.PeakReservedBytes > 0 {
				rsv = gib(p.PeakReservedBytes)
			}
			row(append(cells, rsv, zeroDash(p.PeakReservedOverLive, "%.3f"), zeroDash(p.MinCapOverLive, "%.3f"))...)
		}
	}
	tw.Flush()
	skipped := map[string]bool{}
	for _, r := range results {
		if r.SkippedRecords > 0 && !skipped[r.Trace] {
			skipped[r.Trace] = true
			fmt.Fprintf(w, "%s: %d records of the trace were skipped (frees of no live block, zero-byte allocations: a recording begun mid-run or wrapped)\n", r.Trace, r.SkippedRecords)
		}
	}
	for _, r := range results {
		if r.FailedAllocs > 0 || r.WarmFailedAllocs > 0 || r.FirstError != "" {
			fmt.Fprintf(w, "%s %s: %s failed in the first replay, %d in the %s; first error: %s\n",
				r.Trace, r.Backend, plural(r.FailedAllocs, "allocation"), r.WarmFailedAllocs, plural(r.WarmRuns, "timed warm replay"), r.FirstError)
		}
	}
	for _, line := range verdicts(ds, results, baselines) {
		fmt.Fprintln(w, line)
	}
}

// verdicts returns one line per trace: our best pool backend against the
// best peer, by the smallest feasible cap where --min-cap ran, else by
// peak reserved memory, both over peak live bytes. Peers are the H200
// figures of baseline.json for the embedded trace of that name, where the
// trace is that one (baselineOf), and, on a GPU, the driver's pool
// measured here (on the simulated device its figures are a lower bound,
// left out). A backend whose replay failed allocations is no candidate:
// its reserved memory is that of a replay cut short. Where every one
// failed, the line says so and compares nothing. Traces replayed with no
// pool backend (passthrough, async) get no line.
func verdicts(ds *devices, results []*replayResult, baselines map[string]trace.Baseline) []string {
	var out []string
	var order []traceKey
	byTrace := map[traceKey][]*replayResult{}
	for _, r := range results {
		k := traceKey{r.Trace, r.Source}
		if _, ok := byTrace[k]; !ok {
			order = append(order, k)
		}
		byTrace[k] = append(byTrace[k], r)
	}
	for _, key := range order {
		rs, name := byTrace[key], key.name
		byCap := true
		for _, r := range rs {
			byCap = byCap && r.MinCapOverLive != nil
		}
		metric, ours := "peak reserved", func(r *replayResult) float64 { return r.ReservedOverLive }
		peerMetric := func(p trace.Peer) float64 { return p.PeakReservedOverLive }
		if byCap {
			metric, ours = "min cap", func(r *replayResult) float64 { return *r.MinCapOverLive }
			peerMetric = func(p trace.Peer) float64 { return p.MinCapOverLive }
		}
		var best, failed *replayResult
		for _, r := range rs {
			if r.Backend != backendVMM && r.Backend != backendChunks && r.Backend != backendVMMGoodFit && r.Backend != backendVMMWilderness {
				continue
			}
			if r.FailedAllocs > 0 || r.WarmFailedAllocs > 0 {
				if failed == nil {
					failed = r
				}
				continue
			}
			if best == nil || ours(r) < ours(best) {
				best = r
			}
		}
		if best == nil {
			if failed != nil {
				under := ""
				if failed.CapBytes > 0 {
					under = fmt.Sprintf(" under the cap of %d bytes", failed.CapBytes)
				}
				out = append(out, fmt.Sprintf("verdict %s: every pool backend failed allocations%s (%s: %d): no comparison", name, under, failed.Backend, failed.FailedAllocs+failed.WarmFailedAllocs))
			}
			continue
		}
		bl, _ := baselineOf(baselines, best)
		peerName, peerVal, peerFrom := "", 0.0, ""
		var peerBytes uint64 // the peer's peak reserved bytes, where known
		consider := func(n string, v float64, bytes uint64, from string) {
			if v > 0 && (peerName == "" || v < peerVal) {
				peerName, peerVal, peerBytes, peerFrom = n, v, bytes, from
			}
		}
		for _, n := range slices.Sorted(maps.Keys(bl.Peers)) {
			consider(n, peerMetric(bl.Peers[n]), bl.Peers[n].PeakReservedBytes, baselineSource)
		}
		if ds.kind == deviceCUDA {
			for _, r := range rs {
				if r.Backend == backendAsync {
					consider(r.Backend, ours(r), r.PeakReservedBytes, "measured here")
				}
			}
		}
		who := best.Backend
		if best.Conf != "" {
			who += " (--conf " + best.Conf + ")"
		}
		line := fmt.Sprintf("verdict %s: %s %s", name, who, metric)
		if peerName != "" {
			// Peak reserved compares in bytes where the peer's are known
			// (the peak live bytes are the same: baselineOf); else at
			// baseline.json's precision, four decimals, so that a tie to
			// the byte or to that precision is equal, not lower.
			a, b := math.Round(ours(best)*1e4), math.Round(peerVal*1e4)
			if !byCap && peerBytes > 0 {
				a, b = float64(best.PeakReservedBytes), float64(peerBytes)
			}
			cmp := "lower"
			switch {
			case a > b:
				cmp = "higher"
			case a == b:
				cmp = "equal"
			}
			o, q := verdictFigures(ours(best), peerVal, cmp == "equal")
			line += fmt.Sprintf(" %s× live vs %s× for the best peer (%s, %s): %s", o, q, peerName, peerFrom, cmp)
		} else {
			line += fmt.Sprintf(" %.3f× live (no peer figure to compare)", ours(best))
		}
		out = append(out, line)
	}
	return out
}

// verdictFigures formats our figure and the peer's as a verdict shows
// them: three decimals where they show what the comparison found; else,
// for equal figures, both at four, rounded (the comparison's precision:
// baseline.json's), and for different ones at the fewest decimals, up to
// six, that tell them apart.
func verdictFigures(ours, peer float64, equal bool) (string, string) {
	o, q := fmt.Sprintf("%.3f", ours), fmt.Sprintf("%.3f", peer)
	switch {
	case (o == q) == equal:
		return o, q
	case equal:
		return fmt.Sprintf("%.4f", math.Round(ours*1e4)/1e4), fmt.Sprintf("%.4f", math.Round(peer*1e4)/1e4)
	}
	for prec := 4; prec <= 6; prec++ {
		if o, q = fmt.Sprintf("%.*f", prec, ours), fmt.Sprintf("%.*f", prec, peer); o != q {
			break
		}
	}
	return o, q
}

// plural is n and word, with an s unless n is 1.
func plural(n int, word string) string {
	if n == 1 {
		return "1 " + word
	}
	return fmt.Sprintf("%d %ss", n, word)
}

// traceKey names a replayed trace: two files of one name are two traces.
type traceKey struct{ name, source string }

// sameTrace reports whether two results are of one trace.
func sameTrace(a, b *replayResult) bool { return a.Trace == b.Trace && a.Source == b.Source }

// baselineOf returns the peers' figures for r's trace: those recorded for
// the embedded trace of its name, where r replayed that trace (the same
// number of operations and peak live bytes, the trace's own: under a cap
// a replay skips the frees of failed allocations), not a file that only
// shares its name.
func baselineOf(baselines map[string]trace.Baseline, r *replayResult) (trace.Baseline, bool) {
	bl, ok := baselines[r.Trace]
	if !ok || bl.Ops != r.traceOps || bl.PeakLiveBytes != r.PeakLiveBytes {
		return trace.Baseline{}, false
	}
	return bl, true
}
