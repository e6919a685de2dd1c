package pool

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

// In guard mode a free on another stream than the allocation's waits for
// the red zone's fill, queued on the allocation's stream, before reading
// the zone. A block never used (or whose use there RecordStream recorded)
// may be freed on any stream; the free synchronized only its own, read
// the zone while the fill was still queued, and reported an overrun that
// never happened (ErrCorrupted).
func TestGuardFreeOnAnotherStreamWaitsForTheFill(t *testing.T) {
	for _, record := range []bool{false, true} {
		r := newStreamRig(t, BackendVMM, Options{Guard: 256})
		require.NoError(t, r.sd.HoldStream(r.a)) // a is busy
		x, err := r.p.AllocOn(4096, r.a)         // red zone fill queued on a
		require.NoError(t, err)
		if record {
			require.NoError(t, r.p.RecordStream(x, r.a))
		}
		err = r.p.FreeOn(x, r.b)
		require.NoError(t, err, "record=%v", record)
		require.Empty(t, r.sd.Violations())
	}
}

// In guard mode a block allocated on a stream that was then forgotten
// and destroyed frees, on another stream or the default one, with no
// driver call naming the destroyed stream (ForgetStream forgets it in the
// layer's records too: debugLayer.forgetStream).
func TestGuardFreeAfterForgetNamesNoDeadStream(t *testing.T) {
	for _, onDefault := range []bool{false, true} {
		sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
		spy := &deadStreamSpy{Device: sd, dead: map[device.Stream]bool{}}
		d := testDevice{Device: spy, sd: sd}
		a := newStreams(t, sd, 1)[0]
		p := openPool(t, d, Options{Guard: 256})
		side, err := sd.StreamCreate()
		require.NoError(t, err)
		x, err := p.AllocOn(streamBlock, side)
		require.NoError(t, err)
		require.NoError(t, p.ForgetStream(side))
		require.NoError(t, sd.StreamDestroy(side))
		spy.dead[side] = true
		if onDefault {
			require.NoError(t, p.Free(x))
		} else {
			require.NoError(t, p.FreeOn(x, a))
		}
		require.NoError(t, p.Check())
		require.Empty(t, spy.bad, "freed on the default stream: %v", onDefault)
	}
}
