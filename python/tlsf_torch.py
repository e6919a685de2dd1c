"""PyTorch's CUDA allocator on the tlsf pool (github.com/gpumem/tlsf).

One file, no build step: it loads libtlsf.so (built with ``make capi``),
hands its ``tlsf_malloc``/``tlsf_free`` to
``torch.cuda.memory.CUDAPluggableAllocator``, wires the optional hooks
(init, reset = ``torch.cuda.empty_cache``, memory fraction =
``torch.cuda.set_per_process_memory_fraction``, record stream =
``Tensor.record_stream``) and makes it PyTorch's allocator::

    import tlsf_torch
    tlsf_torch.install(conf="max_bytes:40GiB")   # before any CUDA allocation
    x = torch.empty(1 << 20, device="cuda")
    print(tlsf_torch.stats())

PyTorch's own statistics (``torch.cuda.memory_stats``,
``max_memory_reserved``) are not available with a pluggable allocator: use
``stats()``.

Out of memory: ``tlsf_malloc`` returns NULL, and PyTorch's pluggable
allocator does not check it (as of PyTorch 2.11), so the failure surfaces
as a CUDA error of a later kernel (an illegal address) rather than
``torch.OutOfMemoryError``, and the process's CUDA context is unusable
after it. ``stats()["num_ooms"]`` counts such failures; run work that may
exhaust memory in a child process.

The configuration string is described in capi/tlsf.h
(``tlsf_configure``); without ``conf`` the environment variable
``TLSF_ALLOC_CONF`` applies.
"""

import ctypes
import os

__all__ = ["install", "installed", "stats", "device_calls", "trim", "last_error", "TlsfStats", "default_library"]


class TlsfStats(ctypes.Structure):
    """Mirror of ``tlsf_stats`` in capi/tlsf.h; byte counts in bytes."""

    _fields_ = [
        ("size", ctypes.c_size_t),
        ("allocated", ctypes.c_uint64),
        ("reserved", ctypes.c_uint64),
        ("active", ctypes.c_uint64),
        ("cached", ctypes.c_uint64),
        ("peak_allocated", ctypes.c_uint64),
        ("peak_reserved", ctypes.c_uint64),
        ("num_allocs", ctypes.c_uint64),
        ("num_frees", ctypes.c_uint64),
        ("num_ooms", ctypes.c_uint64),
        ("device_calls", ctypes.c_uint64),
        ("cap", ctypes.c_uint64),
        ("released", ctypes.c_uint64),
        ("device_calls_by_path", ctypes.c_uint64 * 6),
    ]

    # TLSF_PATH_* in capi/tlsf.h, in order: the keys of
    # stats()["device_calls_by_path"].
    PATHS = ("other", "setup", "alloc", "out_of_memory", "scavenge", "trim")


_lib = None  # the ctypes handle, once loaded
_allocator = None  # the CUDAPluggableAllocator, once installed

# (PyTorch setter on torch._C._CUDAPluggableAllocator, exported function)
_HOOKS = [
    ("set_init_fn", "tlsf_init"),
    ("set_reset_fn", "tlsf_reset"),
    ("set_memory_fraction_fn", "tlsf_set_memory_fraction"),
    ("set_record_stream_fn", "tlsf_record_stream"),
]


def default_library():
    """The library path: $TLSF_LIB, else bin/libtlsf.so beside this file's
    repository, else ``libtlsf.so`` on the loader's path."""
    env = os.environ.get("TLSF_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    cand = os.path.join(os.path.dirname(here), "bin", "libtlsf.so")
    if os.path.exists(cand):
        return cand
    return "libtlsf.so"


def _load(path):
    global _lib
    if _lib is not None:
        return _lib
    lib = ctypes.CDLL(path)
    lib.tlsf_configure.argtypes = [ctypes.c_char_p]
    lib.tlsf_configure.restype = ctypes.c_int
    lib.tlsf_get_stats.argtypes = [ctypes.c_int, ctypes.POINTER(TlsfStats)]
    lib.tlsf_get_stats.restype = ctypes.c_int
    if hasattr(lib, "tlsf_get_device_calls"):  # absent from libraries older than this file
        lib.tlsf_get_device_calls.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64)]
        lib.tlsf_get_device_calls.restype = ctypes.c_int
    lib.tlsf_trim.argtypes = [ctypes.c_int]
    lib.tlsf_trim.restype = ctypes.c_size_t
    lib.tlsf_last_error.argtypes = []
    lib.tlsf_last_error.restype = ctypes.c_char_p
    _lib = lib
    return lib


def _fn_pointer(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def install(lib=None, conf=""):
    """Make the tlsf pool PyTorch's CUDA allocator.

    lib: path of libtlsf.so (default: ``default_library()``).
    conf: a configuration string for ``tlsf_configure`` ("" keeps
    ``TLSF_ALLOC_CONF`` or the defaults), e.g. "max_bytes:40GiB".

    Must run before PyTorch initialises CUDA (before the first CUDA tensor
    or ``torch.cuda`` call that initialises it): PyTorch cannot swap an
    allocator that is in use. Raises RuntimeError if it is too late or if
    this was installed already, ValueError for a bad configuration,
    OSError if the library cannot be loaded. Returns the library path.
    """
    global _allocator
    import torch

    if _allocator is not None:
        raise RuntimeError("tlsf_torch.install: the tlsf allocator is installed already")
    if torch.cuda.is_initialized():
        raise RuntimeError(
            "tlsf_torch.install: PyTorch's CUDA allocator is initialised already, and PyTorch "
            "cannot swap an allocator in use; call install() before the first CUDA tensor or "
            "CUDA call of the process"
        )
    path = lib or default_library()
    if os.path.sep in path:
        path = os.path.abspath(path)
    clib = _load(path)
    if conf and clib.tlsf_configure(conf.encode()) != 0:
        raise ValueError("tlsf_torch.install: " + last_error())

    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "tlsf_malloc", "tlsf_free")
    native = alloc.allocator()
    missing = []
    for setter, name in _HOOKS:
        fn = getattr(native, setter, None)
        if fn is None:
            missing.append(setter)
            continue
        fn(_fn_pointer(clib, name))
    if missing:
        import warnings

        warnings.warn("tlsf_torch.install: this PyTorch lacks " + ", ".join(missing) + "; those hooks are not wired")
    try:
        torch.cuda.memory.change_current_allocator(alloc)
    except RuntimeError as e:
        raise RuntimeError(
            "tlsf_torch.install: PyTorch refused to change its allocator (it is initialised "
            "already: call install() before any CUDA work): %s" % e
        ) from e
    _allocator = alloc
    return path


def installed():
    """Whether install() succeeded in this process."""
    return _allocator is not None


def last_error():
    """The calling thread's last message from the library ("" if none)."""
    if _lib is None:
        return ""
    msg = _lib.tlsf_last_error()
    return msg.decode(errors="replace") if msg else ""


def stats(device=0):
    """The pool statistics of a device as a dict (see tlsf_stats in
    capi/tlsf.h); zeros for a device with no pool yet.
    ``device_calls_by_path`` is a dict of the driver calls by the part of
    the pool that made them ("alloc", "out_of_memory", ...; they sum to
    ``device_calls``). Raises RuntimeError when the library is not loaded
    or the call fails."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.stats: the library is not loaded (call install first)")
    s = TlsfStats()
    s.size = ctypes.sizeof(TlsfStats)
    if _lib.tlsf_get_stats(int(device), ctypes.byref(s)) != 0:
        raise RuntimeError("tlsf_torch.stats: " + last_error())
    out = {}
    for name, _ in TlsfStats._fields_:
        field = getattr(TlsfStats, name)
        if name == "size" or field.offset + field.size > s.size:
            continue  # a library older than this file does not fill it
        if name == "device_calls_by_path":
            out[name] = {p: int(n) for p, n in zip(TlsfStats.PATHS, s.device_calls_by_path)}
        else:
            out[name] = int(getattr(s, name))
    return out


def device_calls(path=None, call=None, device=0):
    """The driver calls the pool of a device made on ``path`` (one of
    ``TlsfStats.PATHS``, such as "out_of_memory"; None: every path) to the
    entry point ``call`` (such as "cuMemMap"; None: every entry point), as
    tlsf_get_device_calls. Raises ValueError for an unknown path and
    RuntimeError when the library is not loaded or refuses the call (an
    unknown entry point, a library older than tlsf_get_device_calls)."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.device_calls: the library is not loaded (call install first)")
    if not hasattr(_lib, "tlsf_get_device_calls"):
        raise RuntimeError("tlsf_torch.device_calls: the library is older than tlsf_get_device_calls")
    if path is None:
        p = -1  # TLSF_PATH_ALL
    elif path in TlsfStats.PATHS:
        p = TlsfStats.PATHS.index(path)
    else:
        raise ValueError("tlsf_torch.device_calls: unknown path %r (one of %s)" % (path, ", ".join(TlsfStats.PATHS)))
    n = ctypes.c_uint64()
    name = None if call is None else call.encode()
    if _lib.tlsf_get_device_calls(int(device), p, name, ctypes.byref(n)) != 0:
        raise RuntimeError("tlsf_torch.device_calls: " + last_error())
    return int(n.value)


def trim(device=0):
    """Return the unused memory of a device's pool to the driver; returns
    the bytes released. Raises RuntimeError on failure."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.trim: the library is not loaded (call install first)")
    n = _lib.tlsf_trim(int(device))
    msg = last_error()
    if msg:
        raise RuntimeError("tlsf_torch.trim: " + msg)
    return int(n)
