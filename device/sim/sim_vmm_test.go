package sim

import (
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// simVMMFixture is a small VMM device: 64 KiB granularity, 16 MiB capacity,
// with contents kept.
func simVMMFixture(t *testing.T) (*Device, uint64) {
	t.Helper()
	s := New(Config{Capacity: 16 * simMiB, Granularity: 64 << 10, Shadow: true})
	g, err := s.AllocationGranularity()
	require.NoError(t, err)
	return s, g
}

// simMapped reserves n granules, creates one handle per granule, maps them
// in order and grants access.
func simMapped(t *testing.T, s *Device, g uint64, n int) (uintptr, []device.MemHandle) {
	t.Helper()
	va, err := s.AddressReserve(uint64(n)*g, 0)
	require.NoError(t, err)
	hs := make([]device.MemHandle, n)
	for i := range hs {
		hs[i], err = s.MemCreate(g)
		require.NoError(t, err)
		require.NoError(t, s.MemMap(va+uintptr(uint64(i)*g), g, hs[i]))
	}
	require.NoError(t, s.MemSetAccess(va, uint64(n)*g))
	return va, hs
}

func TestSimVMMMisuse(t *testing.T) {
	s, g := simVMMFixture(t)
	va, hs := simMapped(t, s, g, 2) // [va, va+2g) mapped with access
	spare, err := s.MemCreate(g)
	require.NoError(t, err)
	big, err := s.MemCreate(2 * g)
	require.NoError(t, err)
	empty, err := s.AddressReserve(4*g, 0)
	require.NoError(t, err)
	lin, err := s.MemAlloc(4096)
	require.NoError(t, err)
	released, err := s.MemCreate(g)
	require.NoError(t, err)
	require.NoError(t, s.MemRelease(released))
	at := func(k uint64) uintptr { return empty + uintptr(k*g) }

	cases := []struct {
		name string
		call func() error
		want error
	}{
		{"reserve size 0", func() error { _, err := s.AddressReserve(0, 0); return err }, device.ErrInvalidValue},
		{"reserve unaligned size", func() error { _, err := s.AddressReserve(g+4096, 0); return err }, device.ErrInvalidValue},
		{"reserve alignment not a power of two", func() error { _, err := s.AddressReserve(g, 3*g); return err }, device.ErrInvalidValue},
		{"reserve beyond the address window", func() error { _, err := s.AddressReserve(1<<43, 0); return err }, device.ErrOutOfMemory},
		{"create size 0", func() error { _, err := s.MemCreate(0); return err }, device.ErrInvalidValue},
		{"create unaligned size", func() error { _, err := s.MemCreate(g / 2); return err }, device.ErrInvalidValue},
		{"create beyond capacity", func() error { _, err := s.MemCreate(16 * simMiB); return err }, device.ErrOutOfMemory},
		{"map unknown handle", func() error { return s.MemMap(at(0), g, 0xdead) }, device.ErrInvalidValue},
		{"map released handle", func() error { return s.MemMap(at(0), g, released) }, device.ErrInvalidValue},
		{"map part of a handle", func() error { return s.MemMap(at(0), g, big) }, device.ErrNotSupported}, // as the H200 answers it
		{"map more than a handle", func() error { return s.MemMap(at(0), 2*g, spare) }, device.ErrInvalidValue},
		{"map unaligned", func() error { return s.MemMap(at(0)+4096, g, spare) }, device.ErrInvalidValue},
		{"map outside a reservation", func() error { return s.MemMap(lin, g, spare) }, device.ErrInvalidValue},
		{"map at unreserved address", func() error { return s.MemMap(0x1000_0000, g, spare) }, device.ErrInvalidValue},
		{"map past the reservation end", func() error { return s.MemMap(at(3), 2*g, big) }, device.ErrInvalidValue},
		{"map over a mapping", func() error { return s.MemMap(va+uintptr(g), g, spare) }, device.ErrInvalidValue},
		{"map overlapping a mapping's start", func() error { return s.MemMap(va, 2*g, big) }, device.ErrInvalidValue},
		{"unmap unmapped", func() error { return s.MemUnmap(at(0), g) }, device.ErrInvalidValue},
		{"unmap half a mapping", func() error { return s.MemUnmap(va, g/2) }, device.ErrInvalidValue},
		{"unmap from a mapping's middle", func() error { return s.MemUnmap(va+uintptr(g/2), g) }, device.ErrInvalidValue},
		{"unmap past the mappings", func() error { return s.MemUnmap(va, 3*g) }, device.ErrInvalidValue},
		{"unmap size 0", func() error { return s.MemUnmap(va, 0) }, device.ErrInvalidValue},
		{"unmap linear memory", func() error { return s.MemUnmap(lin, 4096) }, device.ErrInvalidValue},
		{"set access on unmapped", func() error { return s.MemSetAccess(at(0), g) }, device.ErrInvalidValue},
		{"set access on part of a mapping", func() error { return s.MemSetAccess(va, g/2) }, device.ErrInvalidValue},
		{"release unknown", func() error { return s.MemRelease(0xdead) }, device.ErrInvalidValue},
		{"release twice", func() error { return s.MemRelease(released) }, device.ErrInvalidValue},
		{"address free with mappings", func() error { return s.AddressFree(va, 2*g) }, device.ErrInvalidValue},
		{"address free wrong size", func() error { return s.AddressFree(empty, 2*g) }, device.ErrInvalidValue},
		{"address free interior", func() error { return s.AddressFree(at(1), 3*g) }, device.ErrInvalidValue},
		{"address free linear", func() error { return s.AddressFree(lin, 4096) }, device.ErrInvalidValue},
		{"free a reservation with MemFree", func() error { return s.MemFree(empty) }, device.ErrInvalidValue},
		{"free a mapping with MemFree", func() error { return s.MemFree(va) }, device.ErrInvalidValue},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			before, used := s.Stats(), s.Used()
			assert.ErrorIs(t, c.call(), c.want)
			assert.Equal(t, before, s.Stats(), "a failed call changes nothing")
			assert.Equal(t, used, s.Used())
			simCheck(t, s)
		})
	}
	_ = hs
}

func TestSimVMMRefcount(t *testing.T) {
	s, g := simVMMFixture(t)
	va, err := s.AddressReserve(2*g, 0)
	require.NoError(t, err)
	h, err := s.MemCreate(g)
	require.NoError(t, err)
	assert.Equal(t, g, s.Used(), "MemCreate consumes capacity")
	assert.Equal(t, g, s.Mapped())

	// Map twice (aliases), release, unmap one by one: freed at the last.
	require.NoError(t, s.MemMap(va, g, h))
	require.NoError(t, s.MemMap(va+uintptr(g), g, h))
	require.NoError(t, s.MemRelease(h))
	assert.Equal(t, g, s.Used(), "released but mapped: still there")
	assert.Zero(t, s.Mapped(), "Mapped leaves out released handles")
	assert.Equal(t, 1, s.Stats().ReleasedMapped)
	assert.ErrorIs(t, s.MemMap(va, g, h), device.ErrInvalidValue, "a released handle cannot be mapped again")
	require.NoError(t, s.MemUnmap(va, g))
	assert.Equal(t, g, s.Used())
	assert.Equal(t, 1, s.LiveAllocations())
	require.NoError(t, s.MemUnmap(va+uintptr(g), g))
	assert.Zero(t, s.Used(), "freed at the last unmap")
	assert.Zero(t, s.LiveAllocations())
	simCheck(t, s)

	// Unmap first, then release: freed at the release.
	h, err = s.MemCreate(g)
	require.NoError(t, err)
	require.NoError(t, s.MemMap(va, g, h))
	require.NoError(t, s.MemUnmap(va, g))
	assert.Equal(t, g, s.Used(), "unmapped but not released: still there")
	require.NoError(t, s.MemRelease(h))
	assert.Zero(t, s.Used())
	require.NoError(t, s.AddressFree(va, 2*g))
	simCheck(t, s)
	free, total, err := s.MemGetInfo()
	require.NoError(t, err)
	assert.Equal(t, total, free)
}

func TestSimVMMAccess(t *testing.T) {
	s, g := simVMMFixture(t)
	va, err := s.AddressReserve(3*g, 0)
	require.NoError(t, err)
	h1, err := s.MemCreate(g)
	require.NoError(t, err)
	h2, err := s.MemCreate(g)
	require.NoError(t, err)
	buf := make([]byte, 8)

	assert.ErrorIs(t, s.MemsetD32(va, 1, 1), device.ErrIllegalAddress, "reserved, not mapped")
	require.NoError(t, s.MemMap(va, g, h1))
	assert.ErrorIs(t, s.MemsetD32(va, 1, 1), device.ErrIllegalAddress, "mapped without access")
	assert.ErrorIs(t, s.MemcpyDtoH(buf, va), device.ErrIllegalAddress, "mapped without access")
	require.NoError(t, s.MemSetAccess(va, g))
	require.NoError(t, s.MemsetD32(va, 1, 1))
	require.NoError(t, s.MemSetAccess(va, g), "granting again is harmless")

	// A range running into an unmapped granule fails whole, writing nothing.
	require.NoError(t, s.MemsetD32(va, 7, g/4))
	assert.ErrorIs(t, s.MemsetD32(va+uintptr(g)-4, 9, 2), device.ErrIllegalAddress)
	require.NoError(t, s.MemcpyDtoH(buf[:4], va+uintptr(g)-4))
	assert.Equal(t, []byte{7, 0, 0, 0}, buf[:4])

	// A second mapping after the first: one access grant covers both.
	require.NoError(t, s.MemMap(va+uintptr(g), g, h2))
	require.NoError(t, s.MemSetAccess(va, 2*g))
	require.NoError(t, s.MemsetD32(va+uintptr(g)-4, 9, 2))

	// Owner and Reservation.
	start, size, ok := s.Owner(va + uintptr(g) + 5)
	assert.True(t, ok)
	assert.Equal(t, va+uintptr(g), start)
	assert.Equal(t, g, size)
	_, _, ok = s.Owner(va + uintptr(2*g))
	assert.False(t, ok, "reserved but unmapped")
	start, size, ok = s.Reservation(va + uintptr(2*g))
	assert.True(t, ok)
	assert.Equal(t, va, start)
	assert.Equal(t, 3*g, size)

	// After unmap: use after free is ErrIllegalAddress.
	require.NoError(t, s.MemUnmap(va, 2*g))
	assert.ErrorIs(t, s.MemsetD32(va, 1, 1), device.ErrIllegalAddress)
	assert.ErrorIs(t, s.MemcpyDtoH(buf, va+uintptr(g)), device.ErrIllegalAddress)

	// Remapped, access must be granted again.
	require.NoError(t, s.MemMap(va, g, h1))
	assert.ErrorIs(t, s.MemcpyDtoH(buf, va), device.ErrIllegalAddress)
	require.NoError(t, s.MemUnmap(va, g))
	require.NoError(t, s.MemRelease(h1))
	require.NoError(t, s.MemRelease(h2))
	require.NoError(t, s.AddressFree(va, 3*g))
	_, ok = func() (uint64, bool) { _, n, ok := s.Reservation(va); return n, ok }()
	assert.False(t, ok)
	simCheck(t, s)
}

func TestSimVMMAlignment(t *testing.T) {
	s, g := simVMMFixture(t)
	a, err := s.AddressReserve(g, 0)
	require.NoError(t, err)
	b, err := s.AddressReserve(g, 16*g)
	require.NoError(t, err)
	assert.Zero(t, uint64(b)%(16*g))
	c, err := s.AddressReserve(g, 4096) // below the granularity: the granularity
	require.NoError(t, err)
	assert.Zero(t, uint64(c)%g)
	assert.Equal(t, a+uintptr(g), c, "the gap before the aligned one is used first")
	for _, p := range []uintptr{a, b, c} {
		require.NoError(t, s.AddressFree(p, g))
	}
	simCheck(t, s)
}

func TestSimVMMAndLinearShareTheAddressSpace(t *testing.T) {
	s, g := simVMMFixture(t)
	l1, err := s.MemAlloc(1000)
	require.NoError(t, err)
	va, err := s.AddressReserve(g, 0)
	require.NoError(t, err)
	assert.GreaterOrEqual(t, uint64(va), uint64(l1)+1024, "no overlap")
	assert.Zero(t, uint64(va)%g)
	l2, err := s.MemAlloc(1000)
	require.NoError(t, err)
	assert.Equal(t, l1+1024, l2, "linear memory fills the gap below the reservation")
	require.NoError(t, s.MemFree(l1))
	require.NoError(t, s.MemFree(l2))
	require.NoError(t, s.AddressFree(va, g))
	l3, err := s.MemAlloc(4 * g)
	require.NoError(t, err)
	assert.Equal(t, l1, l3, "freed ranges merge and are reused lowest first")
	require.NoError(t, s.MemFree(l3))
	simCheck(t, s)
}
