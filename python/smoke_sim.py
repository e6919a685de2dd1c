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


def raises(kind, f):
    try:
        f()
    except kind:
        return
    raise AssertionError("no %s" % kind.__name__)


# install() with a stand-in for torch (this machine may have none), in a
# process of its own whose TLSF_ALLOC_CONF is bad: ValueError at once,
# not a NULL from every tlsf_malloc later.
FAKE_TORCH_INSTALL = r"""
import sys, types
sys.path.insert(0, sys.argv[1])
torch, cuda, memory = types.ModuleType("torch"), types.ModuleType("torch.cuda"), types.ModuleType("torch.cuda.memory")
cuda.is_initialized = lambda: False
class Allocator:
    def __init__(self, path, malloc, free):
        pass
    def allocator(self):
        return None
memory.CUDAPluggableAllocator = Allocator
memory.change_current_allocator = lambda a: None
torch.cuda, cuda.memory = cuda, memory
sys.modules.update({"torch": torch, "torch.cuda": cuda, "torch.cuda.memory": memory})
import tlsf_torch
try:
    tlsf_torch.install(sys.argv[2])
except ValueError as e:
    assert "bogus" in str(e), e
    sys.exit(0)
sys.exit("install accepted a bad TLSF_ALLOC_CONF")
"""


def check_install_refuses_a_bad_environment(path):
    import subprocess

    env = dict(os.environ, TLSF_ALLOC_CONF="bogus:1")
    here = os.path.dirname(os.path.abspath(__file__))
    r = subprocess.run([sys.executable, "-c", FAKE_TORCH_INSTALL, here, path], env=env, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def main():
    # A library that is not libtlsf.so, or none: OSError, and nothing loaded.
    raises(OSError, lambda: tlsf_torch._load("libm.so.6"))
    raises(OSError, lambda: tlsf_torch._load("/no/such/libtlsf.so"))
    path = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else tlsf_torch.default_library())
    check_install_refuses_a_bad_environment(path)
    lib = tlsf_torch._load(path)
    raises(RuntimeError, lambda: tlsf_torch._load(path + ".other"))
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
    # One thread never contends for the pool's lock: the caches stay off
    # (tlsf_configure above leaves the default, caches:auto).
    assert st["caches_on"] == 0, st
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
    # Devices are integer ordinals 0 to 63; paths names or TLSF_PATH_*
    # numbers; call names str or bytes without a NUL.
    for bad in (1.5, True, 64, -1, "0"):
        raises(ValueError, lambda: tlsf_torch.stats(bad))
        raises(ValueError, lambda: tlsf_torch.trim(bad))
    assert tlsf_torch.device_calls(2, b"cuMemMap") == tlsf_torch.device_calls("alloc", "cuMemMap")
    assert tlsf_torch.device_calls(-1) == tlsf_torch.device_calls()
    raises(ValueError, lambda: tlsf_torch.device_calls(6))
    raises(ValueError, lambda: tlsf_torch.device_calls(True))
    raises(ValueError, lambda: tlsf_torch.device_calls(1.0))

    class Index:  # an integer type such as numpy.int64: paths take it as devices do
        def __index__(self):
            return 2

    assert tlsf_torch.device_calls(Index(), "cuMemMap") == tlsf_torch.device_calls("alloc", "cuMemMap")
    assert tlsf_torch.device_calls(b"alloc") == tlsf_torch.device_calls("alloc")
    raises(ValueError, lambda: tlsf_torch.device_calls(call="cuMemMap\0x"))
    text, abi = tlsf_torch.version()
    assert abi == tlsf_torch.ABI_VERSION and text.startswith("github.com/gpumem/tlsf ") and " abi=%d " % abi in text, (text, abi)
    assert tlsf_torch.last_error() == ""
    print("smoke_sim: ok", text, tlsf_torch.stats())


if __name__ == "__main__":
    main()
