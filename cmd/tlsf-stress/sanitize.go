package main

// tlsf-stress sanitize: bugs planted on purpose, for memory checkers.
//
// Each case allocates from a pool and makes the GPU itself store one
// byte (device.ByteStorer: a one-thread PTX kernel on a CUDA device), the
// way a buggy kernel would:
//
//	inside      the last byte of a block: a valid store, never reported
//	past-end    one byte past the end of a block (inside the pool's
//	            memory: the block is rounded up to 256 bytes or more)
//	after-free  the first byte of a block already freed (its memory
//	            still the pool's, so still mapped)
//	leak        a block left allocated, the pool never closed
//	guard       past-end in guard mode (pool.Options.Guard): the free
//	            must fail with pool.ErrCorrupted
//
// Run under compute-sanitizer (which sets NVTX_INJECTION64_PATH, so the
// pool registers its heaps and blocks through device/nvtx), past-end and
// after-free must each be reported and inside must not; with
// --leak-check full, leak must be. That holds for the chunks backend (the
// default here); the tool refuses a VMM pool's heap, so a tlsf-vmm pool
// makes no NVTX calls and nothing is reported (pool/nvtx.go). "all" runs inside, past-end and
// after-free in turn in one process: give compute-sanitizer
// --destroy-on-device-error kernel, or a reported store ends the context.
// Without a checker only guard detects anything; the other cases run,
// report what they did and succeed.

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/nvtx"
	"github.com/gpumem/tlsf/pool"
	"github.com/spf13/cobra"
)

var sanitizeCases = []string{"inside", "past-end", "after-free", "leak", "guard", "all"}

type sanitizeOpts struct {
	backend string
	cases   []string
	size    sizeFlag
	guard   sizeFlag
}

func newSanitizeCmd(g *globalFlags) *cobra.Command {
	o := &sanitizeOpts{size: 1000, guard: 64}
	cmd := &cobra.Command{
		Use:   "sanitize",
		Short: "Plant out-of-bounds and use-after-free stores for compute-sanitizer, and test guard mode",
		Long: `sanitize allocates from a pool and makes the GPU store one byte: inside a
block (valid), one byte past its end, or into a freed block; or leaves a
block allocated; or overruns a block in guard mode. Run it under
compute-sanitizer --tool memcheck: the pool shows its heaps and blocks to the
tool through the NVTX memory API, so the store past the end and the store
after free are reported although both land in memory the pool holds.

Cases: ` + strings.Join(sanitizeCases, ", ") + `; all is inside, past-end and
after-free (leak and guard run only when named).`,
		Args: wrapArgs(cobra.NoArgs),
		RunE: func(cmd *cobra.Command, _ []string) error { return runSanitize(cmd, g, o) },
	}
	f := cmd.Flags()
	f.StringVar(&o.backend, "backend", backendChunks, "pool backend: tlsf-vmm, tlsf-chunks or passthrough")
	f.StringSliceVar(&o.cases, "case", []string{"all"}, "cases to run, in order: "+strings.Join(sanitizeCases, ", ")+" (all: inside, past-end, after-free)")
	f.Var(&o.size, "size", "block size in bytes")
	f.Var(&o.guard, "guard", fmt.Sprintf("red zone of the guard case, bytes (1 to %d)", pool.MaxGuard))
	return cmd
}

func runSanitize(cmd *cobra.Command, g *globalFlags, o *sanitizeOpts) error {
	out := cmd.OutOrStdout()
	o.backend = effectiveBackend(o.backend)
	be, ok := poolBackend(o.backend)
	if !ok {
		return usagef("--backend %q: want tlsf-vmm, tlsf-chunks or passthrough", o.backend)
	}
	var cases []string
	for _, c := range o.cases {
		if !slices.Contains(sanitizeCases, c) {
			return usagef("--case %q: want one of %s", c, strings.Join(sanitizeCases, ", "))
		}
		if c == "all" {
			cases = append(cases, "inside", "past-end", "after-free")
			continue
		}
		cases = append(cases, c)
	}
	if o.size == 0 {
		return usagef("--size 0: want at least 1 byte")
	}
	if slices.Contains(cases, "guard") && (o.guard == 0 || uint64(o.guard) > pool.MaxGuard) {
		return usagef("--guard %d: the guard case wants a red zone of 1 to %d bytes", uint64(o.guard), pool.MaxGuard)
	}
	ds, err := openDevices(g, true)
	if err != nil {
		return err
	}
	defer ds.close()
	if ds.note != "" {
		fmt.Fprintln(cmd.ErrOrStderr(), "tlsf-stress:", ds.note)
	}
	d, done := ds.get()
	defer done()
	st, ok := d.(device.ByteStorer)
	if !ok {
		return fmt.Errorf("%s cannot run a store kernel (device.ByteStorer)", ds.name())
	}
	switch c := nvtx.Default(); {
	case c != nil && be == pool.BackendVMM:
		fmt.Fprintln(out, "sanitize: NVTX memory API attached, but a VMM pool makes no NVTX calls (the tool refuses its heap): use tlsf-chunks")
	case c != nil:
		fmt.Fprintln(out, "sanitize: NVTX memory API attached: heaps and blocks are shown to the tool")
	case nvtx.DefaultError() != nil:
		fmt.Fprintf(out, "sanitize: NVTX memory API not attached: %v\n", nvtx.DefaultError())
	default:
		fmt.Fprintf(out, "sanitize: no tool attached (%s unset)\n", nvtx.InjectionEnv)
	}
	failed := false
	for _, c := range cases {
		if err := sanitizeCase(out, d, st, ds.pool, be, c, uint64(o.size), uint64(o.guard)); err != nil {
			fmt.Fprintf(out, "sanitize: %s: FAILED: %v\n", c, err)
			failed = true
		}
	}
	if failed {
		return errFailed
	}
	return nil
}

// sanitizeCase runs one case on a pool of its own.
func sanitizeCase(out io.Writer, d device.Device, st device.ByteStorer, base pool.Options, be pool.Backend, c string, size, guard uint64) error {
	o := base // --conf
	o.Backend = be
	if c == "guard" {
		o.Guard = guard
	}
	p, err := pool.New(d, o)
	if err != nil {
		return err
	}
	if c != "leak" {
		defer p.Close()
	}
	ptr, err := p.Alloc(size)
	if err != nil {
		return err
	}
	store := func(at uintptr, what string) error {
		fmt.Fprintf(out, "sanitize: %s: block %#x of %d bytes (%s): storing 1 byte at %#x (%s)\n", c, ptr, size, be, at, what)
		if err := st.StoreByte(at, 0x5A, 0); err != nil {
			return fmt.Errorf("launching the store: %w", err)
		}
		if err := d.StreamSynchronize(0); err != nil {
			return fmt.Errorf("after the store: %w", err)
		}
		return nil
	}
	// refused passes a bad store that the device itself refused (the
	// simulated device checks every address, as the driver's own
	// allocations are checked under compute-sanitizer): detected.
	refused := func(err error) error {
		if errors.Is(err, device.ErrIllegalAddress) {
			fmt.Fprintf(out, "sanitize: %s: detected by the device: %v\n", c, err)
			return nil
		}
		return err
	}
	switch c {
	case "inside":
		if err := store(ptr+uintptr(size)-1, "its last byte"); err != nil {
			return err
		}
		return p.Free(ptr)
	case "past-end":
		if err := refused(store(ptr+uintptr(size), "one byte past the end")); err != nil {
			return err
		}
		return p.Free(ptr)
	case "after-free":
		if err := p.Free(ptr); err != nil {
			return err
		}
		return refused(store(ptr, "the first byte, after the block was freed"))
	case "leak":
		fmt.Fprintf(out, "sanitize: leak: block %#x of %d bytes (%s) left allocated, pool not closed\n", ptr, size, be)
		return nil
	case "guard":
		if err := store(ptr+uintptr(size), fmt.Sprintf("one byte past the end, into the %d-byte red zone", guard)); err != nil {
			return err
		}
		err := p.Free(ptr)
		if !errors.Is(err, pool.ErrCorrupted) {
			return fmt.Errorf("free returned %v, want pool.ErrCorrupted", err)
		}
		fmt.Fprintf(out, "sanitize: guard: caught: %v\n", err)
		return p.Free(ptr) // reported once: it frees now
	}
	return fmt.Errorf("unknown case %q", c)
}
