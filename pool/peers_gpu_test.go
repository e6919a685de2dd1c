package pool

// Peer access on real GPUs. TestGPUPeerAccessOwnDevice needs one GPU;
// TestGPUTwoDevicesPeerCopy needs two (it skips with one, even with
// TLSF_REQUIRE_GPU=1, since the one-GPU machine must pass). On the GPU
// machine: TLSF_REQUIRE_GPU=1 ./pool.test -test.run 'GPUPeer|GPUTwo' -test.v.

import (
	"encoding/binary"
	"errors"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/cuda"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestGPUPeerAccessOwnDevice(t *testing.T) {
	dev := openGPU(t)
	ok, err := dev.CanAccessPeer(dev.Ordinal())
	require.NoError(t, err)
	assert.True(t, ok)
	for _, be := range []Backend{BackendVMM, BackendChunks} {
		if be == BackendVMM && !dev.VMMSupported() {
			continue
		}
		t.Run(be.String(), func(t *testing.T) {
			own, err := DeviceSetOf(dev.Ordinal())
			require.NoError(t, err)
			p, err := New(dev, Options{Backend: be, PeerAccess: own})
			require.NoError(t, err)
			defer p.Close()
			before := p.Stats().DeviceCalls
			require.NoError(t, p.GrantPeerAccess(dev.Ordinal()))
			assert.Equal(t, before, p.Stats().DeviceCalls, "own device: no driver call")
			assert.Empty(t, p.PeerAccess())
			a, err := p.Alloc(5 * miB)
			require.NoError(t, err)
			b, err := p.Alloc(5 * miB)
			require.NoError(t, err)
			fillBlock(t, dev, a, 5*miB, 0x0bee)
			require.NoError(t, dev.MemcpyDtoDAsync(b, a, 5*miB, 0))
			expectFilled(t, dev, b, 5*miB, 0x0bee)
			require.NoError(t, p.Free(a))
			require.NoError(t, p.Free(b))
			require.NoError(t, p.Check())
		})
	}
}

func TestGPUTwoDevicesPeerCopy(t *testing.T) {
	d0 := openGPU(t)
	d1, err := cuda.Open(1)
	if errors.Is(err, device.ErrNoDevice) {
		t.Skip("one GPU: the two-GPU test needs two")
	}
	require.NoError(t, err)
	defer d1.Close()
	if ok, err := d0.CanAccessPeer(1); err != nil || !ok {
		t.Skipf("device 1 cannot access device 0 (%v)", err)
	}
	for _, be := range []Backend{BackendVMM, BackendChunks} {
		t.Run(be.String(), func(t *testing.T) {
			peers, _ := DeviceSetOf(0, 1)
			ds, err := NewDevicesOn(func(k int) (device.Device, error) {
				return []device.Device{d0, d1}[k], nil
			}, Options{Backend: be, PeerAccess: peers})
			require.NoError(t, err)
			defer ds.Close()
			p0, err := ds.Get(0)
			require.NoError(t, err)
			p1, err := ds.Get(1)
			require.NoError(t, err)
			a, err := p0.Alloc(9 * miB)
			require.NoError(t, err)
			b, err := p1.Alloc(9 * miB)
			require.NoError(t, err)
			fillBlock(t, d0, a, 9*miB, 0x5eed)
			require.NoError(t, d1.MemcpyDtoDAsync(b, a, 9*miB, 0), "device 1 reads device 0's pool")
			require.NoError(t, d1.StreamSynchronize(0))
			buf := make([]byte, 4)
			require.NoError(t, d1.MemcpyDtoH(buf, b+uintptr(9*miB-4)))
			assert.Equal(t, uint32(0x5eed), binary.LittleEndian.Uint32(buf))
		})
	}
}
