# Can one physical allocation (cuMemCreate) be mapped in pieces: part of it (offset 0, a
# size below the handle's), or from a nonzero offset? If so, memory could move at page
# grain out of large handles. ctypes on libcuda.so.1; run on the GPU machine:
#   python3 bench/multi/h200/2026-12-04/offset.py
import ctypes as C, time, statistics, sys
cu = C.CDLL("libcuda.so.1")
def ck(r, what):
    if r != 0:
        s = C.c_char_p()
        cu.cuGetErrorString(r, C.byref(s))
        raise SystemExit("%s: %d %s" % (what, r, s.value))
ck(cu.cuInit(0), "cuInit")
dev = C.c_int()
ck(cu.cuDeviceGet(C.byref(dev), 0), "cuDeviceGet")
ctx = C.c_void_p()
ck(cu.cuDevicePrimaryCtxRetain(C.byref(ctx), dev), "retain")
ck(cu.cuCtxSetCurrent(ctx), "setcurrent")
class Loc(C.Structure): _fields_ = [("type", C.c_int), ("id", C.c_int)]
class Flags(C.Structure): _fields_ = [("compressionType", C.c_ubyte), ("gpuDirectRDMACapable", C.c_ubyte), ("usage", C.c_ushort), ("reserved", C.c_ubyte*4)]
class Prop(C.Structure): _fields_ = [("type", C.c_int), ("requestedHandleTypes", C.c_int), ("location", Loc), ("win32HandleMetaData", C.c_void_p), ("allocFlags", Flags)]
prop = Prop(); prop.type = 1; prop.location = Loc(1, 0)
gran = C.c_size_t()
ck(cu.cuMemGetAllocationGranularity(C.byref(gran), C.byref(prop), 0), "gran")
g = gran.value
ver = C.c_int()
ck(cu.cuDriverGetVersion(C.byref(ver)), "version")
print("driver API version", ver.value, "granularity", g)
cu.cuMemAddressReserve.argtypes = [C.POINTER(C.c_uint64), C.c_size_t, C.c_size_t, C.c_uint64, C.c_ulonglong]
cu.cuMemCreate.argtypes = [C.POINTER(C.c_uint64), C.c_size_t, C.POINTER(Prop), C.c_ulonglong]
cu.cuMemMap.argtypes = [C.c_uint64, C.c_size_t, C.c_size_t, C.c_uint64, C.c_ulonglong]
cu.cuMemUnmap.argtypes = [C.c_uint64, C.c_size_t]
cu.cuMemRelease.argtypes = [C.c_uint64]
PAGES = 64
va = C.c_uint64()
ck(cu.cuMemAddressReserve(C.byref(va), 4 * PAGES * g, g, 0, 0), "reserve")
base = va.value
h = C.c_uint64()
ck(cu.cuMemCreate(C.byref(h), PAGES * g, C.byref(prop), 0), "create")
def attempt(what, size, offset):
    r = cu.cuMemMap(base, size, offset, h.value, 0)
    s = C.c_char_p()
    cu.cuGetErrorString(r, C.byref(s))
    print("%s (size %d pages, offset %d pages): %d %s" % (what, size // g, offset // g, r, s.value.decode()))
    if r == 0:
        ck(cu.cuMemUnmap(base, size), "unmap")
attempt("the whole handle", PAGES * g, 0)
attempt("its first page", g, 0)
attempt("its first half", PAGES * g // 2, 0)
attempt("its sixth page", g, 5 * g)
attempt("its second half", PAGES * g // 2, PAGES * g // 2)
ck(cu.cuMemRelease(h.value), "release")
