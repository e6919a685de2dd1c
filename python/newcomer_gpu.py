#!/usr/bin/env python3
"""Two processes on one GPU: a job that filled most of it through
tlsf_torch, freed its tensors and went idle, and a newcomer started after
it (PyTorch's own allocator) that asks for half the GPU every 10 ms.
Prints how long the newcomer waited, once with the default configuration
(IdleRelease: the idle job gives its unused memory back once another
process starts) and once with idle_release:off (the job keeps it; the
newcomer gives up after 5 s). Exit 0 with both outcomes as expected, 1
otherwise; skips (exit 0) without PyTorch or a GPU, fails instead with
TLSF_REQUIRE_GPU=1:

    python3 python/newcomer_gpu.py bin/libtlsf.so
"""
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

GIB = 1 << 30


def idle(lib, conf, seconds):
    """The idle job: fill the GPU to 92% in 1 GiB tensors, free them, idle."""
    import torch
    import tlsf_torch
    tlsf_torch.install(lib, conf)
    held = []
    while True:
        free, total = torch.cuda.mem_get_info()
        if free < 0.08 * total:
            break
        held.append(torch.empty(GIB, dtype=torch.uint8, device="cuda"))
    del held
    torch.cuda.synchronize()
    print(json.dumps({"ready": True, "reserved": tlsf_torch.stats()["reserved"]}), flush=True)
    time.sleep(seconds)
    print(json.dumps({"reserved": tlsf_torch.stats()["reserved"]}), flush=True)


def newcomer(limit):
    """The newcomer: half the GPU, tried every 10 ms for limit seconds."""
    import torch
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    start = time.monotonic()
    tries = 0
    while time.monotonic() - start < limit:
        try:
            x = torch.empty(total // 2, dtype=torch.uint8, device="cuda")
            waited = time.monotonic() - start
            del x
            print(json.dumps({"ok": True, "waited_s": waited, "tries": tries, "free_at_start": free, "total": total}), flush=True)
            return
        except torch.OutOfMemoryError:
            tries += 1
            time.sleep(0.01)
    print(json.dumps({"ok": False, "waited_s": limit, "tries": tries, "free_at_start": free, "total": total}), flush=True)


def run(lib, conf):
    a = subprocess.Popen([sys.executable, __file__, "--idle", lib, conf], stdout=subprocess.PIPE, text=True)
    ready = json.loads(a.stdout.readline())
    b = subprocess.run([sys.executable, __file__, "--newcomer"], stdout=subprocess.PIPE, text=True, check=True)
    got = json.loads(b.stdout.strip().splitlines()[-1])
    after = json.loads(a.stdout.readline())
    a.wait()
    got.update({"conf": conf or "default", "idle_reserved_before": ready["reserved"], "idle_reserved_after": after["reserved"]})
    return got


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--idle":
        idle(sys.argv[2], sys.argv[3], 15)
        return
    if len(sys.argv) > 1 and sys.argv[1] == "--newcomer":
        newcomer(5)
        return
    from smoke_gpu import torch_on_gpu
    torch_on_gpu("newcomer_gpu")
    import tlsf_torch
    lib = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else tlsf_torch.default_library())
    ok = True
    for conf, want in (("", True), ("idle_release:off", False)):
        got = run(lib, conf)
        print("newcomer_gpu:", json.dumps(got))
        ok = ok and got["ok"] == want
    print("newcomer_gpu: " + ("ok" if ok else "FAIL"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
