"""PyTorch's CUDA allocator on the tlsf pool (github.com/gpumem/tlsf).

One file, no build step: it loads libtlsf.so (built with ``make capi``),
hands its ``tlsf_malloc``/``tlsf_free`` to
``torch.cuda.memory.CUDAPluggableAllocator``, wires the optional hooks
(init, reset = ``torch.cuda.empty_cache``, memory fraction =
``torch.cuda.set_per_process_memory_fraction``, record stream =
``Tensor.record_stream``) and makes it PyTorch's allocator::

    import tlsf_torch
    tlsf_torch.install(conf="max_bytes:40GiB")   # before PyTorch initialises CUDA
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

Child processes: start them with the "spawn" method
(``multiprocessing.get_context("spawn")``), as CUDA itself asks. A child
made by ``fork`` cannot use the library (capi/tlsf.h, "Processes"): the
Go runtime inside it lacks its threads there, so every call fails with a
message (a free, silently: PyTorch's free returns nothing). A forked
DataLoader worker is safe as long as it neither allocates nor frees CUDA
tensors.

The configuration string is described in capi/tlsf.h
(``tlsf_configure``); without ``conf`` the environment variable
``TLSF_ALLOC_CONF`` applies.
"""

import ctypes
import operator
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
        ("caches_on", ctypes.c_uint64),
    ]

    # TLSF_PATH_* in capi/tlsf.h, in order: the keys of
    # stats()["device_calls_by_path"].
    PATHS = ("other", "setup", "alloc", "out_of_memory", "scavenge", "trim")


_lib = None  # the ctypes handle, once loaded
_lib_path = None  # the path it was loaded from
_allocator = None  # the CUDAPluggableAllocator, once installed

# The functions install() needs; the hooks (_HOOKS) and
# tlsf_get_device_calls are optional.
_REQUIRED = ("tlsf_malloc", "tlsf_free", "tlsf_init", "tlsf_configure", "tlsf_get_stats", "tlsf_trim", "tlsf_last_error")

# TLSF_ABI_VERSION of the capi/tlsf.h this file follows.
ABI_VERSION = 1

# TLSF_PATH_ALL and the most devices (ordinals 0 to 63) in capi/tlsf.h.
_PATH_ALL = -1
_MAX_DEVICES = 64

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
    global _lib, _lib_path
    if _lib is not None:
        if path != _lib_path:
            raise RuntimeError(
                "tlsf_torch: %s is loaded already; one process uses one library (asked for %s)" % (_lib_path, path)
            )
        return _lib
    try:
        lib = ctypes.CDLL(path)
    except OSError as e:
        raise OSError("tlsf_torch: loading %s: %s (build it with `make capi`, or set TLSF_LIB)" % (path, e)) from e
    absent = [name for name in _REQUIRED if not hasattr(lib, name)]
    if absent:
        raise OSError("tlsf_torch: %s is not libtlsf.so: it lacks %s" % (path, ", ".join(absent)))
    lib.tlsf_init.argtypes = [ctypes.c_int]
    lib.tlsf_init.restype = None
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
    if hasattr(lib, "tlsf_version"):  # absent from libraries older than it
        lib.tlsf_version.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.tlsf_version.restype = ctypes.c_char_p
        abi = ctypes.c_int(-1)
        lib.tlsf_version(ctypes.byref(abi))
        if abi.value != ABI_VERSION:
            raise OSError(
                "tlsf_torch: %s implements ABI version %d, this file ABI version %d: use the tlsf_torch.py of that build"
                % (path, abi.value, ABI_VERSION)
            )
    _lib, _lib_path = lib, path
    return lib


def _fn_pointer(lib, name):
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


def _device(device, fn):
    """device as a C int, or ValueError: an integer (bool excluded) in
    0..63, as capi/tlsf.h's ordinals."""
    if isinstance(device, bool):
        raise ValueError("tlsf_torch.%s: device %r is not an ordinal" % (fn, device))
    try:
        d = operator.index(device)
    except TypeError:
        raise ValueError("tlsf_torch.%s: device %r is not an integer ordinal" % (fn, device)) from None
    if not 0 <= d < _MAX_DEVICES:
        raise ValueError("tlsf_torch.%s: device %d: want 0 to %d" % (fn, d, _MAX_DEVICES - 1))
    return d


def _text(value, what, fn):
    """value (str or bytes) as bytes for C, or ValueError (a NUL inside
    would cut it short)."""
    b = value.encode() if isinstance(value, str) else value
    if not isinstance(b, bytes):
        raise ValueError("tlsf_torch.%s: %s %r: want str or bytes" % (fn, what, value))
    if b"\0" in b:
        raise ValueError("tlsf_torch.%s: %s %r contains a NUL" % (fn, what, value))
    return b


def install(lib=None, conf=""):
    """Make the tlsf pool PyTorch's CUDA allocator.

    lib: path of libtlsf.so (default: ``default_library()``).
    conf: a configuration string (str or bytes) for ``tlsf_configure``
    ("" keeps ``TLSF_ALLOC_CONF`` or the defaults), e.g. "max_bytes:40GiB".

    Must run before PyTorch initialises CUDA (before the first CUDA tensor
    or ``torch.cuda`` call that initialises it): PyTorch cannot swap an
    allocator that is in use. Raises RuntimeError if it is too late, if
    this was installed already, or if another library was loaded before;
    ValueError for a bad configuration (conf, or ``TLSF_ALLOC_CONF``
    without it: its syntax and the range of each value; values wrong only
    for a device, such as a cap below its allocation granularity or an
    initial reserve above the cap, fail when the device's pool is made, at
    its first allocation, and ``last_error()`` says why); OSError if the
    library cannot be loaded or is not libtlsf.so. Returns the library
    path.
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
    if conf and clib.tlsf_configure(_text(conf, "conf", "install")) != 0:
        raise ValueError("tlsf_torch.install: " + last_error())
    # tlsf_init checks the configuration now (TLSF_ALLOC_CONF's, without
    # conf), so that a bad one fails here, not as a NULL from every
    # tlsf_malloc, which PyTorch does not check. (What only a device can
    # tell, when its pool is made: the docstring.)
    clib.tlsf_init(0)
    msg = last_error()
    if msg:
        raise ValueError("tlsf_torch.install: " + msg)

    alloc = torch.cuda.memory.CUDAPluggableAllocator(path, "tlsf_malloc", "tlsf_free")
    native = alloc.allocator()
    missing = []
    for setter, name in _HOOKS:
        fn = getattr(native, setter, None)
        if fn is None or not hasattr(clib, name):
            missing.append(setter if fn is None else name)
            continue
        fn(_fn_pointer(clib, name))
    if missing:
        import warnings

        warnings.warn("tlsf_torch.install: this PyTorch or library lacks " + ", ".join(missing) + "; those hooks are not wired")
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
    ``device_calls``); ``caches_on`` is 1 once the per-thread caches serve
    requests (caches:true, or threads contended for the pool's lock). Raises ValueError for a device that is no ordinal
    (0 to 63), RuntimeError when the library is not loaded or the call
    fails."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.stats: the library is not loaded (call install first)")
    d = _device(device, "stats")
    s = TlsfStats()
    s.size = ctypes.sizeof(TlsfStats)
    if _lib.tlsf_get_stats(d, ctypes.byref(s)) != 0:
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
    ``TlsfStats.PATHS``, such as "out_of_memory", or its TLSF_PATH_*
    number; None or -1: every path) to the entry point ``call`` (str or
    bytes, such as "cuMemMap"; None: every entry point), as
    tlsf_get_device_calls. Raises ValueError for an unknown path, a call
    name with a NUL in it or a device that is no ordinal, and
    RuntimeError when the library is not loaded or refuses the call (an
    unknown entry point, a library older than tlsf_get_device_calls)."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.device_calls: the library is not loaded (call install first)")
    if not hasattr(_lib, "tlsf_get_device_calls"):
        raise RuntimeError("tlsf_torch.device_calls: the library is older than tlsf_get_device_calls")
    d = _device(device, "device_calls")
    p = None
    if path is None:
        p = _PATH_ALL
    elif isinstance(path, (str, bytes)):
        name = path.decode(errors="replace") if isinstance(path, bytes) else path
        if name in TlsfStats.PATHS:
            p = TlsfStats.PATHS.index(name)
    elif not isinstance(path, bool):
        try:
            i = operator.index(path)  # int, or numpy's integers, as device
        except TypeError:
            i = None
        if i is not None and _PATH_ALL <= i < len(TlsfStats.PATHS):
            p = i
    if p is None:
        raise ValueError(
            "tlsf_torch.device_calls: unknown path %r (one of %s, or 0 to %d; -1: all)"
            % (path, ", ".join(TlsfStats.PATHS), len(TlsfStats.PATHS) - 1)
        )
    n = ctypes.c_uint64()
    name = None if call is None else _text(call, "call", "device_calls")
    if _lib.tlsf_get_device_calls(d, p, name, ctypes.byref(n)) != 0:
        raise RuntimeError("tlsf_torch.device_calls: " + last_error())
    return int(n.value)


def version():
    """The loaded library's build and ABI version as (text, abi):
    tlsf_version's string (capi/tlsf.h: the module path and version, abi=N,
    the commit where the build recorded it, the Go toolchain), and N as an
    int, which this file's TlsfStats and functions were written for up to
    ABI_VERSION. Raises RuntimeError when the library is not loaded or is
    older than tlsf_version."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.version: the library is not loaded (call install first)")
    if not hasattr(_lib, "tlsf_version"):
        raise RuntimeError("tlsf_torch.version: the library is older than tlsf_version")
    abi = ctypes.c_int(-1)
    text = _lib.tlsf_version(ctypes.byref(abi))
    return text.decode(errors="replace"), int(abi.value)


def trim(device=0):
    """Return the unused memory of a device's pool to the driver; returns
    the bytes released. Raises ValueError for a device that is no ordinal
    (0 to 63), RuntimeError on failure."""
    if _lib is None:
        raise RuntimeError("tlsf_torch.trim: the library is not loaded (call install first)")
    n = _lib.tlsf_trim(_device(device, "trim"))
    if n == 0:  # a failure returns 0 and leaves a message
        msg = last_error()
        if msg:
            raise RuntimeError("tlsf_torch.trim: " + msg)
    return int(n)
