package pool

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/cuda"
)

// Devices holds one Pool per GPU of the host, by device ordinal, each
// made on first use with the same Options: a program (or the C ABI's
// device argument) that uses several GPUs asks for the pool of the GPU it
// means and never makes two pools for one device.
//
// Options.PeerAccess applies to every pool (each skips its own ordinal),
// so Options{PeerAccess: DeviceSetOf(0, 1)} gives GPUs 0 and 1 access to
// each other's pools. All methods are safe for concurrent use; Get makes
// a pool under the Devices' lock, so a first Get of one ordinal waits for
// another's first Get (a few driver calls).
type Devices struct {
	open func(ordinal int) (device.Device, error)
	own  bool // pools close their devices (NewDevices)
	opts Options

	mu     sync.Mutex
	pools  map[int]*Pool
	closed bool
}

// NewDevices returns a Devices whose pools use the CUDA driver: Get(k)
// opens GPU k (cuda.Open, its primary context), and Close releases it.
// NewDevices itself loads no driver: where none can be loaded, each Get
// fails with cuda.Open's error wrapping device.ErrNoDriver. Errors:
// ErrBadOptions (checked now, not at each Get).
func NewDevices(opts Options) (*Devices, error) {
	d, err := NewDevicesOn(func(k int) (device.Device, error) { return cuda.Open(k) }, opts)
	if d != nil {
		d.own = true
	}
	return d, err
}

// NewDevicesOn returns a Devices whose pools use the devices open returns
// (for example sim.Host's Open method: NewDevicesOn(host.Open, opts));
// the pools do not close them, the caller does after Close. open is
// called at most once per ordinal that Get succeeds for (again after the
// caller closed that ordinal's pool), must return a device whose Ordinal
// is the one asked for, and, for an ordinal no device has, an error
// wrapping device.ErrNoDevice (Get passes open's errors on). Errors:
// ErrBadOptions (a nil open, or bad Options).
func NewDevicesOn(open func(ordinal int) (device.Device, error), opts Options) (*Devices, error) {
	if open == nil {
		return nil, fmt.Errorf("%w: nil device opener", ErrBadOptions)
	}
	if _, err := opts.withDefaults(); err != nil {
		return nil, err
	}
	return &Devices{open: open, opts: opts, pools: map[int]*Pool{}}, nil
}

// Get returns the pool of GPU ordinal, making it on first use (the
// device's open, then New), and anew where the caller closed the pool
// Get returned before. A failed Get makes nothing, and a later Get tries
// again.
//
// Errors: ErrClosed; device.ErrNoDevice (wrapped) for a negative
// ordinal, or one no device has (as open reports it); open's other errors,
// wrapped (for NewDevices, cuda.Open's: device.ErrNoDriver where no
// driver can be loaded); ErrBadOptions when open returns a nil device or
// one of another ordinal; ErrNoPeerAccess and the errors of New.
func (d *Devices) Get(ordinal int) (*Pool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return nil, ErrClosed
	}
	if p := d.pools[ordinal]; p != nil {
		if !p.isClosed() {
			return p, nil
		}
		delete(d.pools, ordinal) // closed by the caller: made anew below
	}
	if ordinal < 0 {
		return nil, fmt.Errorf("pool: device ordinal %d: %w", ordinal, device.ErrNoDevice)
	}
	dev, err := d.open(ordinal)
	if err != nil {
		return nil, fmt.Errorf("pool: opening device %d: %w", ordinal, err)
	}
	if nilDevice(dev) {
		return nil, fmt.Errorf("%w: opening device %d gave a nil device", ErrBadOptions, ordinal)
	}
	closeDev := func() {
		if d.own {
			_ = dev.Close()
		}
	}
	if dev.Ordinal() != ordinal {
		closeDev()
		return nil, fmt.Errorf("%w: opening device %d gave another device", ErrBadOptions, ordinal)
	}
	p, err := New(dev, d.opts)
	if err != nil {
		closeDev()
		return nil, fmt.Errorf("pool: device %d: %w", ordinal, err)
	}
	p.owned = d.own
	d.pools[ordinal] = p
	return p, nil
}

// Ordinals returns the ordinals whose pools exist, in increasing order.
func (d *Devices) Ordinals() []int {
	d.mu.Lock()
	defer d.mu.Unlock()
	out := make([]int, 0, len(d.pools))
	for k, p := range d.pools {
		if !p.isClosed() { // a pool its user closed is no longer there
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// Close closes every pool (Pool.Close: all their memory is returned,
// live allocations included) and, for NewDevices, releases the devices.
// Later calls return ErrClosed. Errors: ErrClosed (closed already), the
// pools' Close errors joined (every pool is closed regardless).
func (d *Devices) Close() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.closed {
		return ErrClosed
	}
	d.closed = true
	var errs []error
	for _, k := range slices.Sorted(maps.Keys(d.pools)) {
		if err := d.pools[k].Close(); err != nil && !errors.Is(err, ErrClosed) { // ErrClosed: the caller closed it
			errs = append(errs, fmt.Errorf("pool: closing device %d: %w", k, err))
		}
	}
	d.pools = nil
	return errors.Join(errs...)
}

// isClosed reports whether Close ran, without the pool's lock (which a
// long locked call may hold).
func (p *Pool) isClosed() bool { return p.closedFlag.Load() }
