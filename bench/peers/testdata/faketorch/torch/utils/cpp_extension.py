import ctypes, os, time
import torch

DEV = []  # allocators whose reserved bytes count as device memory used

class Ext:
    def __init__(self):
        self.objs = {}
    def _h(self, o):
        h = id(o); self.objs[h] = o; return h
    def load_ops(self, path):
        with open(path) as f:
            head = f.readline().split()
            assert head[:2] == ["tlsf-ops", "1"], head
            n, slots, streams, peak = map(int, head[2:])
            ops = [l.split() for l in f]
        assert len(ops) == n
        return self._h({"ops": ops, "slots": slots, "streams": streams, "peak": peak})
    def ops_info(self, h):
        o = self.objs[h]
        return {"ops": len(o["ops"]), "slots": o["slots"], "streams": o["streams"], "peak_live_bytes": o["peak"]}
    def device_used(self):
        return sum(a.reserved for a in DEV) + torch.TORCH.reserved
    def replay(self, ops_h, ad_h, sample=False):
        o, a = self.objs[ops_h], self.objs[ad_h]
        ptr, size = [0] * o["slots"], [0] * o["slots"]
        done = failed = peak = 0
        first = ""
        t0 = time.perf_counter_ns()
        for r in o["ops"]:
            s = int(r[1])
            if r[0] == "a":
                p = a.alloc(int(r[2]))
                if not p:
                    failed += 1
                    first = first or "out of memory"
                    continue
                ptr[s], size[s] = p, int(r[2]); done += 1
                if sample: peak = max(peak, self.device_used())
            elif ptr[s]:
                a.release(ptr[s], size[s]); ptr[s] = 0; done += 1
        el = time.perf_counter_ns() - t0
        left = 0
        for s in range(o["slots"]):
            if ptr[s]:
                a.release(ptr[s], size[s]); left += 1
        return {"elapsed_ns": el, "ops": done, "ns_per_op": el / max(done, 1), "failed": failed, "left": left,
                "peak_device_used": peak, "first_error": first}
    def torch_adapter(self): return self._h(torch.TORCH)
    def cuda_adapter(self):
        c = torch.Cache(keep=False); DEV.append(c); return self._h(c)
    def async_pool(self, max_size=0):
        c = torch.Cache(cap=max_size); DEV.append(c); return self._h(c)
    def async_adapter(self, pool): return pool
    def async_pool_destroy(self, pool):
        c = self.objs[pool]; c.empty()
    def async_pool_stats(self, pool):
        c = self.objs[pool]; return {"peak_reserved": c.peak, "peak_used": 0, "reserved": c.reserved}
    def async_pool_reset_peaks(self, pool):
        c = self.objs[pool]; c.peak = c.reserved
    def cabi_adapter(self, m, f, e, dev):
        class C:
            mal = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(m)
            fre = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p)(f)
            def alloc(self, n): return self.mal(n, 0, None) or 0
            def release(self, p, n): self.fre(p, n, 0, None)
        return self._h(C())
    def versions(self): return {"cuda_driver_api": 13000, "cuda_runtime": 13000, "cudart_headers": 13000}
    def synchronize(self): pass

class Cub:
    def __init__(self, ext): self.ext = ext
    def cub_create(self, g):
        c = torch.Cache(); DEV.append(c); return self.ext._h(c)
    def cub_destroy(self, h):
        c = self.ext.objs[h]; c.empty(); DEV.remove(c)
    def cub_version(self): return 300000

EXT = Ext()
def load_inline(name, **kw):
    if os.environ.get("FAKE_FAIL_CUB") and "cub" in name:
        raise RuntimeError("nvcc: fake failure")
    return EXT if name == "tlsf_peers_replay" else Cub(EXT)
