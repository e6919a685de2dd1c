package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
)

// Snapshots (replay --snapshot FILE): each trace is replayed once more
// with the first pool backend of --backend, its history recorded
// (pool.Options.History, one event per op and per growth or release),
// and the pool's snapshot is written before the blocks still live are
// freed, as the pickle torch.cuda.memory._snapshot() returns. PyTorch's
// viewer reads it: pytorch.org/memory_viz, or
//
//	python3 -m torch.cuda._memory_viz trace_plot FILE -o FILE.html

// snapshotName is where the snapshot of trace t goes: file itself with
// one trace, else FILE-TRACE.ext.
func snapshotName(file string, traces []*trace.Trace, t *trace.Trace) string {
	if len(traces) == 1 {
		return file
	}
	ext := filepath.Ext(file)
	return strings.TrimSuffix(file, ext) + "-" + t.Name + ext
}

// snapshotBackend is the backend snapshots are taken with: the first
// pool backend asked for.
func snapshotBackend(backends []string) (string, bool) {
	for _, b := range backends {
		if b != backendAsync {
			return b, true
		}
	}
	return "", false
}

// checkOutputPath fails at once where file cannot be written (its
// directory is missing, or it is a directory), so that a bad path does
// not fail only after the whole replay.
func checkOutputPath(flag, file string) error {
	dir := filepath.Dir(file)
	st, err := os.Stat(dir)
	if err != nil || !st.IsDir() {
		return usagef("%s %q: no directory %q to write it in", flag, file, dir)
	}
	if st, err := os.Stat(file); err == nil && st.IsDir() {
		return usagef("%s %q is a directory", flag, file)
	}
	return nil
}

// writeSnapshots writes one snapshot per trace and says where.
func writeSnapshots(ds *devices, traces []*trace.Trace, o *replayOpts, say func(string)) error {
	be, ok := snapshotBackend(o.backends)
	if !ok {
		return usagef("--snapshot needs a pool backend (%s, %s or %s) in --backend", backendVMM, backendChunks, backendPassthrough)
	}
	for _, t := range traces {
		name := snapshotName(o.snapshot, traces, t)
		if err := writeSnapshot(ds, t, be, o, name); err != nil {
			return fmt.Errorf("--snapshot %s: %w", name, err)
		}
		say(fmt.Sprintf("snapshot of %s with %s (PyTorch memory snapshot pickle): %s", t.Name, be, name))
	}
	return nil
}

func writeSnapshot(ds *devices, t *trace.Trace, be string, o *replayOpts, name string) error {
	dev, release := ds.get()
	defer release()
	total, err := deviceTotal(dev)
	if err != nil {
		return err
	}
	// Every op, and the growths and releases between them.
	events := 2*len(t.Ops) + 1024
	return withAllocator(dev, t, be, allocOptions{base: ds.pool, capBytes: o.cap.resolve(total), history: events}, func(a replayAllocator) error {
		res, _, err := replayTrace(replay.Compile(t), a, 0)
		if err != nil {
			return err
		}
		p := a.allocator.(poolAlloc).Pool
		s, err := p.Snapshot()
		if err != nil {
			return err
		}
		f, err := os.Create(name)
		if err != nil {
			return err
		}
		werr := s.WritePickle(f)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			return werr
		}
		return res.FreeLeft(a)
	})
}

// poolBackends are the backends --snapshot can use.
var poolBackends = slices.DeleteFunc(slices.Clone(allBackends), func(b string) bool { return b == backendAsync })
