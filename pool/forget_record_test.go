package pool

import (
	"fmt"
	"sync"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// deadStreamSpy reports every driver call that names a stream the test
// destroyed: undefined behaviour to the CUDA driver (a crash on the H200
// with driver 580, streams.go), an ErrInvalidValue on the Sim.
type deadStreamSpy struct {
	*sim.Device
	mu   sync.Mutex
	dead map[device.Stream]bool
	bad  []string
}

func (w *deadStreamSpy) note(call string, s device.Stream) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.dead[s] {
		w.bad = append(w.bad, fmt.Sprintf("%s on destroyed stream %#x", call, uintptr(s)))
	}
}

func (w *deadStreamSpy) EventRecord(e device.Event, s device.Stream) error {
	w.note("cuEventRecord", s)
	return w.Device.EventRecord(e, s)
}

func (w *deadStreamSpy) StreamSynchronize(s device.Stream) error {
	w.note("cuStreamSynchronize", s)
	return w.Device.StreamSynchronize(s)
}

func (w *deadStreamSpy) StreamWaitEvent(s device.Stream, e device.Event) error {
	w.note("cuStreamWaitEvent", s)
	return w.Device.StreamWaitEvent(s, e)
}

// ForgetStream takes a stream off the uses RecordStream recorded: the
// free of such a block after the stream was forgotten and destroyed names
// it in no driver call (on the H200 a call on a destroyed stream crashed
// the process), whether the pool knew the stream from AllocOn too or only
// from RecordStream. (Before, the stream stayed in the block's uses, and
// the block's free recorded an event on the destroyed stream.)
func TestForgetStreamTakesARecordedStreamOffItsUses(t *testing.T) {
	for _, be := range pooledBackends {
		for _, known := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/known=%v", be, known), func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
				spy := &deadStreamSpy{Device: sd, dead: map[device.Stream]bool{}}
				d := testDevice{Device: spy, sd: sd}
				a := newStreams(t, sd, 1)[0]
				p := openPool(t, d, Options{Backend: be})
				side, err := sd.StreamCreate()
				require.NoError(t, err)

				x, err := p.AllocOn(streamBlock, a)
				require.NoError(t, err)
				if known { // the pool has seen side through AllocOn/FreeOn too
					y, err := p.AllocOn(streamBlock, side)
					require.NoError(t, err)
					require.NoError(t, p.FreeOn(y, side))
				}
				require.NoError(t, p.RecordStream(x, side)) // x is used on side
				require.NoError(t, sd.MemsetD32Async(x, 1, wordCount(streamBlock), side))

				require.NoError(t, p.ForgetStream(side)) // as documented, before destroying it
				require.NoError(t, sd.StreamDestroy(side))
				spy.dead[side] = true

				require.NoError(t, p.FreeOn(x, a))
				checkStep(t, p, d)
				require.Empty(t, spy.bad, "the pool named a stream after ForgetStream")
			})
		}
	}
}

// The same with side's work still queued: ForgetStream waits for a
// stream the pool knows only from RecordStream, so that the block freed
// after it is not handed out under side's queued write (before, the free
// skipped the destroyed stream, and the next request got the block while
// side still wrote it).
func TestForgetStreamWaitsForAStreamOnlyRecorded(t *testing.T) {
	for _, be := range pooledBackends {
		t.Run(be.String(), func(t *testing.T) {
			sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
			d := onSim(sd)
			a := newStreams(t, sd, 1)[0]
			p := openPool(t, d, Options{Backend: be, MaxBytes: streamBlock})
			side, err := sd.StreamCreate()
			require.NoError(t, err)

			x, err := p.AllocOn(streamBlock, a)
			require.NoError(t, err)
			require.NoError(t, p.RecordStream(x, side))
			require.NoError(t, sd.HoldStream(side)) // side is busy
			require.NoError(t, sd.MemsetD32Async(x, 1, wordCount(streamBlock), side))

			require.NoError(t, p.ForgetStream(side)) // documented: waits for side's work
			require.NoError(t, sd.StreamDestroy(side))
			require.NoError(t, p.FreeOn(x, a))
			y, err := p.AllocOn(streamBlock, a)
			require.NoError(t, err)
			require.NoError(t, sd.MemsetD32Async(y, 2, wordCount(streamBlock), a))
			require.Empty(t, sd.Violations())
			require.NoError(t, sd.ReleaseStream(side))
		})
	}
}
