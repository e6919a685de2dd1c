//go:build cgo

package main

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"

	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
)

// maxDevices bounds device ordinals: 64 GPUs, more than any one host has.
const maxDevices = 64

// simDevices is the number of simulated GPUs under device:sim (ordinals
// 0 to 3), so that tests can use several devices and a bad ordinal.
const simDevices = 4

// errBadDevice: a device ordinal out of range.
var errBadDevice = errors.New("bad device ordinal")

// errConfigured: tlsf_configure after a pool was made.
var errConfigured = errors.New("a pool exists already: call tlsf_configure before the first allocation")

// registry is the library's one pool per device ordinal. The pools are
// read with an atomic load on every call; mu serialises configuration and
// the making of pools. (A pool.Devices type may take its place.)
type registry struct {
	pools [maxDevices]atomic.Pointer[pool.Pool]

	mu      sync.Mutex
	conf    *pool.Conf // nil until tlsf_configure or the first use
	fromEnv bool       // conf was read from TLSF_ALLOC_CONF: read again until a pool is made
	made    bool       // a pool was made: the configuration is final
}

var reg registry

// envSync, called until the first pool is made (confLocked), refreshes
// the Go runtime's copy of the environment variables the library reads:
// syncEnv (capi.go), a variable so that registry.go needs no C.
var envSync = func() {}

// maxBytes returns the configuration's max_bytes (0: none or no
// configuration yet).
func (r *registry) maxBytes() uint64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.conf == nil {
		return 0
	}
	return r.conf.Options.MaxBytes
}

// configure sets the configuration from s (tlsf_configure).
func (r *registry) configure(s string) error {
	c, err := pool.ParseConf(s)
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.made {
		return errConfigured
	}
	r.conf, r.fromEnv = &c, false
	return nil
}

// confLocked returns the configuration, reading TLSF_ALLOC_CONF if
// tlsf_configure set none (again at each call until a pool is made: a
// first use that failed, for want of a driver say, leaves a later setenv
// its effect). mu held.
func (r *registry) confLocked() (*pool.Conf, error) {
	if !r.made {
		envSync()
	}
	if r.conf == nil || r.fromEnv && !r.made {
		c, err := pool.ParseConf(os.Getenv(pool.ConfEnv))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", pool.ConfEnv, err)
		}
		r.conf, r.fromEnv = &c, true
	}
	return r.conf, nil
}

// checkOrdinal rejects ordinals no pool can have.
func checkOrdinal(dev int) error {
	if dev < 0 || dev >= maxDevices {
		return fmt.Errorf("%w %d: want 0 to %d", errBadDevice, dev, maxDevices-1)
	}
	return nil
}

// lookup returns the pool of dev, or nil if none was made.
func (r *registry) lookup(dev int) (*pool.Pool, error) {
	if err := checkOrdinal(dev); err != nil {
		return nil, err
	}
	return r.pools[dev].Load(), nil
}

// owner returns the device ordinal, other than except, whose pool has a
// live allocation at ptr: for tlsf_free's error where a caller frees a
// block on the wrong device. It asks each other pool (Pool.Size, under
// its lock); only failed frees call it.
func (r *registry) owner(ptr uintptr, except int) (int, bool) {
	for dev := range r.pools {
		if p := r.pools[dev].Load(); p != nil && dev != except {
			if _, err := p.Size(ptr); err == nil {
				return dev, true
			}
		}
	}
	return 0, false
}

// get returns the pool of dev, making it on first use.
func (r *registry) get(dev int) (*pool.Pool, error) {
	if uint(dev) < maxDevices {
		if p := r.pools[dev].Load(); p != nil {
			return p, nil
		}
	}
	if err := checkOrdinal(dev); err != nil {
		return nil, err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if p := r.pools[dev].Load(); p != nil {
		return p, nil
	}
	c, err := r.confLocked()
	if err != nil {
		return nil, err
	}
	var p *pool.Pool
	switch c.Device {
	case pool.ConfDeviceSim:
		if dev >= simDevices {
			return nil, fmt.Errorf("%w %d: device:sim has ordinals 0 to %d", errBadDevice, dev, simDevices-1)
		}
		// Guard mode reads memory back: the simulator must keep contents.
		// Device dev of a simulated host of simDevices GPUs has an address
		// window of its own, as under unified virtual addressing, where
		// standalone simulated devices would all share one: a block freed
		// as another device's must not be that device's block too.
		h := sim.NewHost(simDevices, sim.Config{Capacity: c.SimCapacity, Shadow: c.Options.Guard > 0})
		p, err = pool.New(h.Device(dev), c.Options)
	default:
		p, err = pool.NewCUDA(dev, c.Options)
	}
	if err != nil {
		return nil, fmt.Errorf("making the pool of device %d: %w", dev, err)
	}
	r.made = true
	r.pools[dev].Store(p)
	return p, nil
}

// each calls f for every pool made, by ordinal.
func (r *registry) each(f func(dev int, p *pool.Pool)) {
	for dev := range r.pools {
		if p := r.pools[dev].Load(); p != nil {
			f(dev, p)
		}
	}
}
