package cuda

// Several GPUs (device.PeerAccessor): cuDeviceCanAccessPeer,
// cuCtxEnablePeerAccess, cuMemSetAccess with one CUmemAccessDesc per
// device, and cuMemcpyDtoDAsync_v2.
//
// cuCtxEnablePeerAccess(peerContext) lets the *current* context reach
// memory of peerContext. To let device peer reach this device's memory,
// EnablePeerAccess therefore pushes peer's primary context (retained with
// cuDevicePrimaryCtxRetain and kept until Close, so that the access it
// enabled lives as long as this Device) and passes this device's context.

import (
	"errors"
	"fmt"
	"unsafe"

	"github.com/gpumem/tlsf/device"
)

var _ device.PeerAccessor = (*Device)(nil)

// cuResultPeerAlreadyEnabled is CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED:
// not a failure for EnablePeerAccess.
const cuResultPeerAlreadyEnabled = 704

// CanAccessPeer reports whether device peer can access this device's
// memory (cuDeviceGet, then cuDeviceCanAccessPeer(&ok, peer, this); no
// context needed, not counted). A device always reaches its own memory,
// even after Close. Errors: ErrNoDevice for an unknown ordinal; after
// Close, an error wrapping ErrInvalidValue (no driver call).
func (d *Device) CanAccessPeer(peer int) (bool, error) {
	if peer == d.ordinal {
		return true, nil
	}
	var ok int32
	err := d.whileOpen(func() error {
		_, pdev, err := cuDeviceAt(peer)
		if err != nil {
			return err
		}
		r := d.drv.cuDeviceCanAccessPeer.call(uintptr(unsafe.Pointer(&ok)), uintptr(pdev), uintptr(d.dev))
		return d.drv.check(&d.drv.cuDeviceCanAccessPeer, r)
	})
	if err != nil {
		return false, err
	}
	return ok != 0, nil
}

// whileOpen runs f, which makes driver calls outside exec, with Close
// held off; after Close it returns errCUDAClosed without running f. f
// must not call exec (the read lock is not reentrant while Close waits).
func (d *Device) whileOpen(f func() error) error {
	d.mu.RLock()
	defer d.mu.RUnlock()
	if d.closed {
		return errCUDAClosed
	}
	return f()
}

// closedErr returns errCUDAClosed after Close, else nil.
func (d *Device) closedErr() error {
	return d.whileOpen(func() error { return nil })
}

// peerContext returns the primary context of device ordinal peer
// (cuDeviceGet), retaining it on first use. After Close it calls nothing
// and returns errCUDAClosed: Close released the peers' contexts
// (releasePeers) and would not release one retained later.
func (d *Device) peerContext(peer int) (ctx uintptr, err error) {
	err = d.whileOpen(func() error {
		_, pdev, err := cuDeviceAt(peer)
		if err != nil {
			return err
		}
		ctx, err = d.peerContextLocked(pdev)
		return err
	})
	return ctx, err
}

// peerContextLocked is peerContext with d.mu read-held and d open.
func (d *Device) peerContextLocked(pdev int32) (uintptr, error) {
	d.peerMu.Lock()
	defer d.peerMu.Unlock()
	if ctx, ok := d.peerCtx[pdev]; ok {
		return ctx, nil
	}
	var ctx uintptr
	if r := d.drv.cuDevicePrimaryCtxRetain.call(uintptr(unsafe.Pointer(&ctx)), uintptr(pdev)); r != cudaSuccess {
		return 0, d.drv.error(&d.drv.cuDevicePrimaryCtxRetain, r)
	}
	if d.peerCtx == nil {
		d.peerCtx = make(map[int32]uintptr)
	}
	d.peerCtx[pdev] = ctx
	return ctx, nil
}

// releasePeers releases the peers' primary contexts (Close).
func (d *Device) releasePeers() error {
	d.peerMu.Lock()
	defer d.peerMu.Unlock()
	var errs []error
	for pdev := range d.peerCtx {
		errs = append(errs, d.drv.check(&d.drv.cuDevicePrimaryCtxRelease, d.drv.cuDevicePrimaryCtxRelease.call(uintptr(pdev))))
	}
	d.peerCtx = nil
	return errors.Join(errs...)
}

// EnablePeerAccess lets device peer access this device's linear memory,
// present and future: cuCtxEnablePeerAccess(this context, 0) with peer's
// primary context current. Enabling it again
// (CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED), or for this device, does
// nothing. Errors: ErrNoDevice (unknown ordinal); ErrNotSupported when
// cuDeviceCanAccessPeer says no (the message names the pair); the *Error
// of cuDevicePrimaryCtxRetain or cuCtxEnablePeerAccess; after Close, an
// error wrapping ErrInvalidValue, with no driver call and no context
// retained.
func (d *Device) EnablePeerAccess(peer int) error {
	if peer == d.ordinal {
		return nil
	}
	ok, err := d.CanAccessPeer(peer)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("device: CUDA device %d cannot access device %d (cuDeviceCanAccessPeer): %w", peer, d.ordinal, device.ErrNotSupported)
	}
	pctx, err := d.peerContext(peer)
	if err != nil {
		return err
	}
	r, err := d.execOn(pctx, device.CallCtxEnablePeerAccess, &d.drv.cuCtxEnablePeerAccess, d.ctx, 0)
	if r != cudaSuccess && r != cuResultPeerAlreadyEnabled {
		return errors.Join(fmt.Errorf("device: enabling access by device %d to device %d: %w", peer, d.ordinal, d.drv.error(&d.drv.cuCtxEnablePeerAccess, r)), err)
	}
	return err
}

// MemSetAccessPeers grants this device and each device in peers
// read-write access to the mapped range [ptr, ptr+size): cuMemSetAccess
// with one CUmemAccessDesc (CU_MEM_LOCATION_TYPE_DEVICE, PROT_READWRITE)
// per distinct device. Errors: ErrNoDevice for an unknown ordinal;
// ErrInvalidValue for a range not wholly mapped; for a device that cannot
// reach this one, the driver's error as cuMemSetAccess returns it (no
// check of cuDeviceCanAccessPeer first); after Close, an error wrapping
// ErrInvalidValue (no driver call).
func (d *Device) MemSetAccessPeers(ptr uintptr, size uint64, peers []int) error {
	descs := []cuMemAccessDesc{{
		location: cuMemLocation{typ: cuMemLocationDevice, id: d.dev},
		flags:    cuMemAccessReadWrite,
	}}
	seen := map[int32]bool{d.dev: true}
	err := d.whileOpen(func() error {
		for _, p := range peers {
			_, pdev, err := cuDeviceAt(p)
			if err != nil {
				return err
			}
			if seen[pdev] {
				continue
			}
			seen[pdev] = true
			descs = append(descs, cuMemAccessDesc{
				location: cuMemLocation{typ: cuMemLocationDevice, id: pdev},
				flags:    cuMemAccessReadWrite,
			})
		}
		return nil
	})
	if err != nil {
		return err
	}
	return d.do(device.CallMemSetAccess, &d.drv.cuMemSetAccess, ptr, uintptr(size), uintptr(unsafe.Pointer(&descs[0])), uintptr(len(descs)))
}

// MemcpyDtoDAsync copies n bytes from src to dst on stream s
// (cuMemcpyDtoDAsync_v2 in this device's context); either side may be
// another device's memory this device was granted access to. n = 0 makes
// no driver call. Errors: ErrInvalidValue for memory this device may not
// access or a bad stream.
func (d *Device) MemcpyDtoDAsync(dst, src uintptr, n uint64, s device.Stream) error {
	if n == 0 {
		return nil
	}
	return d.do(device.CallMemcpyDtoDAsync, &d.drv.cuMemcpyDtoDAsync, dst, src, uintptr(n), uintptr(s))
}
