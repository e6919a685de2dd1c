package main

import (
	"bufio"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"

	"github.com/gpumem/tlsf/internal/trace"
	"github.com/spf13/cobra"
)

// opsMagic opens every op list export writes; the number after it is the
// format's version, bumped on any change a reader must know of.
const opsMagic = "tlsf-ops 1"

// exportResult describes one op list export wrote: a JSON line of its
// output. doc.go documents the fields.
type exportResult struct {
	Trace         string `json:"trace"`
	Source        string `json:"source"`
	Format        string `json:"format"`
	File          string `json:"file"`
	Ops           int    `json:"ops"`
	Allocs        int    `json:"allocs"`
	Frees         int    `json:"frees"`
	Slots         int    `json:"slots"`
	Streams       int    `json:"streams"`
	PeakLiveBytes uint64 `json:"peak_live_bytes"`
	Skipped       int    `json:"skipped"`
}

func newExportCmd() *cobra.Command {
	var dir string
	var text exportText
	cmd := &cobra.Command{
		Use:   "export [--out DIR] [--text [--comment LINE]...] [TRACE...]",
		Short: "Write traces as dense op lists for replayers outside Go (bench/peers)",
		Long: `Write each TRACE (a file in any format replay reads, or an embedded trace's
name; none: every embedded trace) to DIR/NAME.ops, an op list in which blocks
are dense slot numbers and streams dense indices, so that a replayer in C or
C++ needs no hash map. The format, one record a line, numbers in decimal:

  tlsf-ops 1 OPS SLOTS STREAMS PEAK_LIVE   header: OPS records follow
  a SLOT SIZE STREAM                       allocate SIZE bytes into SLOT on STREAM
  f SLOT                                   free the block in SLOT (on its own stream)

SLOT < SLOTS, the most blocks live at once: a slot is empty when allocated
and reused only after its block is freed (freed slots are reused last in,
first out). STREAM < STREAMS: 0 is the trace's stream 0 (the default
stream), 1, 2, ... its other streams in order of first use. PEAK_LIVE is
the peak of live bytes (trace.PeakLive). Blocks the trace leaves live have
no f record. One JSON object per trace is printed on stdout.

With --text, each TRACE is written instead to DIR/NAME.trace.gz in this
project's text trace format (gzip; the format of the embedded traces, which
replay reads back to the same ops), after a '#' line per --comment, or, with
no --comment, the trace's own comment lines: how a PyTorch snapshot becomes a
trace of bench/traces. Its JSON object has slots and streams 0. A file is
never written over one of the TRACE files read.`,
		Args: wrapArgs(cobra.ArbitraryArgs),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				args = trace.Names()
			}
			return runExport(cmd.OutOrStdout(), dir, args, text)
		},
	}
	cmd.Flags().StringVarP(&dir, "out", "o", ".", "write the op lists into `DIR` (created if missing)")
	cmd.Flags().BoolVar(&text.on, "text", false, "write NAME.trace.gz in the text trace format instead of NAME.ops")
	cmd.Flags().StringArrayVar(&text.comments, "comment", nil, "with --text, a comment line to write first (repeatable)")
	return cmd
}

// exportText is --text and its --comment lines.
type exportText struct {
	on       bool
	comments []string
}

func runExport(out io.Writer, dir string, args []string, text exportText) error {
	ext := ".ops"
	if text.on {
		ext = ".trace.gz"
	} else if len(text.comments) > 0 {
		return usagef("--comment needs --text")
	}
	traces := make([]*trace.Trace, 0, len(args))
	seen := map[string]string{}
	for _, a := range args {
		t, err := loadTrace(a)
		if err != nil {
			return err
		}
		if prev, dup := seen[t.Name]; dup {
			return usagef("traces %s and %s would both be written to %s%s: rename one", prev, a, t.Name, ext)
		}
		seen[t.Name] = a
		traces = append(traces, t)
	}
	inputs := map[string]bool{}
	for _, a := range args {
		if abs, err := filepath.Abs(a); err == nil {
			inputs[abs] = true
		}
	}
	for _, t := range traces {
		file := filepath.Join(dir, t.Name+ext)
		if abs, err := filepath.Abs(file); err == nil && inputs[abs] {
			return usagef("export would write %s over the trace it reads: give another --out", file)
		}
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	enc := json.NewEncoder(out)
	for _, t := range traces {
		file := filepath.Join(dir, t.Name+ext)
		write := writeOpsFile
		if text.on {
			write = func(file string, t *trace.Trace) (*exportResult, error) { return writeTextFile(file, t, text.comments) }
		}
		r, err := write(file, t)
		if err != nil {
			return err
		}
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// writeOpsFile writes t's op list to file (see newExportCmd for the
// format).
func writeOpsFile(file string, t *trace.Trace) (*exportResult, error) {
	var r *exportResult
	err := writeFile(file, func(w io.Writer) (err error) {
		r, err = writeOps(w, t)
		return err
	})
	if err != nil {
		return nil, err
	}
	r.File = file
	return r, nil
}

// writeTextFile writes t to file in the text trace format, gzipped, its
// comments replaced by comments where there are any. Slots and streams
// are left 0.
func writeTextFile(file string, t *trace.Trace, comments []string) (*exportResult, error) {
	c := *t
	if len(comments) > 0 {
		c.Comments = comments
	}
	err := writeFile(file, func(w io.Writer) error {
		zw := gzip.NewWriter(w)
		err := trace.WriteText(zw, &c)
		if cerr := zw.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &exportResult{Trace: t.Name, Source: t.Source, Format: t.Format.String(), File: file, Ops: len(t.Ops),
		Allocs: t.Allocs(), Frees: t.Frees(), PeakLiveBytes: t.PeakLive(), Skipped: t.Skipped}, nil
}

// writeFile creates file and writes it with write. On any error, of write
// or of closing, it removes the file (no half-written trace is left) and
// returns the error naming the file.
func writeFile(file string, write func(io.Writer) error) error {
	f, err := os.Create(file)
	if err != nil {
		return err
	}
	err = write(f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		_ = os.Remove(file)
		return fmt.Errorf("export %s: %w", file, err)
	}
	return nil
}

// writeOps writes t as an op list to w. The trace must satisfy Check
// (every trace Parse returns does); a free of a block that is not live is
// an error wrapping trace.ErrInvalid.
func writeOps(w io.Writer, t *trace.Trace) (*exportResult, error) {
	slotOf := make(map[uint64]int)        // live block ID -> slot
	streamOf := map[uint64]int{0: 0}      // trace stream -> dense index
	var free []int                        // freed slots, reused last in, first out
	slots := 0                            // slots handed out so far
	recs := make([]string, 0, len(t.Ops)) // the op records, after the header
	r := &exportResult{Trace: t.Name, Source: t.Source, Format: t.Format.String(), Ops: len(t.Ops),
		PeakLiveBytes: t.PeakLive(), Skipped: t.Skipped}
	for i, op := range t.Ops {
		if op.Free {
			s, ok := slotOf[op.ID]
			if !ok {
				return nil, fmt.Errorf("op %d: free of block %d, which is not live: %w", i, op.ID, trace.ErrInvalid)
			}
			delete(slotOf, op.ID)
			free = append(free, s)
			recs = append(recs, fmt.Sprintf("f %d", s))
			r.Frees++
			continue
		}
		if _, dup := slotOf[op.ID]; dup {
			return nil, fmt.Errorf("op %d: allocation of block %d, which is live: %w", i, op.ID, trace.ErrInvalid)
		}
		var s int
		if n := len(free); n > 0 {
			s, free = free[n-1], free[:n-1]
		} else {
			s = slots
			slots++
		}
		slotOf[op.ID] = s
		st, ok := streamOf[op.Stream]
		if !ok {
			st = len(streamOf)
			streamOf[op.Stream] = st
		}
		recs = append(recs, fmt.Sprintf("a %d %d %d", s, op.Size, st))
		r.Allocs++
	}
	r.Slots, r.Streams = slots, len(streamOf)
	bw := bufio.NewWriter(w)
	fmt.Fprintf(bw, "%s %d %d %d %d\n", opsMagic, len(recs), r.Slots, r.Streams, r.PeakLiveBytes)
	bw.WriteString(strings.Join(recs, "\n"))
	if len(recs) > 0 {
		bw.WriteByte('\n')
	}
	return r, bw.Flush()
}
