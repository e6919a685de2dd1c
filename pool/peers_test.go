package pool_test

import (
	"encoding/binary"
	"fmt"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// twoGPUs is a simulated host of two small GPUs with contents kept.
func twoGPUs() *sim.Host {
	return sim.NewHost(2, sim.Config{Capacity: 256 << 20, Shadow: true})
}

func peerSet(t *testing.T, k ...int) pool.DeviceSet {
	t.Helper()
	s, err := pool.DeviceSetOf(k...)
	require.NoError(t, err)
	return s
}

// copyAcross fills n bytes at src (on GPU 0's pool) with v, copies them
// with a cuMemcpyDtoDAsync issued on GPU 1 to dst, and returns the copy's
// error and, on success, the first and last words read back on GPU 1.
func copyAcross(t *testing.T, h *sim.Host, dst, src uintptr, n uint64, v uint32) error {
	t.Helper()
	require.NoError(t, h.Device(0).MemsetD32(src, v, n/4))
	if err := h.Device(1).MemcpyDtoDAsync(dst, src, n, 0); err != nil {
		return err
	}
	var b [4]byte
	for _, at := range []uintptr{dst, dst + uintptr(n) - 4} {
		require.NoError(t, h.Device(1).MemcpyDtoH(b[:], at))
		require.Equal(t, v, binary.LittleEndian.Uint32(b[:]), "word at %#x", at)
	}
	return nil
}

func TestPeerAccessLetsAnotherGPUCopy(t *testing.T) {
	for _, backend := range []pool.Backend{pool.BackendVMM, pool.BackendChunks, pool.BackendPassthrough} {
		for _, grant := range []bool{false, true} {
			t.Run(fmt.Sprintf("%v/peer=%v", backend, grant), func(t *testing.T) {
				h := twoGPUs()
				o := pool.Options{Backend: backend}
				if grant {
					o.PeerAccess = peerSet(t, 1)
				}
				p0, err := pool.New(h.Device(0), o)
				require.NoError(t, err)
				defer p0.Close()
				p1, err := pool.New(h.Device(1), pool.Options{Backend: backend})
				require.NoError(t, err)
				defer p1.Close()
				const n = 3 << 20 // spans pages: the copy crosses mappings
				src, err := p0.Alloc(n)
				require.NoError(t, err)
				dst, err := p1.Alloc(n)
				require.NoError(t, err)
				err = copyAcross(t, h, dst, src, n, 0xfeed0001)
				if !grant {
					require.ErrorIs(t, err, device.ErrInvalidValue, "GPU 1 may not read GPU 0's pool")
					return
				}
				require.NoError(t, err)
				// Memory mapped later gets access too.
				big, err := p0.Alloc(64 << 20)
				require.NoError(t, err)
				dst2, err := p1.Alloc(64 << 20)
				require.NoError(t, err)
				require.NoError(t, copyAcross(t, h, dst2, big, 64<<20, 0xfeed0002))
				assert.Equal(t, []int{1}, p0.PeerAccess())
				require.NoError(t, p0.Check())
			})
		}
	}
}

func TestGrantPeerAccessCoversPresentMemory(t *testing.T) {
	for _, backend := range []pool.Backend{pool.BackendVMM, pool.BackendChunks} {
		t.Run(backend.String(), func(t *testing.T) {
			h := twoGPUs()
			p0, err := pool.New(h.Device(0), pool.Options{Backend: backend})
			require.NoError(t, err)
			defer p0.Close()
			p1, err := pool.New(h.Device(1), pool.Options{Backend: backend})
			require.NoError(t, err)
			defer p1.Close()
			src, err := p0.Alloc(5 << 20)
			require.NoError(t, err)
			dst, err := p1.Alloc(5 << 20)
			require.NoError(t, err)
			require.ErrorIs(t, copyAcross(t, h, dst, src, 5<<20, 1), device.ErrInvalidValue)
			require.NoError(t, p0.GrantPeerAccess(1))
			require.NoError(t, p0.GrantPeerAccess(1), "granted already: nothing to do")
			require.NoError(t, copyAcross(t, h, dst, src, 5<<20, 2))
			require.NoError(t, p0.Check())
		})
	}
}

func TestPeerAccessToOwnDeviceIsANoOp(t *testing.T) {
	dev := sim.New(sim.Config{Capacity: 256 << 20})
	p, err := pool.New(dev, pool.Options{PeerAccess: peerSet(t, 0)})
	require.NoError(t, err)
	defer p.Close()
	before := p.Stats()
	require.NoError(t, p.GrantPeerAccess(0))
	assert.Equal(t, before, p.Stats(), "no driver call, nothing changed")
	assert.Empty(t, p.PeerAccess())
	_, err = p.Alloc(1 << 20)
	require.NoError(t, err)
	require.NoError(t, p.Check())
}

func TestPeerAccessRefusedNamesThePair(t *testing.T) {
	h := twoGPUs()
	h.SetCanAccessPeer(0, 1, false)
	_, err := pool.New(h.Device(0), pool.Options{PeerAccess: peerSet(t, 1)})
	require.ErrorIs(t, err, pool.ErrNoPeerAccess)
	assert.Contains(t, err.Error(), "device 1 cannot access device 0")
	assert.Zero(t, h.Device(0).Used(), "a failed New leaves nothing on the device")

	p, err := pool.New(h.Device(0), pool.Options{})
	require.NoError(t, err)
	defer p.Close()
	_, err = p.Alloc(4 << 20)
	require.NoError(t, err)
	before := p.Stats()
	err = p.GrantPeerAccess(1)
	require.ErrorIs(t, err, pool.ErrNoPeerAccess)
	err = p.GrantPeerAccess(7)
	require.ErrorIs(t, err, device.ErrNoDevice)
	assert.Contains(t, err.Error(), "device 7")
	assert.Equal(t, before, p.Stats(), "a refused grant changes nothing")
	require.NoError(t, p.Check())

	// A device that knows nothing of peers.
	_, err = pool.New(plainDevice{h.Device(1)}, pool.Options{PeerAccess: peerSet(t, 0)})
	require.ErrorIs(t, err, pool.ErrNoPeerAccess)

	_, err = pool.DeviceSetOf(64)
	require.ErrorIs(t, err, pool.ErrBadOptions)
}

// plainDevice hides every optional interface of its Device.
type plainDevice struct{ device.Device }

// A sim.Host's Open, the opener NewDevicesOn's doc shows, gives Get an
// ErrNoDevice error for an ordinal no GPU of the host has, rather than a
// panic, and makes nothing.
func TestDevicesOnAHostsOpenRefusesAnOrdinalNoDeviceHas(t *testing.T) {
	h := twoGPUs()
	ds, err := pool.NewDevicesOn(h.Open, pool.Options{})
	require.NoError(t, err)
	for _, k := range []int{2, 63, 64, 1 << 20, -1} {
		_, err := ds.Get(k)
		require.ErrorIs(t, err, device.ErrNoDevice, "ordinal %d", k)
	}
	require.Empty(t, ds.Ordinals(), "a failed Get makes nothing")
	p, err := ds.Get(1)
	require.NoError(t, err)
	require.Equal(t, 1, p.Device().Ordinal())
	require.NoError(t, ds.Close())
	require.Zero(t, h.Device(0).Used()+h.Device(1).Used())
}

func TestDevicesOnePoolPerOrdinal(t *testing.T) {
	h := twoGPUs()
	opened := map[int]int{}
	ds, err := pool.NewDevicesOn(func(k int) (device.Device, error) {
		opened[k]++
		if k >= h.Len() {
			return nil, fmt.Errorf("sim: ordinal %d: %w", k, device.ErrNoDevice)
		}
		return h.Device(k), nil
	}, pool.Options{PeerAccess: peerSet(t, 0, 1)})
	require.NoError(t, err)
	p0, err := ds.Get(0)
	require.NoError(t, err)
	p1, err := ds.Get(1)
	require.NoError(t, err)
	again, err := ds.Get(0)
	require.NoError(t, err)
	assert.Same(t, p0, again)
	assert.Equal(t, 1, opened[0])
	assert.Equal(t, []int{1}, p0.PeerAccess(), "each pool skips its own ordinal")
	assert.Equal(t, []int{0}, p1.PeerAccess())
	_, err = ds.Get(2)
	require.ErrorIs(t, err, device.ErrNoDevice)
	_, err = ds.Get(-1)
	require.ErrorIs(t, err, device.ErrNoDevice)
	assert.Equal(t, []int{0, 1}, ds.Ordinals())

	// Both directions work.
	a, err := p0.Alloc(1 << 20)
	require.NoError(t, err)
	b, err := p1.Alloc(1 << 20)
	require.NoError(t, err)
	require.NoError(t, copyAcross(t, h, b, a, 1<<20, 9))
	require.NoError(t, h.Device(0).MemcpyDtoDAsync(a, b, 1<<20, 0))

	require.NoError(t, ds.Close())
	assert.Zero(t, h.Device(0).Used()+h.Device(1).Used(), "Close returns every pool's memory")
	_, err = ds.Get(0)
	require.ErrorIs(t, err, pool.ErrClosed)
	require.ErrorIs(t, ds.Close(), pool.ErrClosed)

	_, err = pool.NewDevicesOn(nil, pool.Options{})
	require.ErrorIs(t, err, pool.ErrBadOptions)
	_, err = pool.NewDevicesOn(func(int) (device.Device, error) { return h.Device(0), nil }, pool.Options{MaxFraction: 2})
	require.ErrorIs(t, err, pool.ErrBadOptions)
	// A pool its user closed is made anew by the next Get, and Close
	// does not report it.
	ds2, err := pool.NewDevicesOn(func(k int) (device.Device, error) { return h.Device(k), nil }, pool.Options{})
	require.NoError(t, err)
	first, err := ds2.Get(0)
	require.NoError(t, err)
	require.NoError(t, first.Close())
	require.Empty(t, ds2.Ordinals(), "a closed pool is not listed")
	second, err := ds2.Get(0)
	require.NoError(t, err)
	require.NotSame(t, first, second)
	_, err = second.Alloc(1 << 20)
	require.NoError(t, err)
	third, err := ds2.Get(1)
	require.NoError(t, err)
	require.NoError(t, third.Close())
	require.NoError(t, ds2.Close())
	require.Zero(t, h.Device(0).Used()+h.Device(1).Used())

	nilOpen, err := pool.NewDevicesOn(func(int) (device.Device, error) { return (*sim.Device)(nil), nil }, pool.Options{})
	require.NoError(t, err)
	_, err = nilOpen.Get(0)
	require.ErrorIs(t, err, pool.ErrBadOptions, "an open that gives a nil *sim.Device")
	require.NoError(t, nilOpen.Close())
}
