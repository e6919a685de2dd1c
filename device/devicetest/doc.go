// Package devicetest checks implementations of device.Device, as
// testing/fstest checks an fs.FS: Run is the conformance suite every
// implementation runs in its own tests (device/sim always, device/cuda on
// a GPU), and OpenGPU is the one skip-or-fail rule for tests that need a
// GPU.
//
// Run drives a Device through its interface alone, so the same function
// checks the CUDA binding on a real GPU and the simulated GPU. Keeping the
// two honest against one suite is what lets the pool's CI trust the
// simulator.
//
// What the suite may assume:
//   - Sizes stay at a few MiB, and everything allocated is freed, so it can
//     run on a GPU that other tests share.
//   - Only behaviour CUDA documents, or that the H200 was measured to show,
//     is asserted exactly (errors.Is on a sentinel). Where the driver's
//     error code for a misuse is not pinned down, the suite asserts only
//     that the call fails.
//   - Nothing that raises a sticky error (CUDA_ERROR_ILLEGAL_ADDRESS
//     destroys a real context): no accesses to freed or unmapped memory.
//     The simulator's own tests cover those.
//   - Contents are verified through MemcpyDtoH, so a simulated device under
//     test needs sim.Config.Shadow.
//   - MemGetInfo is compared before and after an allocation; another
//     process allocating at the same moment on the same GPU would make that
//     check flaky, which is accepted.
//
// GPU tests skip where no driver or device is found and fail instead when
// TLSF_REQUIRE_GPU=1 (RequireGPUEnv).
package devicetest
