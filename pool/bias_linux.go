//go:build linux && amd64 && !race

package pool

import "golang.org/x/sys/unix"

// biasable: the pool's lock may be biased (biasMutex), where the process
// barrier registers.
const biasable = true

// membarrier(2) commands (linux/membarrier.h).
const (
	membarrierPrivateExpedited         = 1 << 3
	membarrierRegisterPrivateExpedited = 1 << 4
)

// registerProcessBarrier registers the process for processBarrier
// (Linux 4.14 and later; a seccomp filter may refuse it).
func registerProcessBarrier() error {
	if _, _, e := unix.Syscall(unix.SYS_MEMBARRIER, membarrierRegisterPrivateExpedited, 0, 0); e != 0 {
		return e
	}
	return nil
}

// processBarrier makes every running thread of the process execute a
// full memory barrier before it returns: membarrier(2)'s
// MEMBARRIER_CMD_PRIVATE_EXPEDITED, by inter-processor interrupts to the
// CPUs running them (a thread not running passes one when it is
// scheduled).
var processBarrier = func() error {
	if _, _, e := unix.Syscall(unix.SYS_MEMBARRIER, membarrierPrivateExpedited, 0, 0); e != 0 {
		return e
	}
	return nil
}
