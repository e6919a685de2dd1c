package pool_test

import (
	"bytes"
	"errors"
	"fmt"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
)

// A pool on the simulated GPU (package sim); on a real one,
// pool.NewCUDA(0, pool.Options{}) makes it.
func Example() {
	dev := sim.New(sim.Config{Capacity: 1 << 30})
	p, err := pool.New(dev, pool.Options{})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	ptr, err := p.Alloc(1000) // a CUDA device pointer, 256-byte aligned
	if err != nil {
		panic(err)
	}
	n, _ := p.Size(ptr)
	fmt.Println("usable bytes:", n)
	fmt.Println("aligned:", ptr%256 == 0)
	if err := p.Free(ptr); err != nil {
		panic(err)
	}
	fmt.Println("Free(0):", p.Free(0))
	// Output:
	// usable bytes: 1024
	// aligned: true
	// Free(0): <nil>
}

// Statistics, and peaks per phase of a program.
func ExamplePool_ResetPeaks() {
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{Cache: pool.CacheOptions{Disable: true}})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	a, _ := p.Alloc(64 << 20)
	_ = p.Free(a)
	fmt.Println("peak allocated MiB:", p.Stats().AllocatedPeak>>20)

	p.ResetPeaks() // a new phase: peaks start from what is in use now
	b, _ := p.Alloc(8 << 20)
	s := p.Stats()
	fmt.Println("peak allocated MiB:", s.AllocatedPeak>>20)
	fmt.Println("allocations of 8 MiB blocks:", s.AllocsBySize[pool.SizeBucket(8<<20)])
	_ = p.Free(b)
	// Output:
	// peak allocated MiB: 64
	// peak allocated MiB: 8
	// allocations of 8 MiB blocks: 1
}

// A hook that frees memory when the pool runs out: in a Go program, the
// place to run the garbage collector and the finalizers that free device
// memory (runtime.GC()).
func ExampleOptions_onOutOfMemory() {
	var spare []uintptr // memory the program can do without
	var p *pool.Pool
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{
		MaxBytes: 64 << 20,
		OnOutOfMemory: func(request uint64) {
			fmt.Printf("out of memory for %d MiB: freeing %d blocks\n", request>>20, len(spare))
			for _, ptr := range spare {
				_ = p.Free(ptr)
			}
			spare = nil
		},
	})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	for range 3 {
		ptr, _ := p.Alloc(16 << 20)
		spare = append(spare, ptr)
	}
	big, err := p.Alloc(48 << 20)
	fmt.Println("48 MiB:", err)
	_ = p.Free(big)

	_, err = p.Alloc(1 << 30)
	fmt.Println("1 GiB is out of memory:", errors.Is(err, pool.ErrOutOfMemory))
	// Output:
	// out of memory for 48 MiB: freeing 3 blocks
	// 48 MiB: <nil>
	// 1 GiB is out of memory: true
}

// A snapshot in PyTorch's format, for its memory viewer: write it to a
// file and open it at pytorch.org/memory_viz, or run
// python3 -m torch.cuda._memory_viz trace_plot snap.pickle -o snap.html.
func ExamplePool_Snapshot() {
	p, err := pool.New(sim.New(sim.Config{Capacity: 1 << 30}), pool.Options{History: 1000})
	if err != nil {
		panic(err)
	}
	defer p.Close()

	a, _ := p.Alloc(3 << 20)
	b, _ := p.Alloc(1 << 20)
	_ = p.Free(a)

	s, err := p.Snapshot()
	if err != nil {
		panic(err)
	}
	for _, sg := range s.Segments {
		fmt.Printf("segment of %d MiB:\n", sg.Size>>20)
		for _, blk := range sg.Blocks {
			fmt.Printf("  %-16s %8d bytes\n", blk.State, blk.Size)
		}
	}
	for _, e := range s.History {
		fmt.Println(e.Action, e.Size)
	}
	var buf bytes.Buffer // or an *os.File
	if err := s.WritePickle(&buf); err != nil {
		panic(err)
	}
	_ = p.Free(b)
	// Output:
	// segment of 4 MiB:
	//   inactive          3145728 bytes
	//   active_allocated  1048576 bytes
	// segment_map 4194304
	// alloc 3145728
	// alloc 1048576
	// free_requested 3145728
}
