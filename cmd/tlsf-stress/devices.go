package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/cuda"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/gpumem/tlsf/pool"
)

// Device kinds, the values of --device.
const (
	deviceCUDA = "cuda"
	deviceSim  = "sim"
)

// devices hands out the device replays and runs use: the CUDA GPU 0,
// shared by every run and closed at the end, or a fresh simulated H200
// per run, so that each run's figures start from an empty device.
type devices struct {
	kind string       // deviceCUDA or deviceSim
	cuda *cuda.Device // when kind is deviceCUDA
	sd   sim.Config   // when kind is deviceSim
	note string       // why the simulated device was chosen, if it was not asked for
	conf string       // --conf as given
	pool pool.Options // --conf: every pool's options before the backend's own
}

// confOf returns --conf as given where it applies to backend be (a pool
// backend), else "" (the driver's pool takes no pool options).
func (ds *devices) confOf(be string) string {
	if be == backendAsync {
		return ""
	}
	return ds.conf
}

// openDevices resolves --device: "cuda" opens GPU 0 and fails without one;
// "sim" uses the simulated device; "" tries the GPU and falls back to the
// simulated device where there is no driver or no GPU. shadow keeps the
// simulated memory's contents (verification needs it; so does guard mode,
// --conf guard:N, which it is on for in any case).
func openDevices(g *globalFlags, shadow bool) (*devices, error) {
	shadow = shadow || g.pool.Guard > 0
	ds := &devices{kind: g.device, sd: sim.Config{Shadow: shadow, Capacity: uint64(g.simCapacity), RealTime: g.simRealTime}, conf: g.conf, pool: g.pool}
	if c := ds.sd.Capacity; c > 0 && c != sim.H200Capacity {
		// An H200's latencies, not its memory: say so wherever the
		// device is named.
		ds.sd.Name = fmt.Sprintf("Simulated H200 with %s", capacityName(c))
	}
	if ds.kind == deviceSim {
		return ds, nil
	}
	d, err := cuda.Open(0)
	switch {
	case err == nil:
		ds.kind, ds.cuda = deviceCUDA, d
		return ds, nil
	case ds.kind == "" && (errors.Is(err, device.ErrNoDriver) || errors.Is(err, device.ErrNoDevice)):
		ds.kind = deviceSim
		why := "no CUDA GPU"
		if errors.Is(err, device.ErrNoDriver) {
			why = "no CUDA driver (libcuda)"
		}
		ds.note = why + " found: using the simulated H200 (--device sim chooses it without this note)"
		return ds, nil
	}
	return nil, fmt.Errorf("opening CUDA device 0: %w", err)
}

// get returns a device for one run and the function that ends its use: the
// shared GPU, or a new simulated GPU.
func (ds *devices) get() (device.Device, func()) {
	if ds.kind == deviceCUDA {
		return ds.cuda, func() {}
	}
	s := sim.New(ds.sd)
	return s, func() { _ = s.Close() }
}

// name describes the device, e.g. "NVIDIA H200" or "Simulated H200".
func (ds *devices) name() string {
	if ds.kind == deviceCUDA {
		return ds.cuda.Name()
	}
	if ds.sd.Name != "" {
		return ds.sd.Name
	}
	return "Simulated H200"
}

// close releases the GPU, if one was opened.
func (ds *devices) close() {
	if ds.cuda != nil {
		_ = ds.cuda.Close()
	}
}

// sizeFlag is a byte count flag, as pool.ParseBytes reads it: a decimal
// integer with an optional unit (binary K, KiB, M, MiB, G, GiB, T, TiB;
// decimal KB, MB, GB, TB; B; case-insensitive), or a decimal number with
// a unit (1.5GiB), rounded down to a byte.
type sizeFlag uint64

func (f *sizeFlag) String() string { return strconv.FormatUint(uint64(*f), 10) }
func (f *sizeFlag) Type() string   { return "bytes" }
func (f *sizeFlag) Set(s string) error {
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	*f = sizeFlag(n)
	return nil
}

// parseBytes parses a byte count (see sizeFlag): pool.ParseBytes, the
// syntax of --conf and TLSF_ALLOC_CONF.
func parseBytes(s string) (uint64, error) {
	n, err := pool.ParseBytes(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not a byte count (a whole number, or a number with a unit: B, KiB, MiB, GiB, TiB or K, M, G, T, binary; KB, MB, GB, TB, decimal)", s)
	}
	return n, nil
}

// minCapBytes is the least byte count --cap takes (capFlag.least): a
// kibibyte, far below any pool's granularity (2 MiB), so that a bare
// small number, a fraction written without its decimal point, is refused
// as a usage error.
const minCapBytes = 1 << 10

// capFlag is --cap and --max-live: bytes (see sizeFlag; 0: none), or a
// fraction of the device's total memory written with a decimal point and
// no suffix, in (0, 1].
type capFlag struct {
	bytes    uint64
	fraction float64
	least    uint64 // the least byte count but 0 (minCapBytes for --cap)
}

func (f *capFlag) String() string {
	if f.fraction > 0 {
		return strconv.FormatFloat(f.fraction, 'g', -1, 64)
	}
	return strconv.FormatUint(f.bytes, 10)
}

func (f *capFlag) Type() string { return "bytes|fraction" }

func (f *capFlag) Set(s string) error {
	t := strings.TrimSpace(s)
	if strings.Contains(t, ".") && t != "" && t[len(t)-1] >= '0' && t[len(t)-1] <= '9' {
		v, err := strconv.ParseFloat(t, 64)
		if err != nil || !(v > 0 && v <= 1) {
			return fmt.Errorf("%q: a fraction must be in (0, 1]", s)
		}
		f.bytes, f.fraction = 0, v
		return nil
	}
	n, err := parseBytes(s)
	if err != nil {
		return err
	}
	if n > 0 && n < f.least {
		// "1" meant as the whole device would cap every pool at 1 byte.
		return fmt.Errorf("%q: under a KiB, below any pool's granularity; a fraction of the device has a decimal point (1.0, 0.5)", s)
	}
	f.bytes, f.fraction = n, 0
	return nil
}

// resolve returns the byte value for a device of total bytes (0: unset).
func (f capFlag) resolve(total uint64) uint64 {
	if f.fraction > 0 {
		return uint64(f.fraction * float64(total))
	}
	return f.bytes
}

// set reports whether the flag was given a non-zero value.
func (f capFlag) set() bool { return f.bytes > 0 || f.fraction > 0 }

// deviceTotal returns the device's total memory in bytes.
func deviceTotal(d device.Device) (uint64, error) {
	_, total, err := d.MemGetInfo()
	return total, err
}

// capacityName writes a simulated capacity in GiB, or MiB below 1 GiB.
func capacityName(n uint64) string {
	if n < 1<<30 {
		return fmt.Sprintf("%.2f MiB", float64(n)/(1<<20))
	}
	return gib(n)
}

// gib formats bytes as GiB with two decimals.
func gib(n uint64) string { return fmt.Sprintf("%.2f GiB", float64(n)/(1<<30)) }
