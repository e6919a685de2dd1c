#!/usr/bin/env python3
"""Smoke test of tlsf_torch with PyTorch on a GPU: installs the pool as
PyTorch's allocator, runs a few tensor operations, and checks the
statistics (tlsf_stats, its device_calls_by_path, tlsf_get_device_calls)
and empty_cache. Skips (exit 0) without PyTorch or a CUDA device, fails
instead with TLSF_REQUIRE_GPU=1:

    python3 python/smoke_gpu.py bin/libtlsf.so
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlsf_torch  # noqa: E402


def skip(why, script="smoke_gpu"):
    """Exit 0 with why, or 1 with TLSF_REQUIRE_GPU=1."""
    if os.environ.get("TLSF_REQUIRE_GPU") == "1":
        print(script + ": FAIL: " + why + " (TLSF_REQUIRE_GPU=1)")
        sys.exit(1)
    print(script + ": skipped: " + why)
    sys.exit(0)


def torch_on_gpu(script="smoke_gpu"):
    """PyTorch with a CUDA device, else skip (as skip says)."""
    try:
        import torch
    except ImportError:
        skip("no PyTorch", script)
    if not torch.cuda.is_available():
        skip("no CUDA device", script)
    return torch


def main():
    torch = torch_on_gpu()
    lib = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else tlsf_torch.default_library())
    tlsf_torch.install(lib)

    a = torch.randn(4096, 4096, device="cuda")
    b = torch.randn(4096, 4096, device="cuda")
    c = a @ b
    small = [torch.ones(i + 1, device="cuda") for i in range(1000)]
    torch.cuda.synchronize()
    st = tlsf_torch.stats()
    assert st["allocated"] >= 3 * 4096 * 4096 * 4, st
    assert st["num_allocs"] >= 1003, st
    by_path = st["device_calls_by_path"]
    assert sum(by_path.values()) == st["device_calls"], st
    assert by_path["setup"] > 0 and by_path["alloc"] > 0, by_path
    assert tlsf_torch.device_calls() == st["device_calls"]
    assert tlsf_torch.device_calls("alloc", "cuMemMap") > 0
    assert st["caches_on"] in (0, 1), st  # 1 once PyTorch's threads contended for the pool's lock
    expect = (c[:2, :2].cpu(), (a[:2] @ b[:, :2]).cpu())
    assert torch.allclose(*expect, rtol=1e-3, atol=1e-3), expect

    held = st["allocated"]
    del a, b, c, small
    torch.cuda.synchronize()
    torch.cuda.empty_cache()  # the reset hook: tlsf_reset, a trim
    st = tlsf_torch.stats()
    # cuBLAS keeps its workspace (32 MiB on an H200) for the process's life.
    assert st["allocated"] <= held - 3 * 4096 * 4096 * 4, st
    assert st["reserved"] < held and st["released"] > 0, st
    assert st["device_calls_by_path"]["trim"] > 0, st
    print("smoke_gpu: ok", st)


if __name__ == "__main__":
    main()
