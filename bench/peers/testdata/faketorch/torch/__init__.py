"""A fake torch for exercising bench/peers/peers.py without a GPU."""
import ctypes, os, time
__version__ = "0.0-fake"
class version: cuda = "13.0"
TOTAL = 144 << 30
MIB = 1 << 20

class Cache:
    """Rounds to 2 MiB, caches freed blocks by size, frees the cache on a miss over the cap."""
    def __init__(self, cap=0, keep=True):
        self.cap, self.keep = cap, keep
        self.reserved = self.peak = 0
        self.free = {}
        self.live = {}
        self.next = 1 << 40
    def alloc(self, n):
        r = -(-n // (2 * MIB)) * 2 * MIB
        if self.free.get(r):
            p = self.free[r].pop()
        else:
            if self.cap and self.reserved + r > self.cap:
                self.empty()
                if self.reserved + r > self.cap:
                    return 0
            self.reserved += r
            self.peak = max(self.peak, self.reserved)
            p = self.next
            self.next += r
        self.live[p] = r
        return p
    def release(self, p, n):
        r = self.live.pop(p)
        if self.keep:
            self.free.setdefault(r, []).append(p)
        else:
            self.reserved -= r
    def empty(self):
        for r, l in self.free.items():
            self.reserved -= r * len(l)
        self.free = {}

TORCH = Cache()
FRACTION = [1.0]

class _Props:
    name = "Fake H200"; total_memory = TOTAL; major = 9; minor = 0

class cuda:
    @staticmethod
    def init(): pass
    @staticmethod
    def set_device(d): pass
    @staticmethod
    def mem_get_info(): return (TOTAL - TORCH.reserved, TOTAL)
    @staticmethod
    def empty_cache(): TORCH.empty()
    @staticmethod
    def reset_peak_memory_stats(): TORCH.peak = TORCH.reserved
    @staticmethod
    def max_memory_reserved(): return TORCH.peak
    @staticmethod
    def set_per_process_memory_fraction(f):
        assert 0 <= f <= 1, f
        TORCH.cap = int(f * TOTAL) if f < 1 else 0
    @staticmethod
    def get_device_properties(d): return _Props()
