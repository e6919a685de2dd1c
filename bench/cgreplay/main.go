// Command cgreplay replays an embedded trace n times through a pool on the
// simulated H200 (default options, BackendVMM, through replay.Pool, as
// BenchmarkPoolReplay does) or through the TLSF index alone (AllocFit,
// the pool's placement, as BenchmarkReplay's tlsf-fit-harness does), for
// counting instructions with Valgrind's callgrind, which repeats to the
// instruction where timings on a shared VM do not:
//
//	go build -o /tmp/cgreplay ./bench/cgreplay
//	GODEBUG=asyncpreemptoff=1 GOMAXPROCS=1 valgrind --tool=callgrind \
//	    --toggle-collect='*loopRange*' /tmp/cgreplay lstm 51 pool
//
// The first replay is the cold one: the instructions of n = 51 less those
// of n = 1 are 50 warm replays'. The README's instruction figures come
// from it.
//
// Usage: cgreplay TRACE N [pool|index]
package main

import (
	"fmt"
	"os"
	"strconv"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/internal/replay"
	"github.com/gpumem/tlsf/internal/trace"
	"github.com/gpumem/tlsf/pool"
	"github.com/gpumem/tlsf/tlsf"
)

// index is the TLSF index alone behind replay.Allocator.
type index struct{ x *tlsf.Index }

func (a *index) Alloc(size, _ uint64) (uintptr, error) {
	b, err := a.x.AllocFit(size)
	return uintptr(b.Addr), err
}

func (a *index) Free(ptr uintptr, _, _ uint64) error {
	_, err := a.x.Free(uint64(ptr))
	return err
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "cgreplay:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	if len(args) < 2 || len(args) > 3 {
		return fmt.Errorf("usage: cgreplay TRACE N [pool|index]")
	}
	tr, err := trace.Load(args[0])
	if err != nil {
		return err
	}
	n, err := strconv.Atoi(args[1])
	if err != nil || n < 1 {
		return fmt.Errorf("N %q: want a count of replays, 1 or more", args[1])
	}
	mode := "pool"
	if len(args) == 3 {
		mode = args[2]
	}
	var a replay.Allocator
	switch mode {
	case "pool":
		p, err := pool.New(sim.New(sim.Config{}), pool.Options{Backend: pool.BackendVMM})
		if err != nil {
			return err
		}
		defer p.Close()
		a = &replay.Pool{P: p}
	case "index":
		x, err := tlsf.New(tlsf.Config{SLLog2: 6})
		if err != nil {
			return err
		}
		if err := x.AddRegion(0, 1<<40); err != nil {
			return err
		}
		a = &index{x: x}
	default:
		return fmt.Errorf("mode %q: want pool or index", mode)
	}
	w, err := replay.Compile(tr).Warm(a, n)
	if err != nil {
		return err
	}
	fmt.Printf("%s through the %s: %d replays, median %.1f ns per operation\n", args[0], mode, n, w.MedianNsPerOp)
	return nil
}
