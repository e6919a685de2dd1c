#!/usr/bin/env python3
"""Writes the small PyTorch-snapshot-shaped pickles the tests read.

torch is not needed: a snapshot is a plain dict, and this writes dicts of
the same shape as torch.cuda.memory._snapshot() with the standard pickle
module at protocol 4 (framing, MEMOIZE and BINGET, as torch's pickles use).
Run from this directory: python3 gen_snapshots.py
"""
import pickle

BASE = 140601425133568  # a device address as PyTorch reports them (LONG1)


def entry(action, addr, size, t, stream=0):
    return {"action": action, "addr": addr, "size": size, "stream": stream,
            "time_us": t, "compile_context": "N/A", "user_metadata": ""}


def segments():
    return [{"device": 0, "address": BASE, "total_size": 20971520,
             "allocated_size": 0, "active_size": 0, "requested_size": 0,
             "stream": 0, "segment_type": "large", "segment_pool_id": (0, 0),
             "is_expandable": False, "frames": [],
             "blocks": [{"address": BASE, "size": 20971520,
                         "requested_size": 0, "state": "inactive",
                         "frames": []}]}]


def small():
    """One device; starts mid-run (a free of an unknown block)."""
    t = 1796015342285871
    es = [
        entry("free_requested", BASE + 999 * 512, 512, t),  # allocated before recording
        entry("free_completed", BASE + 999 * 512, 512, t + 1),
        entry("segment_alloc", BASE, 20971520, t + 2),
        entry("alloc", BASE, 1310720, t + 3),
        entry("alloc", BASE + 1310720, 4, t + 4, stream=7),
        entry("alloc", BASE + 1311232, 2**33 + 3, t + 5),  # over 2^32 bytes
        entry("free_requested", BASE, 1310720, t + 6),
        entry("free_completed", BASE, 1310720, t + 7),
        entry("alloc", BASE, 16000, t + 8),  # address reused: a new ID
        entry("free_requested", BASE + 1310720, 4, t + 9, stream=7),
        entry("free_completed", BASE + 1310720, 4, t + 10, stream=7),
        entry("snapshot", 0, 0, t + 11),
    ]
    return {"segments": segments(), "device_traces": [es],
            "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": "",
                                   "expandable_segments": False},
            "external_annotations": []}


def two_devices():
    """Two devices whose entries interleave in time."""
    a, b = BASE, BASE + 2**36
    d0 = [entry("alloc", a, 512, 10), entry("free_requested", a, 512, 30),
          entry("alloc", a, 1024, 50)]
    d1 = [entry("alloc", b, 2048, 20), entry("alloc", b + 2048, 4096, 40),
          entry("free_requested", b, 2048, 60)]
    return {"segments": [], "device_traces": [d0, d1]}


for name, snap in [("small", small()), ("two_devices", two_devices())]:
    with open(name + ".snapshot.pickle", "wb") as f:
        pickle.dump(snap, f, protocol=4)
