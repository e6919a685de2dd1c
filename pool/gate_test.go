package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestFastPathGate follows the fast paths' gate (Pool.gate) through each
// change of its inputs on a VMM pool: the first stream, RecordStream's
// uses and their end, released pages below the heap's end and their
// mapping again, a second stream, Close. Check verifies the gate after
// every step, as it does in every other test.
func TestFastPathGate(t *testing.T) {
	r := newStreamRig(t, BackendVMM, Options{})
	p := r.p
	type gate struct {
		alloc uint64
		free  bool
		s     uintptr
	}
	now := func() gate {
		p.mu.Lock()
		defer p.mu.Unlock()
		return gate{p.allocGate, p.freeGate, uintptr(p.gateStream)}
	}
	step := func(want gate) {
		t.Helper()
		require.Equal(t, want, now())
		checkStep(t, p, r.d)
	}
	p.mu.Lock()
	fastMax := p.fastMax
	p.mu.Unlock()
	open := gate{fastMax, true, uintptr(r.a)}
	step(gate{}) // no stream yet

	x, err := p.AllocOn(streamBlock, r.a)
	require.NoError(t, err)
	step(open)

	require.NoError(t, p.RecordStream(x, r.b))
	step(gate{fastMax, false, uintptr(r.a)}) // its free takes freeBlock
	require.NoError(t, p.FreeOn(x, r.a))
	step(open) // held until b's event; no use left

	// Released pages below the heap's end: allocations leave the fast
	// path until they are mapped again.
	big := uint64(64 * miB)
	y, err := p.AllocOn(big, r.a)
	require.NoError(t, err)
	z, err := p.AllocOn(streamBlock, r.a)
	require.NoError(t, err)
	require.NoError(t, p.FreeOn(y, r.a))
	_, err = p.Trim()
	require.NoError(t, err)
	p.mu.Lock()
	holes := p.vmm.holes
	p.mu.Unlock()
	require.NotZero(t, holes, "Trim released the pages under the free block below z")
	step(gate{0, true, uintptr(r.a)})
	y, err = p.AllocOn(big, r.a) // maps the holes again
	require.NoError(t, err)
	step(open)

	w, err := p.AllocOn(streamBlock, r.b) // a second stream: multi-stream mode
	require.NoError(t, err)
	step(gate{})
	for _, ptr := range []uintptr{y, z} {
		require.NoError(t, p.FreeOn(ptr, r.a))
	}
	require.NoError(t, p.FreeOn(w, r.b))
	checkStep(t, p, r.d)

	require.NoError(t, p.Close())
	require.Equal(t, gate{}, now())
}

// TestFastPathGateChunks: a chunks pool has no released pages below an
// end; its gate follows the stream set alone.
func TestFastPathGateChunks(t *testing.T) {
	r := newStreamRig(t, BackendChunks, Options{})
	p := r.p
	gate := func() (uint64, bool, uintptr) {
		p.mu.Lock()
		defer p.mu.Unlock()
		return p.allocGate, p.freeGate, uintptr(p.gateStream)
	}
	x, err := p.AllocOn(streamBlock, r.a)
	require.NoError(t, err)
	a, f, s := gate()
	require.NotZero(t, a)
	require.True(t, f)
	require.Equal(t, uintptr(r.a), s)
	checkStep(t, p, r.d)
	y, err := p.AllocOn(streamBlock, r.b)
	require.NoError(t, err)
	a, f, s = gate()
	require.Zero(t, a)
	require.False(t, f)
	require.Zero(t, s)
	require.NoError(t, p.FreeOn(x, r.a))
	require.NoError(t, p.FreeOn(y, r.b))
	checkStep(t, p, r.d)
}
