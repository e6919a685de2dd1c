package sim

import (
	"encoding/binary"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

// simRef is a byte-per-byte reference for simShadow.
func simRef(size uint64) []byte {
	b := make([]byte, size)
	simPattern(b, 0, Uninitialized)
	return b
}

func TestSimPattern(t *testing.T) {
	b := make([]byte, 11)
	simPattern(b, 2, 0x44332211)
	assert.Equal(t, []byte{0x33, 0x44, 0x11, 0x22, 0x33, 0x44, 0x11, 0x22, 0x33, 0x44, 0x11}, b)
	var w [4]byte
	simPattern(w[:], 0, Uninitialized)
	assert.Equal(t, Uninitialized, binary.LittleEndian.Uint32(w[:]))
	simPattern(nil, 3, 1) // no panic
}

func TestSimShadowProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		size := 4 * rapid.Uint64Range(1, 64).Draw(t, "words")
		var m simShadow
		ref := simRef(size)
		t.Repeat(map[string]func(*rapid.T){
			"fill": func(t *rapid.T) {
				lo := 4 * rapid.Uint64Range(0, size/4-1).Draw(t, "lo")
				hi := 4 * rapid.Uint64Range(lo/4+1, size/4).Draw(t, "hi")
				v := rapid.SampledFrom([]uint32{1, 2, 0xdeadbeef, Uninitialized}).Draw(t, "v")
				m.fill(lo, hi, v)
				simPattern(ref[lo:hi], lo, v)
			},
			"read": func(t *rapid.T) {
				off := rapid.Uint64Range(0, size-1).Draw(t, "off")
				n := rapid.Uint64Range(0, size-off).Draw(t, "n")
				got := make([]byte, n)
				m.read(got, off)
				if string(got) != string(ref[off:off+n]) {
					t.Fatalf("read [%d, +%d) = %x, want %x (segs %v)", off, n, got, ref[off:off+n], m.segs)
				}
			},
			"": func(t *rapid.T) {
				if err := m.check(size); err != nil {
					t.Fatalf("%v (segs %v)", err, m.segs)
				}
			},
		})
	})
}

func TestSimShadowCompact(t *testing.T) {
	// A 4 GiB handle filled whole, then in the middle: a few segments.
	s := New(Config{Shadow: true})
	const size = 4 << 30
	va, err := s.AddressReserve(size, 0)
	require.NoError(t, err)
	h, err := s.MemCreate(size)
	require.NoError(t, err)
	require.NoError(t, s.MemMap(va, size, h))
	require.NoError(t, s.MemSetAccess(va, size))
	require.NoError(t, s.MemsetD32(va, 0x11111111, size/4))
	require.NoError(t, s.MemsetD32(va+size/2, 0x22222222, 1<<20))
	ph := s.handles[h]
	assert.Len(t, ph.mem.segs, 3)
	buf := make([]byte, 8)
	require.NoError(t, s.MemcpyDtoH(buf, va+size/2-4))
	assert.Equal(t, []byte{0x11, 0x11, 0x11, 0x11, 0x22, 0x22, 0x22, 0x22}, buf)
	require.NoError(t, s.MemsetD32(va, 0x11111111, size/4))
	assert.Len(t, ph.mem.segs, 1, "equal fills merge")
	simCheck(t, s)
}

func TestSimShadowFollowsPhysicalMemory(t *testing.T) {
	s, g := simVMMFixture(t)
	va, hs := simMapped(t, s, g, 1)
	require.NoError(t, s.MemsetD32(va, 0xaaaaaaaa, g/4))

	// Unmap and map another handle at the same address: the old contents
	// are gone, as on a GPU.
	require.NoError(t, s.MemUnmap(va, g))
	h2, err := s.MemCreate(g)
	require.NoError(t, err)
	require.NoError(t, s.MemMap(va, g, h2))
	require.NoError(t, s.MemSetAccess(va, g))
	buf := make([]byte, 4)
	require.NoError(t, s.MemcpyDtoH(buf, va+100))
	assert.Equal(t, Uninitialized, binary.LittleEndian.Uint32(buf))

	// The first handle, mapped elsewhere, kept its contents; and aliases
	// share them.
	other, err := s.AddressReserve(2*g, 0)
	require.NoError(t, err)
	require.NoError(t, s.MemMap(other, g, hs[0]))
	require.NoError(t, s.MemMap(other+uintptr(g), g, hs[0]))
	require.NoError(t, s.MemSetAccess(other, 2*g))
	require.NoError(t, s.MemcpyDtoH(buf, other+100))
	assert.Equal(t, uint32(0xaaaaaaaa), binary.LittleEndian.Uint32(buf))
	require.NoError(t, s.MemsetD32(other+uintptr(g)+100, 0xbbbbbbbb, 1))
	require.NoError(t, s.MemcpyDtoH(buf, other+100))
	assert.Equal(t, uint32(0xbbbbbbbb), binary.LittleEndian.Uint32(buf), "written through the alias")

	// A freed linear allocation's contents do not reappear in the next
	// one at the same address.
	p, err := s.MemAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, s.MemsetD32(p, 7, 1024))
	require.NoError(t, s.MemFree(p))
	q, err := s.MemAlloc(4096)
	require.NoError(t, err)
	require.Equal(t, p, q)
	require.NoError(t, s.MemcpyDtoH(buf, q))
	assert.Equal(t, Uninitialized, binary.LittleEndian.Uint32(buf))
	simCheck(t, s)
}

func TestSimShadowAcrossAllocations(t *testing.T) {
	// Adjacent linear allocations are contiguous memory: one access may
	// span them, as on a GPU, but not their rounding slack.
	s := New(Config{Capacity: 16 * simMiB, Shadow: true})
	a, err := s.MemAlloc(512)
	require.NoError(t, err)
	b, err := s.MemAlloc(512)
	require.NoError(t, err)
	require.Equal(t, a+512, b)
	require.NoError(t, s.MemsetD32(a+504, 0x01020304, 4))
	buf := make([]byte, 16)
	require.NoError(t, s.MemcpyDtoH(buf, a+504))
	assert.Equal(t, []byte{4, 3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1, 4, 3, 2, 1}, buf)

	c, err := s.MemAlloc(100) // 412 bytes of slack follow
	require.NoError(t, err)
	assert.ErrorIs(t, s.MemcpyDtoH(buf, c+96), device.ErrIllegalAddress)
	simCheck(t, s)
}

func TestSimWithoutShadow(t *testing.T) {
	s := New(Config{Capacity: 16 * simMiB})
	p, err := s.MemAlloc(4096)
	require.NoError(t, err)
	require.NoError(t, s.MemsetD32(p, 7, 1024))
	buf := make([]byte, 6)
	require.NoError(t, s.MemcpyDtoH(buf, p+1))
	want := make([]byte, 6)
	simPattern(want, 1, Uninitialized)
	assert.Equal(t, want, buf, "without Shadow every read is uninitialised")
	assert.ErrorIs(t, s.MemsetD32(p+4096, 7, 1), device.ErrIllegalAddress, "addresses are still checked")
	require.NoError(t, s.MemFree(p))
	assert.ErrorIs(t, s.MemcpyDtoH(buf, p), device.ErrIllegalAddress)
}
