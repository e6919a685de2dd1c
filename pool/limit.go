package pool

// The cap on reserved memory, changed while the pool runs: PyTorch's
// torch.cuda.set_per_process_memory_fraction reaches the pool through the
// C ABI's memory-fraction hook (capi/) after the pool was made.

// SetMaxBytes sets the cap on reserved memory to n bytes, as
// Options.MaxBytes (0: no cap in bytes; MaxFraction still applies). The
// cap applies from the next growth on (a cap below the allocation
// granularity, 1 say, refuses every growth, as a memory fraction of 0
// does in PyTorch): memory reserved above a lowered
// cap is not returned at once (Trim returns the handles or chunks wholly
// unused; one a live block touches stays whole: Trim), and until
// reserved memory falls below the cap every request that needs more fails
// with ErrOutOfMemory after the out-of-memory path. Safe for concurrent
// use. Errors: ErrClosed.
func (p *Pool) SetMaxBytes(n uint64) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return ErrClosed
	}
	p.opts.MaxBytes = n
	return nil
}

// Cap returns the cap on reserved memory in bytes now, 0 when there is
// none: the smaller of MaxBytes and MaxFraction × the device's total
// memory as cuMemGetInfo reported it at New, less what that share leaves
// for the process's context (Options.MaxFraction; share.go). It makes no
// driver call, so it answers even when the driver no longer does. Safe
// for concurrent use. Errors: ErrClosed.
func (p *Pool) Cap() (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, ErrClosed
	}
	if p.opts.MaxFraction >= 1 {
		return p.opts.MaxBytes, nil
	}
	capped, limit, err := p.cap()
	if err != nil || !capped {
		return 0, err
	}
	return limit, nil
}
