// Package device is the CUDA driver API bound at run time, and a simulated
// GPU with the same interface.
//
// CUDA returns a Device backed by libcuda.so.1, loaded with purego on first
// use, so this module builds with CGO_ENABLED=0 and no CUDA toolkit. Sim is
// a deterministic stand-in for tests and CI: capacity shared between
// simulated processes, VMM emulation, a latency model, fault injection and
// optional shadow memory.
//
// The package knows nothing of TLSF or pools: it is the driver.
package device
