package pool

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// Guard mode: the red zone is filled on the allocation's stream a, but a
// free on another stream b synchronizes b only. A block never used (or
// whose use on a is recorded with RecordStream) may be freed on any
// stream; the check then reads the red zone while its fill is still
// queued on a, and reports an overrun that never happened.
// In guard mode a free on another stream than the allocation's waits for
// the red zone's fill, queued on the allocation's stream, before reading
// the zone: it read the zone's old bytes as an overrun (ErrCorrupted)
// while that stream was busy.
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
