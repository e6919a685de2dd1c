package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunDevicesCopiesBetweenSimulatedGPUs(t *testing.T) {
	for _, backend := range []string{backendVMM, backendChunks} {
		for _, devs := range []string{"0,1", "0", "1,0,2"} {
			t.Run(backend+"/"+devs, func(t *testing.T) {
				out, errs, status := cli(t, "run", "--device", "sim", "--sim-capacity", "4GiB", "--devices", devs,
					"--backend", backend, "--ops", "3000", "-g", "3", "--json", "--progress-interval", "0")
				require.Equal(t, 0, status, "stderr: %s\nstdout: %s", errs, out)
				var r peerResult
				require.NoError(t, json.Unmarshal([]byte(out), &r))
				assert.True(t, r.OK)
				assert.Zero(t, r.ProblemCount)
				assert.Equal(t, r.Allocs, r.Frees)
				assert.Positive(t, r.Copies)
				assert.Equal(t, r.Copies, r.VerifiedBlocks, "every copy read back")
				n := len(strings.Split(devs, ","))
				assert.Len(t, r.PerDevice, n)
				if n > 1 {
					assert.Equal(t, r.Copies, r.PeerCopies, "every copy crosses devices")
					for _, d := range r.PerDevice {
						assert.Len(t, d.PeerAccess, n-1)
					}
				} else {
					assert.Zero(t, r.PeerCopies)
				}
			})
		}
	}
}

func TestRunDevicesUsageErrors(t *testing.T) {
	for _, args := range [][]string{
		{"--devices", "0,0"},
		{"--devices", "x"},
		{"--devices", "64"},
		{"--devices", "0,1", "--backend", "async"},
	} {
		_, _, status := cli(t, append([]string{"run", "--device", "sim", "--ops", "10"}, args...)...)
		assert.Equal(t, 2, status, "%v", args)
	}
}
