package pool

import (
	"errors"
	"fmt"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestParseConfAcceptsEveryKey(t *testing.T) {
	c, err := ParseConf(" backend:chunks , device:sim,sim_capacity:2GiB,initial_fraction:0.01," +
		"grow_fraction:0.5,max_fraction:0.9,max_bytes:1.5GiB,release_fraction:0.03," +
		"free_floor_fraction:0.1,caches:false,cache_max_size:4KiB,good_fit:true,wilderness:true,passthrough:false,guard:64," +
		"history:100,history_stacks:true")
	require.NoError(t, err)
	require.Equal(t, Conf{
		Device:      ConfDeviceSim,
		SimCapacity: 2 << 30,
		Options: Options{
			Backend:           BackendChunks,
			InitialFraction:   0.01,
			GrowFraction:      0.5,
			MaxFraction:       0.9,
			MaxBytes:          3 << 29,
			ReleaseFraction:   0.03,
			FreeFloorFraction: 0.1,
			Cache:             CacheOptions{Disable: true, MaxSize: 4 << 10},
			GoodFit:           true,
			Wilderness:        true,
			Guard:             64,
			History:           100,
			HistoryStacks:     true,
		},
	}, c)
}

func TestParseConfDefaults(t *testing.T) {
	for _, s := range []string{"", "   "} {
		c, err := ParseConf(s)
		require.NoError(t, err)
		require.Equal(t, Conf{Device: ConfDeviceCUDA}, c, "%q", s)
	}
	c, err := ParseConf("caches:auto,passthrough:true,backend:auto")
	require.NoError(t, err)
	require.Equal(t, Conf{Device: ConfDeviceCUDA, Options: Options{Passthrough: true}}, c)
}

func TestParseConfCaches(t *testing.T) {
	for in, want := range map[string]CacheOptions{
		"caches:auto":  {},
		"caches:true":  {Eager: true},
		"caches:false": {Disable: true},
	} {
		c, err := ParseConf(in)
		require.NoError(t, err, in)
		require.Equal(t, want, c.Options.Cache, in)
	}
	_, err := ParseConf("caches:on")
	require.ErrorIs(t, err, ErrBadOptions)
	require.ErrorContains(t, err, "want auto, true or false")
}

func TestParseConfByteUnits(t *testing.T) {
	for in, want := range map[string]uint64{
		"0":                    0,
		"1234":                 1234,
		"18446744073709551615": 1<<64 - 1,
		"7B":                   7,
		"3KiB":                 3 << 10,
		"3 MiB":                3 << 20,
		"40GiB":                40 << 30,
		"1TiB":                 1 << 40,
		"2KB":                  2000,
		"2MB":                  2e6,
		"2GB":                  2e9,
		"0.5KiB":               512,
		"1.0001KB":             1000,
		"8G":                   8 << 30,
		"8g":                   8 << 30,
		"8gib":                 8 << 30,
		"8Gb":                  8e9,
		"1.5 t":                3 << 39,
		"16777215TiB":          1<<64 - 1<<40,
		"4.1GB":                4_100_000_000,
		"0.1KB":                100,
		"16777215.99999999TiB": 1<<64 - 1<<40 + 1_099_511_616_780,
	} {
		c, err := ParseConf("max_bytes:" + in)
		require.NoError(t, err, in)
		require.Equal(t, want, c.Options.MaxBytes, in)
	}
}

// ParseBytes is the syntax of ParseConf's byte counts, its errors
// ErrBadOptions naming the input.
func TestParseBytes(t *testing.T) {
	n, err := ParseBytes(" 1.5GiB ")
	require.NoError(t, err)
	require.Equal(t, uint64(3<<29), n)
	for _, bad := range []string{"", "GiB", "1.5", "-1", "8X", "16777216TiB", "1.5.1GiB"} {
		_, err := ParseBytes(bad)
		require.ErrorIs(t, err, ErrBadOptions, bad)
		require.ErrorContains(t, err, fmt.Sprintf("%q", bad))
	}
}

// Every malformed string fails with ErrBadOptions, and the message names
// the key, or the item, at fault.
func TestParseConfRejects(t *testing.T) {
	for _, tc := range []struct{ in, names string }{
		{"backend", `"backend"`},
		{"backend:vmm,,caches:true", "empty item"},
		{"backend:vmm,", "empty item"},
		{":vmm", "empty key"},
		{"colour:blue", `"colour"`},
		{"Backend:vmm", `"Backend"`},
		{"backend:fast", `"backend"`},
		{"backend:vmm,backend:chunks", `"backend" given twice`},
		{"device:rocm", `"device"`},
		{"max_fraction:1.5", `"max_fraction"`},
		{"max_fraction:-0.1", `"max_fraction"`},
		{"grow_fraction:NaN", `"grow_fraction"`},
		{"initial_fraction:half", `"initial_fraction"`},
		{"release_fraction:", `"release_fraction"`},
		{"free_floor_fraction:Inf", `"free_floor_fraction"`},
		{"max_bytes:-1", `"max_bytes"`},
		{"max_bytes:1.5", `"max_bytes"`},
		{"max_bytes:12XB", `"max_bytes"`},
		{"max_bytes:GiB", `"max_bytes"`},
		{"max_bytes:18446744073709551616", `"max_bytes"`},
		{"max_bytes:99999999999TiB", `"max_bytes"`},
		{"max_bytes:16777216TiB", `"max_bytes"`},
		{"max_bytes:8X", `"max_bytes"`},
		{"max_bytes:1.2.3GiB", `"max_bytes"`},
		{"caches:yes", `"caches"`},
		{"passthrough:1", `"passthrough"`},
		{"guard:2GiB", "Guard"},
		{"history:-1", `"history"`},
		{"history:many", `"history"`},
		{"history_stacks:on", `"history_stacks"`},
		{"sim_capacity:1GiB", `"sim_capacity"`},
		{"device:sim,sim_capacity:lots", `"sim_capacity"`},
		{"device:sim,sim_capacity:2TiB", "at most"},
		{"device:sim,sim_capacity:1", "at least 2097152 bytes"},
		{"device:sim,sim_capacity:2097151", "at least"},
		{"initial_fraction:0.5,max_fraction:0.25", "InitialFraction"},
	} {
		c, err := ParseConf(tc.in)
		require.Error(t, err, tc.in)
		require.True(t, errors.Is(err, ErrBadOptions), "%q: %v", tc.in, err)
		require.Contains(t, err.Error(), tc.names, tc.in)
		require.Equal(t, Conf{}, c, tc.in)
	}
	// Options that conflict: the reason comes before the configuration
	// echoed, so that a message cut at the C ABI's 1 KiB keeps it.
	_, err := ParseConf("initial_fraction:0.5,max_fraction:0.25")
	require.Error(t, err)
	require.Less(t, strings.Index(err.Error(), "InitialFraction"), strings.Index(err.Error(), "configuration"), err.Error())
}

func FuzzParseConf(f *testing.F) {
	f.Add("backend:vmm,max_bytes:1GiB,caches:false")
	f.Add("device:sim,sim_capacity:0.5TB")
	f.Fuzz(func(t *testing.T, s string) {
		c, err := ParseConf(s)
		if err != nil {
			require.ErrorIs(t, err, ErrBadOptions)
			return
		}
		_, err = c.Options.withDefaults()
		require.NoError(t, err)
	})
}

// A long bad value is cut in the error, after the reason: the C ABI cuts
// messages at 1 KiB, and a value of 1600 "é" used to push the reason past
// the cut.
func TestABadConfigurationValueIsCutAfterTheReason(t *testing.T) {
	_, err := ParseConf("max_bytes:" + strings.Repeat("é", 1600))
	require.ErrorIs(t, err, ErrBadOptions)
	msg := err.Error()
	assert.Less(t, len(msg), 400, msg)
	assert.Contains(t, msg, "…", msg)
	assert.True(t, utf8.ValidString(msg), msg)
	reason := strings.Index(msg, "configuration key \"max_bytes\": ")
	value := strings.Index(msg, "value \"")
	require.GreaterOrEqual(t, reason, 0, msg)
	assert.Greater(t, value, reason+len("configuration key \"max_bytes\": "), "the reason comes before the value: %s", msg)
}
