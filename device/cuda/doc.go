// Package cuda is the CUDA driver API bound at run time: a device.Device
// over libcuda.so.1, loaded with purego on first use, so the module builds
// with CGO_ENABLED=0 and no CUDA toolkit.
//
// Open(ordinal) retains a device's primary context; WithContext borrows a
// CUcontext made elsewhere (the CUDA runtime, gorgonia.org/cu, cgo code).
// Count and DriverVersion answer without opening a device. Every method
// pushes the device's context for its one driver call and pops it again,
// so a thread's context stack is left as it was (cuda.go explains why and
// what that costs). The stream-ordered allocator (cuMemAllocAsync,
// device.AsyncAllocator) is in cuda_async.go, the virtual memory
// management calls in cuda_vmm.go, the loader and the CUresult mapping in
// cuda_driver.go.
//
// Where no driver can be loaded, Open, Count and DriverVersion fail with
// an error wrapping device.ErrNoDriver that names libcuda.so.1; where the
// ordinal names no GPU, with device.ErrNoDevice.
package cuda
