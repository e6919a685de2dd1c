#!/usr/bin/env python3
# Probes what the CUDA driver does with a destroyed or never-created
# stream handle: each call runs in a child process, whose exit status is
# printed (-11: SIGSEGV). Needs libcuda.so.1 and a GPU. Results of
# 2026-12-03: bench/replay-h200/README.md (450ab22).
import ctypes, subprocess, sys
def child(kind, call):
    cu = ctypes.CDLL("libcuda.so.1")
    assert cu.cuInit(0) == 0
    dev = ctypes.c_int(); cu.cuDeviceGet(ctypes.byref(dev), 0)
    ctx = ctypes.c_void_p(); cu.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev); cu.cuCtxSetCurrent(ctx)
    if kind == "destroyed":
        s = ctypes.c_void_p(); cu.cuStreamCreate(ctypes.byref(s), 1); cu.cuStreamDestroy_v2(s)
    else:
        s = ctypes.c_void_p(0x999999)
    ev = ctypes.c_void_p(); cu.cuEventCreate(ctypes.byref(ev), 2)
    if call == "sync": r = cu.cuStreamSynchronize(s)
    elif call == "record": r = cu.cuEventRecord(ev, s)
    else: r = cu.cuStreamWaitEvent(s, ev, 0)
    print("returned", r, flush=True)
if len(sys.argv) > 1:
    child(sys.argv[1], sys.argv[2]); sys.exit(0)
for kind in ("destroyed", "bogus"):
    for call in ("sync", "record", "wait"):
        p = subprocess.run([sys.executable, __file__, kind, call], capture_output=True, text=True, timeout=60)
        print(kind, call, "exit", p.returncode, p.stdout.strip(), p.stderr.strip()[-200:])
