#!/usr/bin/env python3
"""Smoke test of tlsf_torch's ctypes side without PyTorch or a GPU: loads
libtlsf.so on the simulated device and checks that the stats struct matches
capi/tlsf.h, and the error contract. Run by make capi-example:

    python3 python/smoke_sim.py bin/libtlsf.so
"""
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tlsf_torch  # noqa: E402


def main():
    lib = tlsf_torch._load(os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else tlsf_torch.default_library()))
    assert lib.tlsf_configure(b"device:sim,max_bytes:1.5x") == -1
    assert "max_bytes" in tlsf_torch.last_error(), tlsf_torch.last_error()
    assert lib.tlsf_configure(b"device:sim,sim_capacity:1GiB") == 0, tlsf_torch.last_error()
    lib.tlsf_malloc.restype = ctypes.c_void_p
    lib.tlsf_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
    lib.tlsf_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]

    p = lib.tlsf_malloc(3 << 20, 0, None)
    assert p, tlsf_torch.last_error()
    s = tlsf_torch.TlsfStats()
    s.size = ctypes.sizeof(s)
    assert lib.tlsf_get_stats(0, ctypes.byref(s)) == 0, tlsf_torch.last_error()
    assert s.size == ctypes.sizeof(s), "TlsfStats is %d bytes, the library's tlsf_stats %d" % (ctypes.sizeof(s), s.size)
    st = tlsf_torch.stats()
    assert st["allocated"] >= 3 << 20 and st["num_allocs"] == 1, st
    assert not lib.tlsf_malloc(2 << 30, 0, None)
    assert "out of memory" in tlsf_torch.last_error(), tlsf_torch.last_error()
    assert tlsf_torch.stats()["num_ooms"] == 1
    lib.tlsf_free(p, 3 << 20, 0, None)
    assert tlsf_torch.last_error() == ""
    lib.tlsf_free(p, 3 << 20, 0, None)
    assert "double free" in tlsf_torch.last_error(), tlsf_torch.last_error()
    assert tlsf_torch.trim() > 0
    st = tlsf_torch.stats()
    assert st["reserved"] == 0 and st["released"] > 0, st
    by_path = st["device_calls_by_path"]
    assert sum(by_path.values()) == st["device_calls"], st
    assert by_path["setup"] > 0 and by_path["alloc"] > 0 and by_path["trim"] > 0, by_path
    assert tlsf_torch.device_calls() == st["device_calls"]
    assert tlsf_torch.device_calls("trim") == by_path["trim"]
    maps = [tlsf_torch.device_calls(p, "cuMemMap") for p in tlsf_torch.TlsfStats.PATHS]
    assert sum(maps) == tlsf_torch.device_calls(call="cuMemMap") > 0, maps
    for bad in (lambda: tlsf_torch.device_calls("nowhere"), lambda: tlsf_torch.device_calls(call="cuMemMapp")):
        try:
            bad()
        except (ValueError, RuntimeError):
            pass
        else:
            raise AssertionError("a bad path or entry point was accepted")
    print("smoke_sim: ok", tlsf_torch.stats())


if __name__ == "__main__":
    main()
