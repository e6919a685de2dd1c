package trace

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

func TestTraceCounters(t *testing.T) {
	tr := &Trace{Ops: []Op{
		{ID: 1, Size: 100},
		{ID: 2, Size: 50},
		{Free: true, ID: 1, Size: 100},
		{ID: 3, Size: 120}, // live 170: the peak
		{Free: true, ID: 3, Size: 120},
		{ID: 4, Size: 10},
	}}
	assert.NoError(t, tr.Check())
	assert.Equal(t, 4, tr.Allocs())
	assert.Equal(t, 2, tr.Frees())
	assert.Equal(t, uint64(170), tr.PeakLive())
	assert.Equal(t, []uint64{100, 50, 120, 10}, tr.Sizes())
	assert.Zero(t, (&Trace{}).PeakLive())
}

// PeakLive does not wrap around on a trace that fails Check.
func TestPeakLiveOfAnInvalidTraceDoesNotWrap(t *testing.T) {
	tr := &Trace{Ops: []Op{{Free: true, ID: 1, Size: 100}, {ID: 2, Size: 5}}}
	assert.ErrorIs(t, tr.Check(), ErrInvalid)
	assert.Equal(t, uint64(5), tr.PeakLive())
}

func TestCheck(t *testing.T) {
	for name, c := range map[string]struct {
		ops []Op
		msg string
	}{
		"zero size":           {[]Op{{ID: 1}}, "op 0: allocation of ID 1 has size 0"},
		"live ID reused":      {[]Op{{ID: 1, Size: 1}, {ID: 1, Size: 1}}, "op 1: allocation of ID 1, which is live"},
		"free of unknown ID":  {[]Op{{Free: true, ID: 9, Size: 1}}, "op 0: free of ID 9, which is not live"},
		"double free":         {[]Op{{ID: 1, Size: 1}, {Free: true, ID: 1, Size: 1}, {Free: true, ID: 1, Size: 1}}, "op 2: free of ID 1"},
		"free size differs":   {[]Op{{ID: 1, Size: 1}, {Free: true, ID: 1, Size: 2}}, "op 1: free of ID 1 says size 2 stream 0, allocation said 1 and 0"},
		"free stream differs": {[]Op{{ID: 1, Size: 1, Stream: 1}, {Free: true, ID: 1, Size: 1}}, "says size 1 stream 0, allocation said 1 and 1"},
	} {
		err := (&Trace{Ops: c.ops}).Check()
		assert.ErrorIs(t, err, ErrInvalid, name)
		assert.ErrorContains(t, err, c.msg, name)
	}
	// An ID may be reused once freed.
	assert.NoError(t, (&Trace{Ops: []Op{{ID: 1, Size: 1}, {Free: true, ID: 1, Size: 1}, {ID: 1, Size: 2}}}).Check())
}

func TestParseErrorText(t *testing.T) {
	assert.Equal(t, "trace: a.trace:3: bad", atLine("a.trace", 3, "bad").Error())
	assert.Equal(t, "trace: a.pickle: byte 0: bad", atByte("a.pickle", 0, "bad").Error())
	assert.Equal(t, "trace: a.pickle: device_traces[0]: bad", atPath("a.pickle", "device_traces[0]", "bad").Error())
	assert.ErrorIs(t, atLine("a", 1, "x"), ErrMalformed)
	assert.NotErrorIs(t, atLine("a", 1, "x"), ErrInvalid)
}

func TestFormatString(t *testing.T) {
	assert.Equal(t, "text", FormatText.String())
	assert.Equal(t, "pytorch-snapshot", FormatPyTorch.String())
	assert.Equal(t, "rmm-csv", FormatRMM.String())
	assert.Equal(t, "Format(0)", Format(0).String())
}
