package sim

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// Byte fills and word fills in any order read back as the byte-per-byte
// reference says, and the shadow's invariants hold, for allocation sizes
// that are not multiples of 4 too.
func TestSimShadowFillBytesProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		size := rapid.Uint64Range(1, 64).Draw(t, "size")
		var m simShadow
		ref := simRef(size)
		t.Repeat(map[string]func(*rapid.T){
			"fillBytes": func(t *rapid.T) {
				lo := rapid.Uint64Range(0, size-1).Draw(t, "lo")
				hi := rapid.Uint64Range(lo+1, size).Draw(t, "hi")
				b := rapid.SampledFrom([]byte{0, 0xA5, 0xFF}).Draw(t, "b")
				m.fillBytes(lo, hi, b, size)
				for i := lo; i < hi; i++ {
					ref[i] = b
				}
			},
			"fill": func(t *rapid.T) {
				if size < 4 {
					t.Skip("no whole word")
				}
				lo := 4 * rapid.Uint64Range(0, size/4-1).Draw(t, "lo")
				hi := 4 * rapid.Uint64Range(lo/4+1, size/4).Draw(t, "hi")
				m.fill(lo, hi, 0x11223344)
				simPattern(ref[lo:hi], lo, 0x11223344)
			},
			"": func(t *rapid.T) {
				require.NoError(t, m.check(size))
				got := make([]byte, size)
				m.read(got, 0)
				require.Equal(t, ref, got)
			},
		})
	})
}

func TestSimMemsetD8Async(t *testing.T) {
	s := New(Config{Shadow: true})
	ptr, err := s.MemAlloc(1024)
	require.NoError(t, err)
	require.NoError(t, s.MemsetD32(ptr, 0, 256))
	require.NoError(t, s.MemsetD8Async(ptr+5, 0xA5, 7, 0))
	got := make([]byte, 16)
	require.NoError(t, s.MemcpyDtoH(got, ptr))
	require.Equal(t, []byte{0, 0, 0, 0, 0, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0xA5, 0, 0, 0, 0}, got)
	require.NoError(t, s.MemsetD8Async(ptr, 1, 0, 0), "n = 0 does nothing")
	require.ErrorIs(t, s.MemsetD8Async(ptr+1020, 1, 8, 0), device.ErrIllegalAddress)
	require.ErrorIs(t, s.MemsetD8Async(ptr, 1, 1, device.Stream(12345)), device.ErrInvalidValue)
	require.Equal(t, uint64(4), s.Counts()[device.CallMemsetD8Async])
}
