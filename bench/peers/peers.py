#!/usr/bin/env python3
"""Every allocator replays the same traces side by side, on one GPU, in one run.

peers.py drives the peers harness (run.sh calls it; README.md in this
directory says how to run it). The parent process (`run`) exports each trace
to an op list with `tlsf-stress export`, builds two small extensions with
torch.utils.cpp_extension.load_inline (replay.cpp: the replay loop and most
adapters; cub.cu: CUB), then starts one child process (`child`) per allocator
and trace, one at a time, so that every allocator starts fresh and settings
that are process-wide (PYTORCH_CUDA_ALLOC_CONF, tlsf_configure) stay apart.
Each child replays the op list through the same C++ loop: once cold, then
--reps times warm, measures peak reserved memory, and finds by bisection the
smallest cap under which the trace replays with no failed allocation. The
pool is also replayed natively from Go (`tlsf-stress replay --json`). The
parent writes OUT/results.json and OUT/RESULTS.md; every child's stderr is
kept in OUT/logs. One allocator failing (a missing libtlsf.so, a CUB that
does not compile, a crash, a timeout) costs only its rows.

Only the standard library is imported at the top: torch is imported in the
children and the build processes only.
"""

import argparse
import ctypes
import datetime
import hashlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MIB = 1 << 20
GIB = 1 << 30

# Bisection stops when the bracket [fails, works] is narrower than this
# fraction of peak live bytes (0.1%, the resolution) ...
CAP_RESOLUTION = 0.001
# ... or after this many probes (the bracket starts at most about 1.0 wide:
# log2(1.0 / 0.001) = 10 halvings, plus the probes that check both ends).
MAX_PROBES = 16
# Warm replays per allocator and trace (the issue asks for at least 10).
WARM_REPS = 10
# Untimed replays after the cold one, until the child has spent this many
# seconds in them (at least one), as tlsf-stress does before its warm
# replays (internal/replay.WarmUp): the first second of a process's replays
# ran up to 1.7x slower than later ones on the development machine.
WARM_UP_S = 1.0
# A child stops its warm replays early (keeping at least MIN_REPS) and its
# bisection when its own time budget is spent.
MIN_REPS = 3

# The allocators, in the order they are run (ours and the fast peers first,
# so that a run cut short by the deadline loses the slow ones). kind picks
# the adapter; env is set for the child only; cap says whether the
# allocator has a cap to bisect.
ALLOCATORS = [
    {"name": "tlsf-vmm", "kind": "cabi", "conf": "backend:vmm", "ours": True, "cap": True,
     "desc": "this pool, VMM backend, through the C ABI (libtlsf.so)"},
    {"name": "torch", "kind": "torch", "env": {"PYTORCH_CUDA_ALLOC_CONF": None}, "cap": True,
     "desc": "PyTorch's caching allocator (raw_alloc_with_stream / raw_delete)"},
    {"name": "torch+expandable", "kind": "torch",
     "env": {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "cap": True,
     "desc": "the same with expandable_segments:True"},
    {"name": "async", "kind": "async", "cap": True,
     "desc": "cudaMallocAsync, release threshold at the maximum (caps: cudaMemPoolCreate maxSize)"},
    {"name": "tlsf-chunks", "kind": "cabi", "conf": "backend:chunks", "ours": True, "cap": True,
     "desc": "this pool, chunks backend, through the C ABI (libtlsf.so)"},
    {"name": "cub_pow2", "kind": "cub", "growth": 2, "cap": False,
     "desc": "CUB CachingDeviceAllocator, bin growth 2 (512 B to 64 GiB bins, cache unlimited)"},
    {"name": "cuda", "kind": "cuda", "cap": False, "desc": "plain cudaMalloc / cudaFree"},
    {"name": "cub_default", "kind": "cub", "growth": 0, "cap": False,
     "desc": "CUB CachingDeviceAllocator, default bins (growth 8, 512 B to 2 MiB, 6 MiB cached)"},
]
# Ours natively from Go, by tlsf-stress backend.
GO_BACKENDS = [("tlsf-vmm-go", "tlsf-vmm"), ("tlsf-chunks-go", "tlsf-chunks")]
GO_DESC = "this pool natively from Go (tlsf-stress replay --json --warm-runs), backend "


def log(*a):
    print("peers:", *a, file=sys.stderr, flush=True)


def build_dir(base, which):
    d = os.path.join(base, which)
    os.makedirs(d, exist_ok=True)
    return d


def read(name):
    with open(os.path.join(HERE, name)) as f:
        return f.read()


def adapter_h():
    # adapter.h is prepended to a source, where '#pragma once' would warn.
    return "".join(l for l in read("adapter.h").splitlines(True) if not l.startswith("#pragma once"))


EXT_NAMES = {"main": "tlsf_peers_replay", "cub": "tlsf_peers_cub"}


def load_ext(which, base, verbose=False, build=False):
    """Returns extension which ("main": replay.cpp; "cub": cub.cu and
    cub_bind.cpp), built in base/which. The build step (build=True) uses
    torch.utils.cpp_extension.load_inline, or, where that fails (no ninja,
    say), compiles the same sources directly with the host compiler and
    nvcc (build_direct), and writes which way to base/which/METHOD; the
    children load it the same way, so they only load what is there."""
    d = build_dir(base, which)
    method_file = os.path.join(d, "METHOD")
    method = "load_inline"
    if not build and os.path.exists(method_file):
        with open(method_file) as f:
            method = f.read().strip()
    if method == "direct":
        return import_so(EXT_NAMES[which], os.path.join(d, "direct", EXT_NAMES[which] + ".so"))
    try:
        m = load_inline_ext(which, d, verbose)
    except Exception as e:
        if not build:
            raise
        print("peers: load_inline failed (%s); compiling directly" % str(e)[-500:], file=sys.stderr, flush=True)
        so = build_direct(which, d)
        m = import_so(EXT_NAMES[which], so)
        method = "direct"
    if build:
        with open(method_file, "w") as f:
            f.write(method + "\n")
    return m


def load_inline_ext(which, d, verbose):
    from torch.utils.cpp_extension import load_inline

    if which == "main":
        return load_inline(
            name=EXT_NAMES[which],
            cpp_sources=[adapter_h() + "\n" + read("replay.cpp")],
            with_cuda=True,
            extra_cflags=["-O2"],
            build_directory=d,
            verbose=verbose,
        )
    return load_inline(
        name=EXT_NAMES[which],
        cpp_sources=[read("cub_bind.cpp")],
        cuda_sources=[adapter_h() + "\n" + read("cub.cu")],
        extra_cflags=["-O2"],
        extra_cuda_cflags=["-O2"],
        build_directory=d,
        verbose=verbose,
    )


def import_so(name, path):
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(name, path)
    spec = importlib.util.spec_from_file_location(name, path, loader=loader)
    m = importlib.util.module_from_spec(spec)
    loader.exec_module(m)
    return m


def build_direct(which, d):
    """Compiles extension which into d/direct/NAME.so with c++ (and nvcc
    for CUB), without ninja: the sources include only pybind11, c10 and
    CUDA headers, so torch's include directory, CUDA's and Python's are
    enough. Returns the path of the .so; raises on a failed command."""
    import sysconfig

    import torch
    from torch.utils import cpp_extension

    out = os.path.join(d, "direct")
    os.makedirs(out, exist_ok=True)
    name = EXT_NAMES[which]
    tdir = os.path.dirname(torch.__file__)
    cuda = cpp_extension.CUDA_HOME or "/usr/local/cuda"
    inc = [os.path.join(tdir, "include"), os.path.join(tdir, "include", "torch", "csrc", "api", "include"),
           os.path.join(cuda, "include"), sysconfig.get_paths()["include"]]
    libs = [os.path.join(tdir, "lib"), os.path.join(cuda, "lib64"), os.path.join(cuda, "lib")]
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    cflags = ["-O2", "-std=c++17", "-fPIC", "-D_GLIBCXX_USE_CXX11_ABI=%d" % abi, "-DTORCH_EXTENSION_NAME=" + name]
    cflags += ["-I" + i for i in inc]
    ldflags = ["-shared"] + ["-L" + l for l in libs] + ["-Wl,-rpath," + l for l in libs]
    cxx = os.environ.get("CXX", "c++")

    def run(cmd):
        print("peers: " + " ".join(cmd), file=sys.stderr, flush=True)
        subprocess.run(cmd, check=True)

    so = os.path.join(out, name + ".so")
    if which == "main":
        src = os.path.join(out, "main.cpp")
        with open(src, "w") as f:
            f.write(adapter_h() + "\n" + read("replay.cpp"))
        run([cxx] + cflags + [src, "-o", so] + ldflags + ["-lc10_cuda", "-lc10", "-lcudart"])
        return so
    cu, bind = os.path.join(out, "cub.cu"), os.path.join(out, "cub_bind.cpp")
    with open(cu, "w") as f:
        f.write(adapter_h() + "\n" + read("cub.cu"))
    with open(bind, "w") as f:
        f.write(read("cub_bind.cpp"))
    nvcc = os.path.join(cuda, "bin", "nvcc")
    run([nvcc if os.path.exists(nvcc) else "nvcc", "-O2", "-std=c++17", "-Xcompiler", "-fPIC",
         "-c", cu, "-o", os.path.join(out, "cub.o")])
    run([cxx] + cflags + [bind, os.path.join(out, "cub.o"), "-o", so] + ldflags + ["-lcudart"])
    return so


# ---------------------------------------------------------------- children


class TlsfStats(ctypes.Structure):
    """struct tlsf_stats of capi/tlsf.h."""

    _fields_ = [(n, ctypes.c_uint64 if n != "size" else ctypes.c_size_t) for n in (
        "size", "allocated", "reserved", "active", "cached", "peak_allocated", "peak_reserved",
        "num_allocs", "num_frees", "num_ooms", "device_calls", "cap")]


class Impl:
    """One allocator in a child: its adapter for the timed replays, its
    peak reserved bytes, and (where it has a cap) a probe under a cap."""

    can_cap = False
    peak_source = ""

    def version(self):
        return ""

    def peak_reserved(self):
        return None

    def probe(self, cap):
        """Replays once on a fresh allocator under cap bytes; returns
        (ok, the cap in force in bytes)."""
        raise NotImplementedError

    def close(self):
        pass


class TorchImpl(Impl):
    can_cap = True
    peak_source = "torch.cuda.max_memory_reserved()"

    def __init__(self, ext, ops, torch):
        self.ext, self.ops, self.torch = ext, ops, torch
        self.total = torch.cuda.mem_get_info()[1]
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        self.adapter = ext.torch_adapter()

    def version(self):
        return "torch " + self.torch.__version__

    def peak_reserved(self):
        return self.torch.cuda.max_memory_reserved()

    def probe(self, cap):
        t = self.torch
        t.cuda.empty_cache()
        t.cuda.set_per_process_memory_fraction(min(1.0, cap / self.total))
        r = self.ext.replay(self.ops, self.adapter)
        t.cuda.empty_cache()
        t.cuda.set_per_process_memory_fraction(1.0)
        return r["failed"] == 0, cap


class AsyncImpl(Impl):
    can_cap = True
    peak_source = "cudaMemPoolAttrReservedMemHigh"

    def __init__(self, ext, ops):
        self.ext, self.ops = ext, ops
        self.pool = ext.async_pool(0)
        ext.async_pool_reset_peaks(self.pool)
        self.adapter = ext.async_adapter(self.pool)

    def version(self):
        v = self.ext.versions()
        return "CUDA driver API %d, runtime %d" % (v["cuda_driver_api"], v["cuda_runtime"])

    def peak_reserved(self):
        return self.ext.async_pool_stats(self.pool)["peak_reserved"]

    def probe(self, cap):
        self.ext.async_pool_destroy(self.pool)  # the default pool: trimmed, not destroyed
        cap = -(-cap // (2 * MIB)) * (2 * MIB)  # maxSize in whole 2 MiB pages
        pool = self.ext.async_pool(cap)
        try:
            r = self.ext.replay(self.ops, self.ext.async_adapter(pool))
        finally:
            self.ext.async_pool_destroy(pool)
        return r["failed"] == 0, cap


class CabiImpl(Impl):
    """This pool through its C ABI, loaded with dlopen (ctypes.CDLL)."""

    can_cap = True
    peak_source = "tlsf_get_stats peak_reserved"

    def __init__(self, ext, ops, torch, lib_path, conf):
        self.ext, self.ops, self.path = ext, ops, lib_path
        if not os.path.exists(lib_path):
            raise RuntimeError("%s not found: build it with `make bench-gpu` (needs the capi package)" % lib_path)
        lib = ctypes.CDLL(lib_path)
        self.lib = lib
        lib.tlsf_last_error.restype = ctypes.c_char_p
        lib.tlsf_configure.argtypes = [ctypes.c_char_p]
        lib.tlsf_configure.restype = ctypes.c_int
        lib.tlsf_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(TlsfStats)]
        lib.tlsf_get_stats.restype = ctypes.c_int
        lib.tlsf_trim.argtypes = [ctypes.c_int]
        lib.tlsf_trim.restype = ctypes.c_size_t
        lib.tlsf_set_memory_fraction.argtypes = [ctypes.c_double, ctypes.c_int]
        lib.tlsf_set_memory_fraction.restype = None
        # TLSF_PEERS_CONF adds key:value pairs (device:sim checks the
        # harness against the real library without a GPU: selftest.sh).
        extra = os.environ.get("TLSF_PEERS_CONF", "")
        conf = conf + ("," + extra if extra else "")
        if lib.tlsf_configure(conf.encode()) != 0:
            raise RuntimeError("tlsf_configure(%r): %s" % (conf, self.last_error()))
        if hasattr(lib, "tlsf_init"):
            lib.tlsf_init.argtypes = [ctypes.c_int]
            lib.tlsf_init.restype = None
            lib.tlsf_init(0)
        self.total = torch.cuda.mem_get_info()[1]
        self.cap_note = ""
        # Make device 0's pool before the cold replay, as the peers'
        # allocators are made before theirs: pools are made by the first
        # tlsf_malloc, so allocate a byte, free it and trim.
        lib.tlsf_malloc.argtypes = [ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.tlsf_malloc.restype = ctypes.c_void_p
        lib.tlsf_free.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
        lib.tlsf_free.restype = None
        p = lib.tlsf_malloc(1, 0, None)
        if not p:
            raise RuntimeError("tlsf_malloc(1) on device 0: " + self.last_error())
        lib.tlsf_free(p, 1, 0, None)
        lib.tlsf_trim(0)
        addr = lambda f: ctypes.cast(f, ctypes.c_void_p).value
        self.adapter = ext.cabi_adapter(addr(lib.tlsf_malloc), addr(lib.tlsf_free), addr(lib.tlsf_last_error), 0)

    def last_error(self):
        m = self.lib.tlsf_last_error()
        return m.decode(errors="replace") if m else ""

    def stats(self):
        st = TlsfStats()
        st.size = ctypes.sizeof(TlsfStats)
        if self.lib.tlsf_get_stats(0, ctypes.byref(st)) != 0:
            raise RuntimeError("tlsf_get_stats: " + self.last_error())
        return st

    def version(self):
        v = ""
        if hasattr(self.lib, "tlsf_version"):  # the build's own account (capi/tlsf.h)
            self.lib.tlsf_version.argtypes = [ctypes.c_void_p]
            self.lib.tlsf_version.restype = ctypes.c_char_p
            v = self.lib.tlsf_version(None).decode(errors="replace") + "; "
        p = os.path.join(os.path.dirname(self.path), "VERSION")
        if os.path.exists(p):
            with open(p) as f:
                v = f.read().strip() + " "
        with open(self.path, "rb") as f:
            return v + "libtlsf.so sha256 " + hashlib.sha256(f.read()).hexdigest()[:12]

    def peak_reserved(self):
        return self.stats().peak_reserved

    def set_cap(self, cap):
        """Sets the cap to about cap bytes with tlsf_set_memory_fraction
        and returns the cap the pool reports (tlsf_stats.cap), whatever
        the fraction is a fraction of."""
        f = cap / self.total
        for _ in range(3):
            self.lib.tlsf_set_memory_fraction(f, 0)
            got = self.stats().cap
            if got == 0:
                # No cap in the statistics: take the fraction as PyTorch's
                # (of total memory), and say so.
                self.cap_note = ("tlsf_stats.cap stayed 0 after tlsf_set_memory_fraction: "
                                 "caps taken as fraction x total memory")
                return int(f * self.total)
            if abs(got - cap) <= cap * CAP_RESOLUTION / 10:
                break
            f *= cap / got
        return got

    def probe(self, cap):
        self.lib.tlsf_trim(0)
        got = self.set_cap(cap)
        r = self.ext.replay(self.ops, self.adapter)
        self.lib.tlsf_trim(0)
        return r["failed"] == 0, got

    def close(self):
        self.lib.tlsf_set_memory_fraction(1.0, 0)
        self.lib.tlsf_trim(0)


class SampledImpl(Impl):
    """An allocator with no statistics of its own (cudaMalloc, CUB): its
    peak reserved bytes are measured by one more replay on a fresh
    allocator that reads cudaMemGetInfo after every allocation."""

    peak_source = "cudaMemGetInfo after every allocation, one more replay on a fresh allocator"

    def __init__(self, ext, ops, make, destroy, version):
        self.ext, self.ops, self.make, self.destroy, self.ver = ext, ops, make, destroy, version
        self.adapter = make()

    def version(self):
        return self.ver

    def peak_reserved(self):
        if self.destroy:
            self.destroy(self.adapter)
        self.ext.synchronize()
        base = self.ext.device_used()
        self.adapter = self.make()
        r = self.ext.replay(self.ops, self.adapter, True)
        return max(0, r["peak_device_used"] - base)

    def close(self):
        if self.destroy:
            self.destroy(self.adapter)


def bisect_cap(impl, live, hi, deadline, max_probes):
    """Finds the smallest cap (bytes) under which a fresh allocator replays
    the trace with no failed allocation, to CAP_RESOLUTION of live bytes,
    between live (taken as failing) and hi (raised while it fails). It
    assumes, as every such search does, that a cap that works keeps working
    when raised. Returns a dict of min_cap_* fields."""
    out = {"min_cap_probes": 0}
    probes = []

    def probe(cap):
        ok, got = impl.probe(int(cap))
        probes.append({"cap_bytes": int(got), "ok": ok})
        out["min_cap_probes"] = len(probes)
        return ok, got

    # A cap below peak live bytes must fail; if it does not, the cap is
    # not enforced and no bisection can mean anything.
    ok, got = probe(live * 0.95)
    if ok:
        out["min_cap_note"] = "cap not enforced: a cap of 0.95 x peak live bytes replayed with no failure"
        out["min_cap_trace"] = probes
        return out
    lo = live
    ok, got = probe(hi)
    raised = 0
    while not ok and raised < 3 and time.monotonic() < deadline:
        hi = int(hi * 1.25)
        raised += 1
        ok, got = probe(hi)
    if not ok:
        out["min_cap_note"] = "no cap up to %.3f x peak live worked" % (hi / live)
        out["min_cap_trace"] = probes
        return out
    best = got
    cut = ""
    while (hi - lo) > CAP_RESOLUTION * live:
        if len(probes) >= max_probes:
            cut = "stopped after %d probes" % len(probes)
            break
        if time.monotonic() > deadline:
            cut = "stopped at the child's time budget after %d probes" % len(probes)
            break
        mid = (lo + hi) // 2
        ok, got = probe(mid)
        if ok:
            hi, best = mid, got
        else:
            lo = mid
    out.update({
        "min_cap_bytes": int(best),
        "min_cap_over_live": best / live,
        "min_cap_resolution": (hi - lo) / live,
        "min_cap_trace": probes,
    })
    if cut:
        out["min_cap_note"] = cut + ", to %.2f%% of peak live" % (100 * (hi - lo) / live)
    return out


def cmd_child(a):
    t0 = time.monotonic()
    deadline = t0 + a.budget
    spec = next(s for s in ALLOCATORS if s["name"] == a.alloc)
    res = {"allocator": spec["name"], "desc": spec["desc"], "ok": False, "notes": []}
    import torch

    torch.cuda.init()
    torch.cuda.set_device(0)
    ext = load_ext("main", a.build)
    ops = ext.load_ops(a.ops)
    info = ext.ops_info(ops)
    live = info["peak_live_bytes"]
    res.update({"ops_total": info["ops"], "peak_live_bytes": live})
    kind = spec["kind"]
    if kind == "torch":
        impl = TorchImpl(ext, ops, torch)
    elif kind == "async":
        impl = AsyncImpl(ext, ops)
    elif kind == "cabi":
        impl = CabiImpl(ext, ops, torch, a.lib, spec["conf"])
    elif kind == "cuda":
        v = ext.versions()
        impl = SampledImpl(ext, ops, ext.cuda_adapter, None, "CUDA runtime %d" % v["cuda_runtime"])
    elif kind == "cub":
        cub = load_ext("cub", a.build)
        g = spec["growth"]
        impl = SampledImpl(ext, ops, lambda: cub.cub_create(g), cub.cub_destroy, "CUB %d" % cub.cub_version())
    else:
        raise ValueError(kind)
    res["version"] = impl.version()

    cold = ext.replay(ops, impl.adapter)
    res["ops"] = cold["ops"]
    res["cold_ns_per_op"] = cold["ns_per_op"]
    res["cold_failed"] = cold["failed"]
    if cold["first_error"]:
        res["first_error"] = cold["first_error"]
    # Keep time for the bisection: warm replays get at most half the budget.
    warm_deadline = t0 + a.budget / 2 if (impl.can_cap and a.bisect) else deadline
    # At least one, unless the warm replays' deadline has passed already (a
    # slow peer's timed replays then come first); its failed allocations
    # are counted apart.
    wu0 = time.monotonic()
    res["warm_up_reps"], res["warm_up_failed"] = 0, 0
    while (res["warm_up_reps"] == 0 or time.monotonic() - wu0 < WARM_UP_S) and time.monotonic() < warm_deadline:
        r = ext.replay(ops, impl.adapter)
        res["warm_up_reps"] += 1
        res["warm_up_failed"] += r["failed"]
    warm, failed = [], 0
    for i in range(a.reps):
        if i >= MIN_REPS and time.monotonic() > warm_deadline:
            res["notes"].append("warm replays cut to %d of %d by the time budget" % (i, a.reps))
            break
        r = ext.replay(ops, impl.adapter)
        warm.append(r["ns_per_op"])
        failed += r["failed"]
        if r["first_error"] and "first_error" not in res:
            res["first_error"] = r["first_error"]
    res["warm_reps"] = len(warm)
    res["warm_ns_per_op_median"] = statistics.median(warm) if warm else None
    res["warm_ns_per_op_min"] = min(warm) if warm else None
    res["warm_ns_per_op_all"] = warm
    res["warm_failed"] = failed
    pk = impl.peak_reserved()
    res["peak_reserved_bytes"] = pk
    res["peak_reserved_source"] = impl.peak_source
    res["peak_reserved_over_live"] = pk / live if pk and live else None
    if impl.can_cap and a.bisect:
        # An interim line, which the parent keeps if the bisection
        # outlives the child's time limit.
        interim = dict(res, ok=res["cold_failed"] == 0 and failed == 0,
                       notes=res["notes"] + ["bisection cut: the child's time limit killed it"])
        print(json.dumps(interim), flush=True)
        hi = max(pk or 0, live) * 1.002 + 2 * MIB
        try:
            res.update(bisect_cap(impl, live, int(hi), deadline, a.max_probes))
        except Exception as e:  # the measurements above stand
            res["min_cap_note"] = "bisection failed: %s" % e
            print("peers: bisection failed:", repr(e), file=sys.stderr)
        if getattr(impl, "cap_note", ""):
            res["notes"].append(impl.cap_note)
    elif impl.can_cap:
        res["notes"].append("no bisection (--quick or --no-bisect)")
    impl.close()
    res["ok"] = res["cold_failed"] == 0 and failed == 0
    if not res["ok"]:
        res["notes"].append("allocations failed without a cap")
    res["seconds"] = time.monotonic() - t0
    print(json.dumps(res), flush=True)


def cmd_build(a):
    t0 = time.monotonic()
    try:
        m = load_ext(a.which, a.build, verbose=True, build=True)
        extra = {"cub_version": m.cub_version()} if a.which == "cub" else {}
        print(json.dumps({"ok": True, "seconds": time.monotonic() - t0, **extra}), flush=True)
    except Exception as e:  # reported to the parent, which goes on without it
        print(json.dumps({"ok": False, "seconds": time.monotonic() - t0, "error": str(e)[-2000:]}), flush=True)
        sys.exit(1)


def cmd_info(a):
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__,
            "torch_cuda": torch.version.cuda, "cpu_cores": os.cpu_count(),
            "cpu": platform.processor() or platform.machine(), "host": platform.node()}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    p = torch.cuda.get_device_properties(0)
    info.update({"gpu": p.name, "gpu_memory_bytes": p.total_memory,
                 "gpu_capability": "%d.%d" % (p.major, p.minor)})
    try:
        ext = load_ext("main", a.build)
        info.update(ext.versions())
    except Exception as e:
        info["versions_error"] = str(e)[-500:]
    print(json.dumps(info), flush=True)


# ------------------------------------------------------------------ parent


def sh(cmd):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout.strip()
    except Exception as e:
        return "(%s: %s)" % (cmd[0], e)


def run_child(argv, log_path, timeout, env=None):
    """Runs argv, stdout captured, stderr into log_path; returns (exit
    status, last JSON line of stdout or None, error text)."""
    with open(log_path, "w") as err:
        try:
            p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, timeout=max(5, timeout), env=env)
        except subprocess.TimeoutExpired as e:
            so = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            return 124, last_json(so), "timed out after %.0f s" % timeout
    obj = last_json(p.stdout)
    msg = ""
    if p.returncode != 0 or obj is None:
        try:
            with open(log_path) as f:
                lines = [l.rstrip() for l in f if l.strip()]
            msg = " | ".join(lines[-3:])[-600:]
        except OSError:
            pass
        msg = "exit status %d%s" % (p.returncode, ": " + msg if msg else "")
    return p.returncode, obj, msg


def last_json(text):
    """The last line of text that is a JSON object, decoded, or None."""
    for line in reversed(text.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                return json.loads(line)
            except ValueError:
                pass
    return None


def child_env(spec):
    env = dict(os.environ)
    for k, v in (spec.get("env") or {}).items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    return env


def cmd_run(a):
    t0 = time.monotonic()
    deadline = t0 + a.budget
    out = os.path.abspath(a.out)
    logs = os.path.join(out, "logs")
    opsdir = os.path.join(out, "ops")
    os.makedirs(logs, exist_ok=True)
    os.makedirs(opsdir, exist_ok=True)
    bin_dir = os.path.abspath(a.bin)
    stress = os.path.join(bin_dir, "tlsf-stress")
    lib = os.path.join(bin_dir, "libtlsf.so")
    traces = a.traces or ["lstm", "resnet50", "tdnn"]
    reps, bisect = a.reps, not a.no_bisect
    if a.quick:
        traces, reps, bisect = traces[:1], min(reps, 3), False
    only = set(a.only.split(",")) if a.only else None
    results = {
        "generated": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(sys.argv),
        "quick": a.quick, "warm_reps": reps, "bisection": bisect,
        "cap_resolution": CAP_RESOLUTION, "max_probes": a.max_probes, "budget_s": a.budget,
        "allocators": {s["name"]: s["desc"] for s in ALLOCATORS},
        "traces": [], "results": [], "cuts": [], "failures": [],
    }
    for name, be in GO_BACKENDS:
        results["allocators"][name] = GO_DESC + be
    me = [sys.executable, os.path.abspath(__file__)]

    def save():
        results["seconds"] = time.monotonic() - t0
        with open(os.path.join(out, "results.json"), "w") as f:
            json.dump(results, f, indent=1)
        with open(os.path.join(out, "RESULTS.md"), "w") as f:
            f.write(markdown(results))

    # 1. The traces as op lists.
    log("exporting", " ".join(traces))
    p = subprocess.run([stress, "export", "-o", opsdir] + traces, capture_output=True, text=True)
    if p.returncode != 0:
        results["failures"].append("tlsf-stress export failed: " + p.stderr.strip()[-1000:])
        save()
        log(results["failures"][-1])
        return 1
    for line in p.stdout.splitlines():
        results["traces"].append(json.loads(line))
    arg_of = dict(zip([t["trace"] for t in results["traces"]], traces))

    # 2. The machine, and both extensions, built at once.
    machine = {"nvidia_smi": sh(["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"]),
               "nvcc": (sh(["nvcc", "--version"]).splitlines() or [""])[-1] if shutil.which("nvcc") else "(no nvcc)",
               "nproc": os.cpu_count(), "kernel": platform.release()}
    results["machine"] = machine
    log("building the extensions in", a.build)
    env = dict(os.environ)
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 4))
    builds = {}
    for which in ("main", "cub"):
        f = open(os.path.join(logs, "build-%s.log" % which), "w")
        builds[which] = (subprocess.Popen(me + ["build", "--which", which, "--build", a.build],
                                          stdout=subprocess.PIPE, stderr=f, text=True, env=env), f)
    built = {}
    for which, (proc, f) in builds.items():
        try:
            so, _ = proc.communicate(timeout=max(10, min(a.build_timeout, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            proc.kill()
            so = ""
        f.close()
        line = (so.strip().splitlines() or ["{}"])[-1]
        try:
            built[which] = json.loads(line)
        except ValueError:
            built[which] = {"ok": False}
        if not built[which].get("ok"):
            results["failures"].append("building the %s extension failed (logs/build-%s.log): %s"
                                       % (which, which, built[which].get("error", "see the log")[-300:]))
    results["build"] = built
    if built["main"].get("ok"):
        st, info, msg = run_child(me + ["info", "--build", a.build], os.path.join(logs, "info.log"), 120)
        machine.update(info or {"info_error": msg})
    save()

    # 3. Every allocator on every trace, one process each.
    jobs = []
    for spec in ALLOCATORS:
        if only and spec["name"] not in only:
            continue
        for t in results["traces"]:
            jobs.append((spec, t))
    go_jobs = [t for t in results["traces"]] if (not only or only & {n for n, _ in GO_BACKENDS}) else []
    # Time left is shared out per job, the Go replays counting as one job
    # per trace and backend. The Go replays run before the slow peers
    # (cudaMalloc, CUB default), so that a run cut short loses those.
    slow = {"cuda", "cub_default"}
    go_at = next((i for i, (spec, _) in enumerate(jobs) if spec["name"] in slow), len(jobs))
    for i, job in enumerate(jobs + [None]):
        spec, t = job if job else (None, None)
        if i == go_at and go_jobs:
            run_go(a, results, go_jobs, arg_of, stress, bin_dir, reps, bisect, deadline, out, logs, save)
        if spec is None:
            break
        name = "%s on %s" % (spec["name"], t["trace"])
        left = deadline - time.monotonic() - 15
        n_left = len(jobs) - i + (2 * len(go_jobs) if i < go_at else 0)
        if not built["main"].get("ok"):
            results["results"].append({"allocator": spec["name"], "trace": t["trace"], "ok": False,
                                       "error": "the replay extension did not build"})
            continue
        if spec["kind"] == "cub" and not built["cub"].get("ok"):
            results["results"].append({"allocator": spec["name"], "trace": t["trace"], "ok": False,
                                       "error": "the CUB extension did not build"})
            continue
        if spec["kind"] == "cabi" and not os.path.exists(lib):
            results["results"].append({"allocator": spec["name"], "trace": t["trace"], "ok": False,
                                       "error": "%s is missing (make bench-gpu builds it once capi/ exists)" % lib})
            continue
        if left < 10:
            results["cuts"].append("%s: not run, the run's time budget was spent" % name)
            results["results"].append({"allocator": spec["name"], "trace": t["trace"], "ok": False,
                                       "error": "not run: time budget spent"})
            continue
        budget = max(10.0, min(a.child_budget, 2 * left / n_left))
        argv = me + ["child", "--alloc", spec["name"], "--ops", t["file"], "--build", a.build,
                     "--lib", lib, "--reps", str(reps), "--budget", "%.0f" % budget,
                     "--max-probes", str(a.max_probes)] + ([] if bisect else ["--no-bisect"])
        log("%s (budget %.0f s, %.0f s left)" % (name, budget, left))
        logp = os.path.join(logs, "%s-%s.log" % (spec["name"].replace("+", "_"), t["trace"]))
        st, obj, msg = run_child(argv, logp, min(left, budget + 90), env=child_env(spec))
        if obj is None:
            obj = {"allocator": spec["name"], "ok": False, "error": msg}
            results["failures"].append("%s: %s" % (name, msg))
        elif st != 0:
            results["failures"].append("%s: %s (its last report is kept)" % (name, msg))
        obj["trace"] = t["trace"]
        obj["exit_status"] = st
        obj["log"] = os.path.relpath(logp, out)
        for note in obj.get("notes", []):
            if "cut" in note:
                results["cuts"].append("%s: %s" % (name, note))
        if "stopped" in obj.get("min_cap_note", ""):
            results["cuts"].append("%s: bisection %s" % (name, obj["min_cap_note"]))
        results["results"].append(obj)
        save()

    save()
    log("wrote", os.path.join(out, "results.json"), "and RESULTS.md in %.0f s" % (time.monotonic() - t0))
    return 0


def run_go(a, results, go_jobs, arg_of, stress, bin_dir, reps, bisect, deadline, out, logs, save):
    """Replays the traces through this pool natively from Go
    (tlsf-stress replay --json) and adds its rows to results."""
    left = deadline - time.monotonic() - 5
    argv = [stress, "replay", "--device", "cuda", "--json", "--warm-runs", str(reps),
            "--backend", ",".join(be for _, be in GO_BACKENDS)]
    if bisect:
        argv.append("--min-cap")
    argv += [arg_of[t["trace"]] for t in go_jobs]
    log("Go: " + " ".join(argv[1:]))
    logp = os.path.join(logs, "go-replay.log")
    if left < 10:
        results["cuts"].append("Go replays: not run, the run's time budget was spent")
    else:
        with open(logp, "w") as err:
            try:
                p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, text=True, timeout=left)
                lines, st = p.stdout.splitlines(), p.returncode
            except subprocess.TimeoutExpired as e:
                so = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
                lines, st = so.splitlines(), 124
                results["cuts"].append("Go replays: stopped by the time budget after %d results" % len(lines))
        if st not in (0, 124):
            results["failures"].append("Go replays: exit status %d (logs/go-replay.log)" % st)
        names = dict((be, n) for n, be in GO_BACKENDS)
        for line in lines:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            live = r.get("peak_live_bytes") or 0
            results["results"].append({
                "allocator": names.get(r.get("backend"), r.get("backend")), "trace": r.get("trace"),
                "desc": GO_DESC + str(r.get("backend")), "ok": r.get("failed_allocs", 0) == 0,
                "ops": r.get("ops"), "peak_live_bytes": live,
                "cold_ns_per_op": r.get("cold_ns_per_op"),
                "warm_ns_per_op_median": r.get("ns_per_op"),
                "warm_ns_per_op_min": r.get("min_ns_per_op", r.get("ns_per_op")),
                "warm_reps": r.get("warm_reps", 1),
                "peak_reserved_bytes": r.get("peak_reserved_bytes"),
                "peak_reserved_over_live": r.get("reserved_over_live"),
                "peak_reserved_source": "pool.Stats peak reserved",
                "min_cap_bytes": r.get("min_cap_bytes"), "min_cap_over_live": r.get("min_cap_over_live"),
                "min_cap_probes": r.get("min_cap_runs"),
                "min_cap_resolution": (2 * MIB / live) if (live and r.get("min_cap_bytes")) else None,
                "device_calls": r.get("device_calls"), "warm_device_calls": r.get("warm_device_calls"),
                "first_error": r.get("first_error"), "log": os.path.relpath(logp, out),
                "version": "tlsf-stress " + _version(bin_dir),
            })
    save()


def _version(bin_dir):
    p = os.path.join(bin_dir, "VERSION")
    if os.path.exists(p):
        with open(p) as f:
            return f.read().strip()
    return "(no bin/VERSION)"


# ---------------------------------------------------------------- markdown

COLUMNS = [  # key, heading, format; all lower is better
    ("cold_ns_per_op", "cold ns/op", "%.0f"),
    ("warm_ns_per_op_median", "warm ns/op (median)", "%.0f"),
    ("warm_ns_per_op_min", "warm ns/op (min)", "%.0f"),
    ("peak_reserved_over_live", "peak reserved / live", "%.3f"),
    ("min_cap_over_live", "min cap / live", "%.4f"),
]


def is_ours(name):
    return name.startswith("tlsf-")


def is_go(name):
    return name.endswith("-go")


def fmt(v, f):
    return "–" if v is None else f % v


def best(rows, key):
    rows = [r for r in rows if r.get("ok") and r.get(key) is not None]
    return min(rows, key=lambda r: r[key]) if rows else None


def comparison(results, trace):
    """Rows of (column heading, ours text, best peer text, ratio text) for
    one trace: per column, the best of our rows against the best peer."""
    rows = [r for r in results["results"] if r.get("trace") == trace]
    out = []
    for key, head, f in COLUMNS:
        # Ours through the C ABI, replayed by the same loop as the peers;
        # natively from Go only where no C ABI row has the figure.
        o = best([r for r in rows if is_ours(r["allocator"]) and not is_go(r["allocator"])], key)
        o = o or best([r for r in rows if is_go(r["allocator"])], key)
        p = best([r for r in rows if not is_ours(r["allocator"])], key)
        ratio = "%.2f×" % (o[key] / p[key]) if (o and p and p[key]) else "–"
        out.append((head, "%s (%s)" % (fmt(o[key], f), o["allocator"]) if o else "–",
                    "%s (%s)" % (fmt(p[key], f), p["allocator"]) if p else "–", ratio))
    return out


def markdown(results):
    m = results.get("machine", {})
    L = []
    L.append("# Every allocator side by side on one GPU\n")
    L.append("Generated %s by `bench/peers/run.sh` (%s); the numbers are in `results.json` beside this file.%s\n"
             % (results["generated"], "quick run" if results.get("quick") else "full run",
                " **Quick run: one trace, few replays, no bisection.**" if results.get("quick") else ""))
    L.append("Machine: %s (%s GiB, compute %s), driver/GPU `%s`, CUDA driver API %s, runtime %s, "
             "%s CPU cores (%s), PyTorch %s (CUDA %s), %s.\n" % (
                 m.get("gpu", "?"), fmt((m.get("gpu_memory_bytes") or 0) / GIB, "%.0f"), m.get("gpu_capability", "?"),
                 m.get("nvidia_smi", "?"), m.get("cuda_driver_api", "?"), m.get("cuda_runtime", "?"),
                 m.get("nproc", "?"), m.get("cpu", "?"), m.get("torch", "?"), m.get("torch_cuda", "?"),
                 "CUB %s" % results.get("build", {}).get("cub", {}).get("cub_version", "(not built)")))
    L.append("Method: each allocator replays the trace's op list (`tlsf-stress export`) from the same C++ loop "
             "(`bench/peers/replay.cpp`, one indirect call per alloc or free), in a process of its own. "
             "cold = the first replay on a fresh allocator; warm = the median and minimum of %d later replays "
             "on it, after untimed ones for 1 s (at least one); ns/op = wall time of the loop per alloc or free. Peak reserved = the most device memory "
             "the allocator held (its own statistics; cudaMalloc and CUB: cudaMemGetInfo on one more replay). "
             "Min cap = the smallest cap under which a fresh allocator replays the whole trace with no failed "
             "allocation, by bisection to %.1f%% of peak live (at most %d probes): PyTorch "
             "`set_per_process_memory_fraction`, cudaMallocAsync a pool with `maxSize`, ours "
             "`tlsf_set_memory_fraction` (C ABI) or `MaxBytes` (Go, to 2 MiB). All ratios are over the trace's "
             "peak live bytes; lower is better in every column.\n"
             % (results.get("warm_reps", 0), 100 * results.get("cap_resolution", 0.001), results.get("max_probes", 0)))
    L.append("| allocator | what | version |\n| --- | --- | --- |")
    vers = {}
    for r in results["results"]:
        if r.get("version"):
            vers.setdefault(r["allocator"], r["version"])
    for name, desc in results.get("allocators", {}).items():
        L.append("| %s | %s | %s |" % (name, desc, vers.get(name, "")))
    L.append("")
    for t in results["traces"]:
        name = t["trace"]
        L.append("## %s (%s ops, peak live %.2f GiB, from %s)\n" % (name, format(t["ops"], ","), t["peak_live_bytes"] / GIB, t["source"]))
        L.append("| allocator | " + " | ".join(h for _, h, _ in COLUMNS) + " | notes |")
        L.append("| --- " * (len(COLUMNS) + 2) + "|")
        for r in [r for r in results["results"] if r.get("trace") == name]:
            notes = []
            if r.get("error"):
                notes.append("**failed**: " + r["error"])
            elif not r.get("ok"):
                notes.append("**failed allocations without a cap**: %s" % r.get("first_error", ""))
            if r.get("min_cap_note"):
                notes.append(r["min_cap_note"])
            notes += [n for n in r.get("notes", []) if "failed" not in n]
            cells = [fmt(r.get(k), f) for k, _, f in COLUMNS]
            L.append("| %s | %s | %s |" % (r["allocator"], " | ".join(cells), "; ".join(notes).replace("|", "/")))
        byname = {r["allocator"]: r for r in results["results"] if r.get("trace") == name and r.get("ok")}
        abi = []
        for be in ("tlsf-vmm", "tlsf-chunks"):
            c, g = byname.get(be, {}), byname.get(be + "-go", {})
            if c.get("warm_ns_per_op_median") and g.get("warm_ns_per_op_median"):
                abi.append("%s %.0f ns/op through libtlsf.so and the C++ loop, %.0f natively from Go"
                           % (be, c["warm_ns_per_op_median"], g["warm_ns_per_op_median"]))
        if abi:
            L.append("\nThe C ABI's cost (warm medians; Go's replay loop looks blocks up in a map, the C++ "
                     "loop in an array): " + "; ".join(abi) + ".")
        L.append("\nOurs (the best of our C ABI rows, which the same loop replays; a -go row only where "
                 "those have no figure) against the best peer:\n")
        L.append("| column | ours | best peer | ours / peer |\n| --- | --- | --- | --- |")
        for row in comparison(results, name):
            L.append("| %s | %s | %s | %s |" % row)
        L.append("")
    L.append("## Cuts and failures\n")
    for c in results.get("cuts", []) + results.get("failures", []):
        L.append("- " + c)
    if not results.get("cuts") and not results.get("failures"):
        L.append("- none")
    L.append("")
    L.append(readme_block(results))
    return "\n".join(L) + "\n"


BEGIN = "<!-- peers-table:begin -->"
END = "<!-- peers-table:end -->"


def readme_block(results):
    """The README's comparison table, between markers that
    readme_tables.py looks for."""
    m = results.get("machine", {})
    L = [BEGIN, "", "### Side by side (copied from bench/RESULTS.md by bench/peers/readme_tables.py)", "",
         "Measured %s on %s by `bench/peers/run.sh`%s: every allocator replays the same op list from one "
         "C++ loop. Ours is the best of this pool's rows through its C ABI (VMM, chunks; a row marked -go, "
         "natively from Go, only where those have no figure); the peer is the best of "
         "PyTorch (native, expandable segments), cudaMallocAsync, CUB (default, bin growth 2) and cudaMalloc "
         "on that column. Lower is better; ratio = ours / peer."
         % (results["generated"], m.get("gpu", "?"), " (quick run)" if results.get("quick") else ""), "",
         "| trace | column | ours | best peer | ratio |", "| --- | --- | --- | --- | --- |"]
    for t in results["traces"]:
        for head, o, p, ratio in comparison(results, t["trace"]):
            L.append("| %s | %s | %s | %s | %s |" % (t["trace"], head, o, p, ratio))
    L += ["", END]
    return "\n".join(L)


def cmd_report(a):
    with open(a.results) as f:
        results = json.load(f)
    sys.stdout.write(markdown(results))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    default_build = os.environ.get("TLSF_PEERS_BUILD", "/tmp/tlsf-peers-build")

    r = sub.add_parser("run", help="run every allocator on the traces; write OUT/results.json and OUT/RESULTS.md")
    r.add_argument("traces", nargs="*", help="trace files (any format tlsf-stress reads) or embedded names (default: lstm resnet50 tdnn)")
    r.add_argument("--out", default=os.environ.get("OUT", "out/peers"))
    r.add_argument("--bin", default=os.path.join(ROOT, "bin"), help="where tlsf-stress and libtlsf.so are")
    r.add_argument("--build", default=default_build, help="build directory of the extensions")
    r.add_argument("--quick", action="store_true", help="the first trace only, 3 warm replays, no bisection")
    r.add_argument("--reps", type=int, default=WARM_REPS, help="warm replays per allocator and trace")
    r.add_argument("--no-bisect", action="store_true", help="skip the min-cap bisection")
    r.add_argument("--max-probes", type=int, default=MAX_PROBES, help="bisection probes per allocator and trace")
    r.add_argument("--budget", type=float, default=560, help="seconds for the whole run (the GPU command's limit is 600)")
    r.add_argument("--child-budget", type=float, default=60, help="most seconds one allocator may take on one trace")
    r.add_argument("--build-timeout", type=float, default=240)
    r.add_argument("--only", help="comma-separated allocator names to run (default: all)")

    c = sub.add_parser("child", help="(internal) one allocator on one op list; prints one JSON line")
    c.add_argument("--alloc", required=True, choices=[s["name"] for s in ALLOCATORS])
    c.add_argument("--ops", required=True)
    c.add_argument("--build", default=default_build)
    c.add_argument("--lib", default=os.path.join(ROOT, "bin", "libtlsf.so"))
    c.add_argument("--reps", type=int, default=WARM_REPS)
    c.add_argument("--budget", type=float, default=60)
    c.add_argument("--max-probes", type=int, default=MAX_PROBES)
    c.add_argument("--no-bisect", dest="bisect", action="store_false")

    b = sub.add_parser("build", help="(internal) build one extension")
    b.add_argument("--which", choices=["main", "cub"], required=True)
    b.add_argument("--build", default=default_build)

    i = sub.add_parser("info", help="(internal) the machine and versions as JSON")
    i.add_argument("--build", default=default_build)

    p = sub.add_parser("report", help="print RESULTS.md from a results.json")
    p.add_argument("results")

    a = ap.parse_args()
    fn = {"run": cmd_run, "child": cmd_child, "build": cmd_build, "info": cmd_info, "report": cmd_report}[a.cmd]
    sys.exit(fn(a) or 0)


if __name__ == "__main__":
    main()
