package main

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// On the simulated device the planted stores run and, without a checker,
// only guard mode notices; it names the block and the byte.
func TestSanitizeOnSim(t *testing.T) {
	for _, be := range []string{backendVMM, backendChunks, backendPassthrough} {
		t.Run(be, func(t *testing.T) {
			out, errOut, status := cli(t, "sanitize", "--device", "sim", "--sim-capacity", "1GiB", "--backend", be, "--case", "all,guard,leak", "--size", "1000")
			require.Equal(t, exitOK, status, "stdout:\n%s\nstderr:\n%s", out, errOut)
			for _, c := range []string{"inside", "past-end", "after-free", "guard", "leak"} {
				require.Contains(t, out, "sanitize: "+c+":")
			}
			require.Contains(t, out, "sanitize: guard: caught: pool: memory corrupted: red zone overrun")
			require.Contains(t, out, "of 1000 bytes")
			require.Contains(t, out, "(0 past the end) is 0x5a, was 0xfd")
			require.NotContains(t, out, "FAILED")
		})
	}
}

func TestSanitizeBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--case", "sideways"},
		{"--backend", "async"},
		{"--size", "0"},
		{"--case", "guard", "--guard", "0"},
		{"--case", "guard", "--guard", "2MiB"},
	} {
		_, errOut, status := cli(t, append([]string{"sanitize", "--device", "sim"}, args...)...)
		require.Equal(t, exitUsage, status, strings.Join(args, " "))
		require.Contains(t, errOut, "tlsf-stress:")
	}
}
