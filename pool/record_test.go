package pool

// RecordStream and destroyed streams on the simulated GPU. Holding a
// stream keeps its work queued, so that Sim reports (Violations) any reuse
// or release of memory that the work still writes.

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

func TestRecordStream(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String()+"/the block waits for the recorded stream's work, then comes back", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			require.NoError(t, r.p.RecordStream(x, r.b))
			r.writeHeld(t, x, streamBlock, r.b)
			require.NoError(t, r.p.FreeOn(x, r.a))
			s := r.p.Stats()
			require.Equal(t, uint64(streamBlock), s.Pending)
			require.Equal(t, int64(1), s.PendingBlocks)
			checkStep(t, r.p, r.d)

			y, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			require.NotEqual(t, x, y, "reused on a while b still writes it")
			require.NoError(t, r.p.FreeOn(y, r.a))

			require.NoError(t, r.sd.ReleaseStream(r.b))
			_, err = r.p.Trim()
			require.NoError(t, err)
			require.Zero(t, r.p.Stats().Pending)
			checkStep(t, r.p, r.d)
		})
		t.Run(be.String()+"/under a cap, the out-of-memory path waits for the recorded stream", func(t *testing.T) {
			r := newStreamRig(t, be, Options{MaxBytes: streamBlock})
			x, err := r.p.AllocOn(streamBlock, 0)
			require.NoError(t, err)
			require.NoError(t, r.p.RecordStream(x, r.b))
			r.writeHeld(t, x, streamBlock, r.b)
			require.NoError(t, r.p.Free(x))
			y, err := r.p.AllocOn(streamBlock, 0)
			require.NoError(t, err)
			require.Equal(t, x, y, "the only block under the cap, after b's work")
			checkStep(t, r.p, r.d)
			require.NoError(t, r.p.Free(y))
		})
		t.Run(be.String()+"/a block from a cache is recorded too", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.Alloc(4096)
			require.NoError(t, err)
			require.NoError(t, r.p.RecordStream(x, r.b))
			checkStep(t, r.p, r.d)
			r.writeHeld(t, x, 4096, r.b)
			require.NoError(t, r.p.Free(x))
			require.Equal(t, int64(1), r.p.Stats().PendingBlocks)
			checkStep(t, r.p, r.d)
			for range 64 { // the cache and the index must not hand x out
				y, err := r.p.Alloc(4096)
				require.NoError(t, err)
				require.NotEqual(t, x, y)
				defer func() { require.NoError(t, r.p.Free(y)) }()
			}
			require.NoError(t, r.sd.ReleaseStream(r.b))
		})
		t.Run(be.String()+"/recording the freeing stream changes nothing", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			require.NoError(t, r.p.RecordStream(x, r.a))
			require.NoError(t, r.p.RecordStream(x, r.a))
			require.NoError(t, r.p.FreeOn(x, r.a))
			require.Zero(t, r.p.Stats().PendingBlocks)
			checkStep(t, r.p, r.d)
		})
	}
	t.Run("passthrough/cuMemFree waits for the recorded stream", func(t *testing.T) {
		r := newStreamRig(t, BackendPassthrough, Options{})
		x, err := r.p.AllocOn(streamBlock, r.a)
		require.NoError(t, err)
		require.NoError(t, r.p.RecordStream(x, r.b))
		r.writeHeld(t, x, streamBlock, r.b)
		require.NoError(t, r.p.FreeOn(x, r.a))
		require.Empty(t, r.sd.Violations())
		checkStep(t, r.p, r.d)
	})
}

func TestRecordStreamRejects(t *testing.T) {
	for _, be := range []Backend{BackendVMM, BackendChunks, BackendPassthrough} {
		t.Run(be.String(), func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			freed, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			require.NoError(t, r.p.FreeOn(freed, r.a))
			before := r.p.Stats()
			for name, ptr := range map[string]uintptr{
				"foreign":  0x1000,
				"interior": x + 256,
				"odd":      x + 1,
				"freed":    freed,
				"null":     0,
			} {
				err := r.p.RecordStream(ptr, r.b)
				require.ErrorIs(t, err, ErrUnknownPointer, name)
				require.Equal(t, withoutCounters(before), withoutCounters(r.p.Stats()), name)
				checkStep(t, r.p, r.d)
			}
			require.NoError(t, r.p.FreeOn(x, r.a))
			require.Zero(t, r.p.Stats().PendingBlocks)
			require.NoError(t, r.p.Close())
			require.ErrorIs(t, r.p.RecordStream(x, r.b), ErrClosed)
		})
	}
}

// A stream destroyed without ForgetStream is dropped when the pool finds
// it dead, and the pool keeps serving: new streams register, Trim and
// Close succeed.
func TestADestroyedStreamIsDropped(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String()+"/single-stream mode: a new stream takes its place", func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: be})
			s, err := sd.StreamCreate()
			require.NoError(t, err)
			x, err := p.AllocOn(streamBlock, s)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, s)) // s is dirty
			require.NoError(t, sd.StreamDestroy(s))

			s2 := newStreams(t, sd, 1)[0]
			y, err := p.AllocOn(streamBlock, s2)
			require.NoError(t, err, "registering a new stream after s died")
			require.NoError(t, p.FreeOn(y, s2))
			_, err = p.Trim()
			require.NoError(t, err)
			checkStep(t, p, d)
			require.NoError(t, p.ForgetStream(s), "forgetting a stream dropped already")
		})
		t.Run(be.String()+"/multi-stream mode: its pending blocks come back", func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: be})
			a, err := sd.StreamCreate()
			require.NoError(t, err)
			b := newStreams(t, sd, 1)[0]
			x, err := p.AllocOn(streamBlock, a)
			require.NoError(t, err)
			y, err := p.AllocOn(streamBlock, b)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, a)) // pending on a, in its open batch
			require.Equal(t, int64(1), p.Stats().PendingBlocks)
			require.NoError(t, sd.StreamDestroy(a))

			_, err = p.Trim()
			require.NoError(t, err)
			require.Zero(t, p.Stats().PendingBlocks)
			checkStep(t, p, d)
			z, err := p.AllocOn(streamBlock, b)
			require.NoError(t, err)
			for _, ptr := range []uintptr{y, z} {
				require.NoError(t, p.FreeOn(ptr, b))
			}
			checkStep(t, p, d)
		})
		t.Run(be.String()+"/a destroyed recorded stream is skipped", func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: be})
			s, err := sd.StreamCreate()
			require.NoError(t, err)
			x, err := p.Alloc(streamBlock)
			require.NoError(t, err)
			require.NoError(t, p.RecordStream(x, s))
			require.NoError(t, sd.StreamDestroy(s))
			require.NoError(t, p.Free(x))
			_, err = p.Trim()
			require.NoError(t, err)
			require.Zero(t, p.Stats().PendingBlocks)
			checkStep(t, p, d)
		})
	}
	t.Run("passthrough/a free on a destroyed stream", func(t *testing.T) {
		sd := sim.New(sim.Config{Capacity: giB})
		d := onSim(sd)
		p := openPool(t, d, Options{Backend: BackendPassthrough})
		s, err := sd.StreamCreate()
		require.NoError(t, err)
		x, err := p.AllocOn(streamBlock, s)
		require.NoError(t, err)
		require.NoError(t, sd.StreamDestroy(s))
		require.NoError(t, p.FreeOn(x, s))
		checkStep(t, p, d)
	})
}

// Other driver failures are not taken for a destroyed stream: the free's
// event failing for another reason fails the free, and nothing changes.
func TestRecordStreamEventFailureFailsTheFree(t *testing.T) {
	r := newStreamRig(t, BackendVMM, Options{})
	x, err := r.p.AllocOn(streamBlock, r.a)
	require.NoError(t, err)
	require.NoError(t, r.p.RecordStream(x, r.b))
	before := r.p.Stats()
	r.sd.FailNth(device.CallEventRecord, 2, nil)
	require.ErrorIs(t, r.p.FreeOn(x, r.a), device.ErrInjected)
	require.Equal(t, withoutCounters(before), withoutCounters(r.p.Stats()))
	checkStep(t, r.p, r.d)
	require.NoError(t, r.p.FreeOn(x, r.a), "the recorded stream is still recorded")
	require.Equal(t, int64(1), r.p.Stats().PendingBlocks)
	checkStep(t, r.p, r.d)
}
