package pool

import (
	"fmt"
	"math"
	"math/big"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// Configuration strings.
//
// Programs that cannot build an Options value (the C ABI in capi/, a
// PyTorch process, a command line) configure a pool with one string of
// comma-separated key:value pairs, in the manner of PyTorch's
// PYTORCH_CUDA_ALLOC_CONF:
//
//	backend:vmm,max_fraction:0.9,max_bytes:40GiB,caches:false
//
// Keys are lower case; blanks around keys, values and commas are ignored;
// each key may appear once; an empty string is the default configuration.

// ConfEnv is the environment variable the C ABI reads at first use when
// tlsf_configure was not called: a configuration string for ParseConf.
const ConfEnv = "TLSF_ALLOC_CONF"

// Device kinds of a Conf.
const (
	// ConfDeviceCUDA: pools on GPUs through the CUDA driver (cuda.Open).
	ConfDeviceCUDA = "cuda"
	// ConfDeviceSim: pools on simulated GPUs (device/sim), for tests and
	// examples without a GPU.
	ConfDeviceSim = "sim"
)

// Conf is a parsed configuration string: the pool's Options and the keys
// that say which device to open.
type Conf struct {
	// Options for every pool made with this configuration.
	Options Options
	// Device is ConfDeviceCUDA (the default) or ConfDeviceSim.
	Device string
	// SimCapacity is each simulated GPU's memory in bytes (0: the
	// simulator's default, an H200's 143771 MiB), at most MaxSimCapacity.
	// Only with ConfDeviceSim.
	SimCapacity uint64
}

// MaxSimCapacity bounds sim_capacity: 1 TiB, seven H200s, so that a VMM
// pool's address range (twice the device's memory) fits in a simulated
// process's 4 TiB of virtual addresses.
const MaxSimCapacity = 1 << 40

// MinSimCapacity is the least sim_capacity but 0 (the default): one page
// of the simulated GPU's allocation granularity (sim.Config.Granularity,
// 2 MiB); below it no pool could map a page.
const MinSimCapacity = 2 << 20

// confKeys maps each key to the function that applies its value.
var confKeys = map[string]func(c *Conf, v string) error{
	"backend": func(c *Conf, v string) error {
		for b, name := range backendNames {
			if v == name {
				c.Options.Backend = Backend(b)
				return nil
			}
		}
		return fmt.Errorf("want one of %s", strings.Join(backendNames[:], ", "))
	},
	"device": func(c *Conf, v string) error {
		if v != ConfDeviceCUDA && v != ConfDeviceSim {
			return fmt.Errorf("want %s or %s", ConfDeviceCUDA, ConfDeviceSim)
		}
		c.Device = v
		return nil
	},
	"sim_capacity": func(c *Conf, v string) (err error) {
		c.SimCapacity, err = parseBytes(v)
		switch {
		case err != nil:
		case c.SimCapacity > MaxSimCapacity:
			err = fmt.Errorf("at most %d bytes (1 TiB): a VMM pool reserves twice the device's memory of address space, of the 4 TiB a simulated process has", uint64(MaxSimCapacity))
		case c.SimCapacity > 0 && c.SimCapacity < MinSimCapacity:
			err = fmt.Errorf("at least %d bytes (2 MiB, the simulated GPU's allocation granularity; 0: the default): no pool could map a page", uint64(MinSimCapacity))
		}
		return err
	},
	"initial_fraction":    fraction(func(c *Conf) *float64 { return &c.Options.InitialFraction }),
	"grow_fraction":       fraction(func(c *Conf) *float64 { return &c.Options.GrowFraction }),
	"max_fraction":        fraction(func(c *Conf) *float64 { return &c.Options.MaxFraction }),
	"release_fraction":    fraction(func(c *Conf) *float64 { return &c.Options.ReleaseFraction }),
	"free_floor_fraction": fraction(func(c *Conf) *float64 { return &c.Options.FreeFloorFraction }),
	"max_bytes":           func(c *Conf, v string) (err error) { c.Options.MaxBytes, err = parseBytes(v); return err },
	"idle_release": func(c *Conf, v string) error {
		if v == "off" {
			c.Options.IdleRelease = -1
			return nil
		}
		d, err := time.ParseDuration(v)
		if err != nil || d < 0 {
			return fmt.Errorf("want a duration such as 500ms or 2s (0: the default), or off")
		}
		c.Options.IdleRelease = d
		return nil
	},
	"caches": func(c *Conf, v string) error {
		if v == "auto" {
			c.Options.Cache.Disable, c.Options.Cache.Eager = false, false
			return nil
		}
		on, err := parseBool(v)
		if err != nil {
			return fmt.Errorf("want auto, true or false")
		}
		c.Options.Cache.Disable, c.Options.Cache.Eager = !on, on
		return nil
	},
	"cache_max_size": func(c *Conf, v string) (err error) { c.Options.Cache.MaxSize, err = parseBytes(v); return err },
	"good_fit":       func(c *Conf, v string) (err error) { c.Options.GoodFit, err = parseBool(v); return err },
	"wilderness":     func(c *Conf, v string) (err error) { c.Options.Wilderness, err = parseBool(v); return err },
	"passthrough":    func(c *Conf, v string) (err error) { c.Options.Passthrough, err = parseBool(v); return err },
	"guard":          func(c *Conf, v string) (err error) { c.Options.Guard, err = parseBytes(v); return err },
	"history": func(c *Conf, v string) error {
		n, err := strconv.ParseUint(v, 10, 31)
		if err != nil {
			return fmt.Errorf("want a whole number of events")
		}
		c.Options.History = int(n)
		return nil
	},
	"history_stacks": func(c *Conf, v string) (err error) { c.Options.HistoryStacks, err = parseBool(v); return err },
}

// ParseConf parses a configuration string of comma-separated key:value
// pairs. Keys:
//
//	backend              auto | vmm | chunks | passthrough (Options.Backend)
//	device               cuda | sim (Conf.Device; default cuda)
//	sim_capacity         bytes, MinSimCapacity to MaxSimCapacity, or 0 (Conf.SimCapacity; sim only)
//	initial_fraction     fraction in [0, 1] (Options.InitialFraction)
//	grow_fraction        fraction in [0, 1] (Options.GrowFraction)
//	max_fraction         fraction in [0, 1] (Options.MaxFraction)
//	max_bytes            bytes (Options.MaxBytes; 0: no cap)
//	release_fraction     fraction in [0, 1] (Options.ReleaseFraction)
//	free_floor_fraction  fraction in [0, 1] (Options.FreeFloorFraction)
//	idle_release         duration, e.g. 500ms or 2s, or off (Options.IdleRelease;
//	                     0: the default)
//	caches               auto | true | false (auto, the default: on once
//	                     goroutines contend for the pool's lock; true sets
//	                     Options.Cache.Eager; false Options.Cache.Disable)
//	cache_max_size       bytes (Options.Cache.MaxSize; 0: the default)
//	good_fit             true | false (Options.GoodFit)
//	wilderness           true | false (Options.Wilderness)
//	passthrough          true | false (Options.Passthrough)
//	guard                bytes of red zone after every block (Options.Guard)
//	history              events kept for History and Snapshot (Options.History)
//	history_stacks       true | false (Options.HistoryStacks)
//
// Bytes are a whole number, optionally followed by a unit, in any case:
// B, KiB, MiB, GiB, TiB or K, M, G, T (powers of 1024), KB, MB, GB, TB
// (powers of 1000); with a unit the number may have a fraction
// ("1.5GiB"), rounded down to whole bytes (ParseBytes). A fraction of 0
// selects the default, as in Options.
//
// Errors wrap ErrBadOptions and name the key or the malformed item: an
// item without a colon, an empty key, an unknown key, a key given twice,
// a value out of range or unparsable, or options that conflict
// (initial_fraction above max_fraction, sim_capacity without device:sim).
// On error the returned Conf is the zero value.
func ParseConf(s string) (Conf, error) {
	c := Conf{Device: ConfDeviceCUDA}
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	seen := map[string]bool{}
	for _, item := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(item, ":")
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		switch {
		case strings.TrimSpace(item) == "":
			return Conf{}, fmt.Errorf("%w: configuration %q: empty item", ErrBadOptions, s)
		case !ok:
			return Conf{}, fmt.Errorf("%w: configuration item %q: want key:value", ErrBadOptions, strings.TrimSpace(item))
		case k == "":
			return Conf{}, fmt.Errorf("%w: configuration item %q: empty key", ErrBadOptions, strings.TrimSpace(item))
		}
		apply, known := confKeys[k]
		if !known {
			return Conf{}, fmt.Errorf("%w: unknown configuration key %q (known: %s)", ErrBadOptions, k, strings.Join(confKeyNames(), ", "))
		}
		if seen[k] {
			return Conf{}, fmt.Errorf("%w: configuration key %q given twice", ErrBadOptions, k)
		}
		seen[k] = true
		if err := apply(&c, v); err != nil {
			// The reason before the value, which is cut: a message cut at
			// the C ABI's 1 KiB keeps the reason.
			return Conf{}, fmt.Errorf("%w: configuration key %q: %v: value %q", ErrBadOptions, k, err, shortValue(v))
		}
	}
	if c.SimCapacity != 0 && c.Device != ConfDeviceSim {
		return Conf{}, fmt.Errorf("%w: configuration key %q applies only with device:%s", ErrBadOptions, "sim_capacity", ConfDeviceSim)
	}
	if _, err := c.Options.withDefaults(); err != nil {
		// The reason first: a message cut at the C ABI's 1 KiB keeps it.
		return Conf{}, fmt.Errorf("%w (configuration %q)", err, s)
	}
	return c, nil
}

// confKeyNames lists the known keys, sorted, for messages.
func confKeyNames() []string {
	names := make([]string, 0, len(confKeys))
	for k := range confKeys {
		names = append(names, k)
	}
	slices.Sort(names)
	return names
}

// fraction returns the parser of a fraction-valued key stored at field.
func fraction(field func(*Conf) *float64) func(*Conf, string) error {
	return func(c *Conf, v string) error {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("not a number")
		}
		if math.IsNaN(f) || f < 0 || f > 1 {
			return fmt.Errorf("want a fraction in [0, 1]")
		}
		*field(c) = f
		return nil
	}
}

func parseBool(v string) (bool, error) {
	switch v {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, fmt.Errorf("want true or false")
}

// byteUnits are the units ParseBytes accepts, lower-cased, in bytes.
var byteUnits = map[string]uint64{
	"b":   1,
	"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
	"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
	"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
}

// byteUnitsText lists byteUnits for error messages.
const byteUnitsText = "B, KiB, MiB, GiB, TiB (or K, M, G, T), KB, MB, GB, TB"

// ParseBytes parses a byte count as TLSF_ALLOC_CONF, ParseConf and
// tlsf-stress's flags write it: a whole number of bytes, or a number and
// a unit, case-insensitive, with space between them or not: B; KiB, MiB,
// GiB, TiB or K, M, G, T (powers of 1024); KB, MB, GB, TB (powers of
// 1000). A number with a unit may have a decimal point ("1.5GiB"); the
// bytes are rounded down. Errors (wrapping ErrBadOptions): no number, a
// fraction without a unit, an unknown unit, a value of 2^64 bytes or more.
func ParseBytes(v string) (uint64, error) {
	n, err := parseBytes(strings.TrimSpace(v))
	if err != nil {
		return 0, fmt.Errorf("%w: byte count %q: %v", ErrBadOptions, v, err)
	}
	return n, nil
}

// parseBytes is ParseBytes with the bare reason as its error.
func parseBytes(v string) (uint64, error) {
	i := strings.IndexFunc(v, func(r rune) bool { return (r < '0' || r > '9') && r != '.' })
	num, unit := v, ""
	if i >= 0 {
		num, unit = strings.TrimSpace(v[:i]), strings.TrimSpace(v[i:])
	}
	if num == "" {
		return 0, fmt.Errorf("want a byte count such as 1073741824 or 1GiB")
	}
	mult := uint64(1)
	if unit != "" {
		var ok bool
		if mult, ok = byteUnits[strings.ToLower(unit)]; !ok {
			return 0, fmt.Errorf("unknown unit %q, want %s", unit, byteUnitsText)
		}
	}
	if !strings.Contains(num, ".") {
		n, err := strconv.ParseUint(num, 10, 64)
		if err != nil || n > math.MaxUint64/mult {
			return 0, fmt.Errorf("want a whole number of bytes below 2^64")
		}
		return n * mult, nil
	}
	if unit == "" {
		return 0, fmt.Errorf("want a whole number of bytes, or a number and a unit (%s)", byteUnitsText)
	}
	// Exact: "4.1GB" is 4,100,000,000 bytes, where a float64 gave one less.
	r, ok := new(big.Rat).SetString(num) // digits and points only: no sign, exponent or base
	if !ok {
		return 0, fmt.Errorf("%q is not a number", num)
	}
	r.Mul(r, new(big.Rat).SetUint64(mult))
	b := new(big.Int).Quo(r.Num(), r.Denom()) // rounded down: both are positive
	if !b.IsUint64() {
		return 0, fmt.Errorf("2^64 bytes or more")
	}
	return b.Uint64(), nil
}

// shortValue returns v, or its first 64 bytes (whole UTF-8 characters)
// and "…" where it is longer: a configuration value quoted in an error.
func shortValue(v string) string {
	const most = 64
	if len(v) <= most {
		return v
	}
	cut := most
	for cut > 0 && !utf8.RuneStart(v[cut]) {
		cut--
	}
	return v[:cut] + "…"
}
