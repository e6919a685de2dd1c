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

// outputName is where --snapshot's or --plot's file for trace t goes:
// file itself with one trace, else FILE-TRACE.ext.
func outputName(file string, traces []*trace.Trace, t *trace.Trace) string {
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

// checkOutputs fails at once, before any replay, where one of the files
// flag's value file names for traces (outputName) cannot be written: two
// traces of one name, a missing directory, a directory in its place, a
// file it cannot open for writing, one of the trace files read (inputs,
// as given on the command line), or a file another flag writes (seen:
// file → flag, shared by the calls for --plot and --snapshot). A file
// that did not exist is created to try, and removed again.
func checkOutputs(flag, file string, traces []*trace.Trace, inputs []string, seen map[string]string) error {
	for _, t := range traces {
		name := outputName(file, traces, t)
		if other, ok := seen[filepath.Clean(name)]; ok {
			if other != flag {
				return usagef("%s and %s would both write %s: give them different names", other, flag, name)
			}
			return usagef("%s: two traces named %s would both be written to %s: rename one", flag, t.Name, name)
		}
		seen[filepath.Clean(name)] = flag
		dir := filepath.Dir(name)
		if st, err := os.Stat(dir); err != nil || !st.IsDir() {
			return usagef("%s %q: no directory %q to write it in", flag, name, dir)
		}
		st, err := os.Stat(name)
		if err == nil && st.IsDir() {
			return usagef("%s %q is a directory", flag, name)
		}
		if err == nil {
			for _, in := range inputs {
				if ist, ierr := os.Stat(in); ierr == nil && os.SameFile(st, ist) {
					return usagef("%s would write %s over the trace it reads: give another name", flag, name)
				}
			}
		}
		f, ferr := os.OpenFile(name, os.O_WRONLY|os.O_CREATE, 0o644)
		if ferr != nil {
			return fmt.Errorf("%s: %w", flag, ferr)
		}
		_ = f.Close()
		if err != nil { // created by this check
			_ = os.Remove(name)
		}
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
		name := outputName(o.snapshot, traces, t)
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
	return withAllocator(dev, t, be, allocOptions{base: ds.pool, capBytes: o.cap.resolve(total), history: events}, func(a *replayAllocator) error {
		res, _, err := replayTrace(replay.Compile(t), a, a, 0)
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
			_ = os.Remove(name) // no partial pickle left behind
			return werr
		}
		return res.FreeLeft(a)
	})
}

// poolBackends are the backends --snapshot can use.
var poolBackends = slices.DeleteFunc(slices.Clone(allBackends), func(b string) bool { return b == backendAsync })
