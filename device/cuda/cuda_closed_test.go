package cuda

import (
	"errors"
	"testing"

	"github.com/gpumem/tlsf/device"
)

// closedCalls calls every method of d that calls the driver (peer ones
// with ordinal peer), for checks after Close. MemsetD8Async, which looks
// its entry point up in the loaded library before it checks, only where
// there is one (loaded).
func closedCalls(d *Device, peer int, loaded bool) map[string]error {
	calls := map[string]error{}
	_, calls["CanAccessPeer"] = d.CanAccessPeer(peer)
	calls["EnablePeerAccess"] = d.EnablePeerAccess(peer)
	calls["MemSetAccessPeers"] = d.MemSetAccessPeers(0, 0, []int{peer})
	_, calls["MemAllocAsync"] = d.MemAllocAsync(4096, 0)
	calls["MemFreeAsync"] = d.MemFreeAsync(0, 0)
	calls["MemPoolTrimTo"] = d.MemPoolTrimTo(0)
	_, calls["MemPoolGetAttribute"] = d.MemPoolGetAttribute(device.MemPoolReleaseThreshold)
	calls["MemPoolSetAttribute"] = d.MemPoolSetAttribute(device.MemPoolReleaseThreshold, 0)
	calls["StoreByte"] = d.StoreByte(0, 1, 0)
	if loaded {
		calls["MemsetD8Async"] = d.MemsetD8Async(0, 1, 1, 0)
	}
	calls["InContext"] = d.InContext(func() {})
	_, _, calls["MemGetInfo"] = d.MemGetInfo()
	_, calls["MemAlloc"] = d.MemAlloc(4096)
	_, calls["AddressReserve"] = d.AddressReserve(2<<20, 0)
	_, calls["EventQuery"] = d.EventQuery(0)
	return calls
}

// A closed device fails every call that would reach the driver with
// ErrInvalidValue before it makes one. The device here has a driver with
// no entry point resolved and no library, so a call that went on would
// fail otherwise (ErrNoDriver, ErrNotSupported) or crash: this runs
// without a GPU.
func TestClosedDeviceMakesNoDriverCall(t *testing.T) {
	d := &Device{drv: &cuDriver{}, ordinal: 0, closed: true}
	for name, err := range closedCalls(d, 1, false) {
		if !errors.Is(err, device.ErrInvalidValue) || !errors.Is(err, errCUDAClosed) {
			t.Errorf("%s on a closed device = %v, want the closed error (ErrInvalidValue)", name, err)
		}
	}
	if d.peerCtx != nil {
		t.Errorf("a closed device retained peer contexts: %v", d.peerCtx)
	}
	// Its own ordinal needs no driver call, closed or not.
	if ok, err := d.CanAccessPeer(0); !ok || err != nil {
		t.Errorf("CanAccessPeer(own ordinal) on a closed device = %v, %v, want true, nil", ok, err)
	}
	if err := d.EnablePeerAccess(0); err != nil {
		t.Errorf("EnablePeerAccess(own ordinal) on a closed device = %v, want nil", err)
	}
}

// TestCUDAPeerCallsAfterClose: on a GPU, a closed Device's peer calls fail
// with ErrInvalidValue, and EnablePeerAccess retains no peer's primary
// context (Close released them and would not release a later one). Ordinal
// 1 serves as the peer: a second GPU where there is one, else an ordinal
// no device has, whose cuDeviceGet would answer ErrNoDevice had the call
// been made.
func TestCUDAPeerCallsAfterClose(t *testing.T) {
	openCUDA(t) // skips where there is no GPU
	d, err := Open(0)
	cuMust(t, err)
	cuMust(t, d.Close())
	for name, err := range closedCalls(d, 1, true) {
		if !errors.Is(err, device.ErrInvalidValue) {
			t.Errorf("%s after Close = %v, want ErrInvalidValue", name, err)
		}
	}
	d.peerMu.Lock()
	retained := len(d.peerCtx)
	d.peerMu.Unlock()
	if retained != 0 {
		t.Errorf("EnablePeerAccess after Close retained %d peer contexts", retained)
	}
}
