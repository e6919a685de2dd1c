package pool

// Stream order on the simulated GPU: a block freed on a stream is reused
// at once on that stream and elsewhere only after the free's work is done;
// memory goes back to the driver only after the streams that used it are
// synchronized. Holding a stream (sim.Device.HoldStream) keeps its work queued,
// and Sim records any free, unmap or reuse that would race with it
// (Violations), which every check asserts empty.

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// streamRig is a pool on a Sim with two streams, a and b.
type streamRig struct {
	sd   *sim.Device
	d    testDevice
	p    *Pool
	a, b device.Stream
}

func newStreamRig(t *testing.T, be Backend, o Options) *streamRig {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	ss := newStreams(t, sd, 2) // before the pool: destroyed after Close
	o.Backend = be
	return &streamRig{sd: sd, d: d, p: openPool(t, d, o), a: ss[0], b: ss[1]}
}

// writeHeld queues a write of the n bytes at ptr on stream s, held.
func (r *streamRig) writeHeld(t *testing.T, ptr uintptr, n uint64, s device.Stream) {
	require.NoError(t, r.sd.HoldStream(s))
	require.NoError(t, r.sd.MemsetD32Async(ptr, 0x5eed, wordCount(n), s))
}

// streamBlock is 2 MiB: a granule, above the caches' sizes.
const streamBlock = 2 * miB

func TestStreamOrderedReuse(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String()+"/after the work on a is done, b gets the block without the out-of-memory path", func(t *testing.T) {
			r := newStreamRig(t, be, Options{MaxBytes: 2 * streamBlock})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			y, err := r.p.AllocOn(streamBlock, r.b)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a))
			checkStep(t, r.p, r.d)

			require.NoError(t, r.sd.ReleaseStream(r.a))
			before := r.p.Stats()
			z, err := r.p.AllocOn(streamBlock, r.b)
			require.NoError(t, err)
			require.Equal(t, x, z, "the only block under the cap, reclaimed once its event completed")
			require.Equal(t, before.Retries, r.p.Stats().Retries)
			require.Zero(t, r.p.Stats().Pending)
			checkStep(t, r.p, r.d)
			require.NoError(t, r.p.FreeOn(z, r.b))
			require.NoError(t, r.p.FreeOn(y, r.b))
			checkStep(t, r.p, r.d)
		})

		t.Run(be.String()+"/under a cap, b waits for the held work on a instead of failing", func(t *testing.T) {
			r := newStreamRig(t, be, Options{MaxBytes: 2 * streamBlock})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			y, err := r.p.AllocOn(streamBlock, r.b)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a))

			before := r.p.Stats()
			z, err := r.p.AllocOn(streamBlock, r.b)
			require.NoError(t, err)
			require.Equal(t, before.Retries+1, r.p.Stats().Retries, "the out-of-memory path waits for pending frees")
			require.Empty(t, r.sd.Violations())
			require.NoError(t, r.sd.MemsetD32Async(z, 0xb, wordCount(streamBlock), r.b))
			require.NoError(t, r.sd.StreamSynchronize(r.b))
			expectFilled(t, r.sd, z, streamBlock, 0xb)
			checkStep(t, r.p, r.d)
			require.NoError(t, r.p.FreeOn(z, r.b))
			require.NoError(t, r.p.FreeOn(y, r.b))
		})

		t.Run(be.String()+"/a pending block is reused on its stream only at its own size class", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			_, err := r.p.AllocOn(streamBlock, r.b) // both streams seen
			require.NoError(t, err)
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a))
			other, err := r.p.AllocOn(streamBlock/2, r.a)
			require.NoError(t, err)
			require.NotEqual(t, x, other)
			require.Equal(t, streamBlock, r.p.Stats().Pending)
			again, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			require.Equal(t, x, again)
			require.NoError(t, r.sd.ReleaseStream(r.a))
			checkStep(t, r.p, r.d)
		})
	}
}

func TestTheDefaultStreamRule(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String()+"/Free is a free on stream 0: held work there keeps the block from other streams", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			_, err := r.p.AllocOn(streamBlock, r.a) // a second stream: stream order is tracked
			require.NoError(t, err)
			x, err := r.p.Alloc(streamBlock)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, 0)
			require.NoError(t, r.p.Free(x))
			require.Equal(t, streamBlock, r.p.Stats().Pending)

			y, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			requireDisjoint(t, map[uintptr]uint64{x: streamBlock}, y, streamBlock)
			x2, err := r.p.AllocOn(streamBlock, 0)
			require.NoError(t, err)
			require.Equal(t, x, x2, "AllocOn(·, 0) is Alloc: it reuses what Free freed at once")
			require.NoError(t, r.p.Free(x2))
			checkStep(t, r.p, r.d)
			require.NoError(t, r.sd.ReleaseStream(0))
			checkStep(t, r.p, r.d)
		})

		t.Run(be.String()+"/memory last used on a stream is freed with FreeOn on it", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			_, err := r.p.AllocOn(streamBlock, r.b)
			require.NoError(t, err)
			x, err := r.p.Alloc(streamBlock)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a))
			y, err := r.p.Alloc(streamBlock)
			require.NoError(t, err)
			requireDisjoint(t, map[uintptr]uint64{x: streamBlock}, y, streamBlock)
			checkStep(t, r.p, r.d)
			require.NoError(t, r.sd.ReleaseStream(r.a))
		})

		for _, cacheOff := range []bool{false, true} {
			t.Run(configName(be, cacheOff)+"/small blocks freed on stream 0 keep their stream order", func(t *testing.T) {
				r := newStreamRig(t, be, Options{Cache: CacheOptions{Disable: cacheOff, Eager: !cacheOff}})
				_, err := r.p.AllocOn(4*kiB, r.a)
				require.NoError(t, err)
				var held []uintptr
				for range 64 {
					x, err := r.p.Alloc(4 * kiB)
					require.NoError(t, err)
					held = append(held, x)
				}
				require.NoError(t, r.sd.HoldStream(0))
				live := map[uintptr]uint64{}
				for _, x := range held {
					require.NoError(t, r.sd.MemsetD32Async(x, 0x5eed, wordCount(4*kiB), 0))
					require.NoError(t, r.p.Free(x))
					live[x] = 4 * kiB
				}
				for range 64 {
					y, err := r.p.AllocOn(4*kiB, r.a)
					require.NoError(t, err)
					requireDisjoint(t, live, y, 4*kiB)
				}
				checkStep(t, r.p, r.d)
				// Trim drains the caches and returns memory only after
				// stream 0's work is done.
				_, err = r.p.Trim()
				require.NoError(t, err)
				checkStep(t, r.p, r.d)
			})
		}

		t.Run(be.String()+"/with one stream, frees go to the index and Trim synchronizes before unmapping", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a))
			require.Zero(t, r.p.Stats().Pending, "one stream: no event needed")
			x2, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			require.Equal(t, x, x2)
			require.NoError(t, r.p.FreeOn(x2, r.a))
			n, err := r.p.Trim()
			require.NoError(t, err)
			require.Equal(t, streamBlock, n)
			checkStep(t, r.p, r.d)
		})

		t.Run(be.String()+"/with one stream, Close synchronizes before unmapping", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a))
			require.NoError(t, r.p.Close())
			require.Empty(t, r.sd.Violations())
			require.Zero(t, r.sd.Mapped())
		})

		t.Run(be.String()+"/a second stream's work is ordered after the first stream's earlier frees", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			x, err := r.p.AllocOn(streamBlock, r.a)
			require.NoError(t, err)
			r.writeHeld(t, x, streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(x, r.a)) // one stream: straight to the index
			// The pool meets b: b's work must now wait for a's.
			y, err := r.p.AllocOn(streamBlock, r.b)
			require.NoError(t, err)
			require.NoError(t, r.sd.MemsetD32Async(y, 0xb, wordCount(streamBlock), r.b))
			require.Empty(t, r.sd.Violations())
			require.NoError(t, r.sd.ReleaseStream(r.a))
			require.NoError(t, r.sd.StreamSynchronize(r.b))
			expectFilled(t, r.sd, y, streamBlock, 0xb)
			require.NoError(t, r.p.FreeOn(y, r.b))
			checkStep(t, r.p, r.d)
		})

		t.Run(be.String()+"/Trim and Close wait for pending frees on held streams", func(t *testing.T) {
			r := newStreamRig(t, be, Options{})
			var ptrs []uintptr
			for _, s := range []device.Stream{r.a, r.b, r.a, r.b, 0} {
				x, err := r.p.AllocOn(streamBlock, s)
				require.NoError(t, err)
				ptrs = append(ptrs, x)
			}
			r.writeHeld(t, ptrs[0], streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(ptrs[0], r.a))
			r.writeHeld(t, ptrs[1], streamBlock, r.b)
			require.NoError(t, r.p.FreeOn(ptrs[1], r.b))
			n, err := r.p.Trim()
			require.NoError(t, err)
			require.Equal(t, 2*streamBlock, n)
			require.Zero(t, r.p.Stats().Pending)
			checkStep(t, r.p, r.d)

			r.writeHeld(t, ptrs[2], streamBlock, r.a)
			require.NoError(t, r.p.FreeOn(ptrs[2], r.a))
			r.writeHeld(t, ptrs[3], streamBlock, r.b)
			require.NoError(t, r.p.FreeOn(ptrs[3], r.b))
			require.NoError(t, r.p.Close())
			require.Empty(t, r.sd.Violations())
			require.Zero(t, r.sd.Mapped())
		})
	}
}

func TestPassthroughFreeOnWaitsForTheStream(t *testing.T) {
	r := newStreamRig(t, BackendPassthrough, Options{})
	x, err := r.p.AllocOn(streamBlock, r.a)
	require.NoError(t, err)
	r.writeHeld(t, x, streamBlock, r.a)
	require.NoError(t, r.p.FreeOn(x, r.a))
	require.Empty(t, r.sd.Violations(), "cuMemFree while the stream's work still writes the block")
	checkStep(t, r.p, r.d)
}

// A program that creates and destroys streams (one per request, say) must
// be able to keep trimming. The pool keeps every stream it has seen and
// synchronizes those that freed memory before releasing it; once one is
// destroyed that fails for good, and the out-of-memory path with it.
func TestADestroyedStreamDoesNotWedgeTrim(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: be})
			s, err := sd.StreamCreate()
			require.NoError(t, err)
			x, err := p.AllocOn(streamBlock, s)
			require.NoError(t, err)
			require.NoError(t, p.FreeOn(x, s))
			require.NoError(t, p.ForgetStream(s))
			require.NoError(t, sd.StreamDestroy(s))
			_, err = p.Trim()
			require.NoError(t, err)
			checkStep(t, p, d)
		})
	}
}

// On the simulated device, a stream handle that was never created is
// taken for a destroyed stream, as "Destroyed streams" in streams.go
// documents: AllocOn, RecordStream and FreeOn with it succeed, and the
// pool stays consistent, in single- and multi-stream mode. Where the
// pool must order work on it first (a second stream joining after frees
// on the first), AllocOn fails and changes nothing.
func TestABogusStreamIsTakenForADestroyedOne(t *testing.T) {
	const bogus = device.Stream(0x999999)
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB})
			d := onSim(sd)
			p := openPool(t, d, Options{Backend: be})
			x, err := p.AllocOn(streamBlock, bogus) // single-stream: no driver call names it
			require.NoError(t, err)
			s, err := sd.StreamCreate()
			require.NoError(t, err)
			y, err := p.AllocOn(streamBlock, s) // the second stream: multi-stream mode
			require.NoError(t, err)
			require.NoError(t, p.RecordStream(y, bogus))
			require.NoError(t, p.FreeOn(x, bogus))
			require.NoError(t, p.FreeOn(y, s))
			checkStep(t, p, d)
			require.NoError(t, p.ForgetStream(s))
			require.NoError(t, sd.StreamDestroy(s))
			_, err = p.Trim()
			require.NoError(t, err)
			require.Zero(t, p.Stats().Allocated)
			checkStep(t, p, d)

			q := openPool(t, d, Options{Backend: be})
			z, err := q.Alloc(streamBlock)
			require.NoError(t, err)
			require.NoError(t, q.Free(z)) // the default stream is dirty
			before := q.Stats()
			_, err = q.AllocOn(streamBlock, bogus) // cuStreamWaitEvent on it fails
			require.ErrorIs(t, err, device.ErrInvalidValue)
			after := q.Stats()
			before.DeviceCalls, before.DeviceCallsByPath = after.DeviceCalls, after.DeviceCallsByPath
			require.Equal(t, before, after)
			checkStep(t, q, d)
		})
	}
}
