package nvtx

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"unsafe"

	"github.com/ebitengine/purego"
)

// InjectionEnv names the injection library a tool asks a program to load
// (64-bit programs).
const InjectionEnv = "NVTX_INJECTION64_PATH"

// DebugEnv, set to 1, makes the client write every call it makes to the
// tool on standard error: for finding out what a tool accepts.
const DebugEnv = "TLSF_NVTX_DEBUG"

// SegmentEnv overrides the memory extension's segment as "id:slots"
// (default "1:63", the CUDA 13 toolkit's layout; "0:17" is older NVTX
// releases'): for trying a tool that expects another layout.
const SegmentEnv = "TLSF_NVTX_SEGMENT"

// Errors from Open.
var (
	// ErrNoTool: the library could not be loaded, lacks an entry point,
	// or its initialisation returned failure.
	ErrNoTool = errors.New("nvtx: no usable injection library")
	// ErrNoMemoryAPI: the tool attached but did not provide the memory
	// API's heap and region functions.
	ErrNoMemoryAPI = errors.New("nvtx: the tool does not implement the memory API")
)

// Client is an attached tool's memory API. Methods are safe for
// concurrent use (serialized by a mutex) and cost one C call each.
type Client struct {
	mu     sync.Mutex
	a      *arena
	domain uintptr
	debug  bool

	heapRegister, heapUnregister, heapReset uintptr // tool functions
	regionsRegister, regionsUnregister      uintptr

	scratch uintptr // descriptors of the call in progress (mu held)
}

var (
	defaultOnce   sync.Once
	defaultClient *Client
	defaultErr    error
)

// Default returns the process's client, attaching on the first call to
// the library NVTX_INJECTION64_PATH names; nil when the variable is unset
// or attaching failed (DefaultError says why). A tool attaches once per
// process, so every caller shares this client.
func Default() *Client {
	defaultOnce.Do(func() {
		path := os.Getenv(InjectionEnv)
		if path == "" {
			return
		}
		defaultClient, defaultErr = Open(path)
		if defaultErr != nil && os.Getenv(DebugEnv) == "1" {
			fmt.Fprintf(os.Stderr, "nvtx: %v\n", defaultErr)
		}
	})
	return defaultClient
}

// DefaultError returns why Default returned nil with the variable set,
// or nil.
func DefaultError() error {
	Default()
	return defaultErr
}

// Open attaches to the injection library at path (as dlopen finds it)
// and initialises the core and memory-extension tables (see the package
// comment). Call it once per process: tools do not expect a second
// attachment. Errors: ErrNoTool, ErrNoMemoryAPI.
func Open(path string) (*Client, error) {
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_GLOBAL)
	if err != nil {
		return nil, fmt.Errorf("%w: dlopen %s: %v", ErrNoTool, path, err)
	}
	initCore, err := purego.Dlsym(lib, "InitializeInjectionNvtx2")
	if err != nil || initCore == 0 {
		return nil, fmt.Errorf("%w: %s has no InitializeInjectionNvtx2", ErrNoTool, path)
	}
	initExt, err := purego.Dlsym(lib, "InitializeInjectionNvtxExtension")
	if err != nil || initExt == 0 {
		return nil, fmt.Errorf("%w: %s has no InitializeInjectionNvtxExtension", ErrNoTool, path)
	}
	a, err := newArena(arenaBytes)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrNoTool, err)
	}
	c := &Client{a: a, debug: os.Getenv(DebugEnv) == "1"}
	core := a.newCoreTables()
	if r, _, _ := purego.SyscallN(initCore, core.getExportTable); int32(r) == 0 {
		return nil, fmt.Errorf("%w: InitializeInjectionNvtx2 returned 0", ErrNoTool)
	}
	// A domain of our own, if the tool creates domains; else the default
	// domain (NULL), which the memory API accepts too.
	if create := core.slot(moduleCore2, cbidCore2DomainCreateA); create != 0 {
		name := a.cString("tlsf")
		r, _, _ := purego.SyscallN(create, name)
		c.domain = r
	}
	segID, slots := uint64(memSegmentID), uint64(memSlotCount)
	if v := os.Getenv(SegmentEnv); v != "" {
		if id, n, ok := parseSegment(v); ok {
			segID, slots = id, n
		}
	}
	fn := a.alloc(maxSlotsPerSegmentAllowed*8, 8)
	seg := (*extModuleSegment)(a.ptr(a.alloc(unsafe.Sizeof(extModuleSegment{}), 8)))
	*seg = extModuleSegment{segmentID: segID, slotCount: slots, functionSlots: fn}
	info := (*extModuleInfo)(a.ptr(a.alloc(unsafe.Sizeof(extModuleInfo{}), 8)))
	*info = extModuleInfo{
		nvtxVer: nvtxVersion, structSize: uint16(unsafe.Sizeof(extModuleInfo{})),
		moduleID: extModuleIDMem, compatID: extCompatIDMem,
		segmentsCount: 1, segments: a.addr(unsafe.Pointer(seg)),
	}
	if r, _, _ := purego.SyscallN(initExt, a.addr(unsafe.Pointer(info))); int32(r) == 0 {
		return nil, fmt.Errorf("%w: InitializeInjectionNvtxExtension returned 0", ErrNoTool)
	}
	slot := func(cbid int) uintptr { return *(*uintptr)(a.ptr(fn + uintptr(cbid)*8)) }
	c.heapRegister = slot(cbidMemHeapRegister)
	c.heapUnregister = slot(cbidMemHeapUnregister)
	c.heapReset = slot(cbidMemHeapReset)
	c.regionsRegister = slot(cbidMemRegionsRegister)
	c.regionsUnregister = slot(cbidMemRegionsUnregister)
	if c.debug {
		var filled []string
		for i := 0; i < maxSlotsPerSegmentAllowed; i++ {
			if s := slot(i); s != 0 {
				filled = append(filled, strconv.Itoa(i))
			}
		}
		fmt.Fprintf(os.Stderr, "nvtx: attached to %s: domain %#x, segment %d of %d slots, filled slots [%s]\n",
			path, c.domain, segID, slots, strings.Join(filled, " "))
	}
	if c.heapRegister == 0 || c.regionsRegister == 0 || c.regionsUnregister == 0 {
		return nil, fmt.Errorf("%w (segment %d, %d slots)", ErrNoMemoryAPI, segID, slots)
	}
	c.scratch = a.alloc(scratchBytes, 8)
	return c, nil
}

func parseSegment(v string) (id, n uint64, ok bool) {
	a, b, found := strings.Cut(v, ":")
	if !found {
		return 0, 0, false
	}
	id, err1 := strconv.ParseUint(a, 10, 64)
	n, err2 := strconv.ParseUint(b, 10, 64)
	if err1 != nil || err2 != nil || n == 0 || n > maxSlotsPerSegmentAllowed {
		return 0, 0, false
	}
	return id, n, true
}

// scratchBytes holds the largest call's descriptors: a heap descriptor
// and its range (48 + 16 bytes), rounded up.
const scratchBytes = 256

// HeapRegister shows [base, base+size) of device memory to the tool as a
// sub-allocator's heap (usage NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR,
// type NVTX_MEM_TYPE_VIRTUAL_ADDRESS; nvtxMemHeapRegister) and returns
// its handle, 0 if the tool returned none. The tool then reports accesses
// to the heap outside registered regions.
func (c *Client) HeapRegister(base uintptr, size uint64) uintptr {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.a
	rng := (*memVirtualRangeDesc)(a.ptr(c.scratch + 64))
	*rng = memVirtualRangeDesc{size: size, ptr: base}
	desc := (*memHeapDesc)(a.ptr(c.scratch))
	*desc = memHeapDesc{
		extCompatID: extCompatIDMem, structSize: uint16(unsafe.Sizeof(memHeapDesc{})),
		usage: memHeapUsageSubAllocator, typ: memTypeVirtualAddress,
		typeSpecificDescSize: uint64(unsafe.Sizeof(memVirtualRangeDesc{})),
		typeSpecificDesc:     c.scratch + 64,
	}
	r, _, _ := purego.SyscallN(c.heapRegister, c.domain, c.scratch)
	if r == memHeapHandleNoTool {
		r = 0
	}
	c.trace("heap register [%#x, +%d) -> %#x", base, size, r)
	return r
}

// HeapUnregister forgets a heap and every region in it
// (nvtxMemHeapUnregister). A zero handle does nothing.
func (c *Client) HeapUnregister(heap uintptr) { c.heapCall(c.heapUnregister, heap, "heap unregister") }

// HeapReset forgets every region of a heap, keeping the heap
// (nvtxMemHeapReset). A zero handle does nothing.
func (c *Client) HeapReset(heap uintptr) { c.heapCall(c.heapReset, heap, "heap reset") }

// heapCall calls slot fn (a function of the domain and a heap handle) for
// heap, unless either is zero.
func (c *Client) heapCall(fn, heap uintptr, what string) {
	if heap == 0 || fn == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	purego.SyscallN(fn, c.domain, heap)
	c.trace("%s %#x", what, heap)
}

// RegionRegister shows [ptr, ptr+size) of heap as a block in use
// (nvtxMemRegionsRegister, one region of type
// NVTX_MEM_TYPE_VIRTUAL_ADDRESS, no handle asked for: the pointer is the
// region's reference).
func (c *Client) RegionRegister(heap, ptr uintptr, size uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.a
	rng := (*memVirtualRangeDesc)(a.ptr(c.scratch + 64))
	*rng = memVirtualRangeDesc{size: size, ptr: ptr}
	b := (*memRegionsRegisterBatch)(a.ptr(c.scratch))
	*b = memRegionsRegisterBatch{
		extCompatID: extCompatIDMem, structSize: uint16(unsafe.Sizeof(memRegionsRegisterBatch{})),
		regionType: memTypeVirtualAddress, heap: heap,
		regionCount: 1, regionDescElementSize: uint64(unsafe.Sizeof(memVirtualRangeDesc{})),
		regionDescElements: c.scratch + 64,
	}
	purego.SyscallN(c.regionsRegister, c.domain, c.scratch)
	c.trace("region register [%#x, +%d) in %#x", ptr, size, heap)
}

// RegionUnregister forgets the region at ptr (nvtxMemRegionsUnregister,
// by pointer).
func (c *Client) RegionUnregister(ptr uintptr) {
	c.mu.Lock()
	defer c.mu.Unlock()
	a := c.a
	*(*uintptr)(a.ptr(c.scratch + 64)) = ptr // nvtxMemRegionRef_t
	b := (*memRegionsUnregisterBatch)(a.ptr(c.scratch))
	*b = memRegionsUnregisterBatch{
		extCompatID: extCompatIDMem, structSize: uint16(unsafe.Sizeof(memRegionsUnregisterBatch{})),
		refType: memRegionRefTypePointer, refCount: 1, refElementSize: 8,
		refElements: c.scratch + 64,
	}
	purego.SyscallN(c.regionsUnregister, c.domain, c.scratch)
	c.trace("region unregister %#x", ptr)
}

func (c *Client) trace(format string, args ...any) {
	if c.debug {
		fmt.Fprintf(os.Stderr, "nvtx: "+format+"\n", args...)
	}
}

// arenaBytes is the mapping for tables and descriptors: the six core
// function tables and their slots (under 2 KiB), the segment's slots,
// the export tables, module info and scratch, with room to spare.
const arenaBytes = 1 << 16

// arena is memory outside the Go heap, never freed: the tool may keep
// pointers into it for the life of the process.
type arena struct {
	mem  []byte // from syscall.Mmap
	used uintptr
}

func newArena(n int) (*arena, error) {
	mem, err := syscall.Mmap(-1, 0, n, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("mapping %d bytes for NVTX tables: %w", n, err)
	}
	return &arena{mem: mem}, nil
}

// alloc returns the address of n zeroed bytes aligned to align.
func (a *arena) alloc(n, align uintptr) uintptr {
	off := (a.used + align - 1) &^ (align - 1)
	if off+n > uintptr(len(a.mem)) {
		panic("nvtx: arena exhausted") // sizes are fixed: not reached
	}
	a.used = off + n
	return a.addr(unsafe.Pointer(&a.mem[off]))
}

func (a *arena) addr(p unsafe.Pointer) uintptr { return uintptr(p) }

// ptr turns an address inside the arena back into a pointer.
func (a *arena) ptr(addr uintptr) unsafe.Pointer {
	return unsafe.Pointer(&a.mem[addr-uintptr(unsafe.Pointer(&a.mem[0]))])
}

// cString copies s, NUL-terminated, into the arena.
func (a *arena) cString(s string) uintptr {
	p := a.alloc(uintptr(len(s)+1), 1)
	copy(unsafe.Slice((*byte)(a.ptr(p)), len(s)+1), s)
	return p
}

// coreTables are the export tables and per-module function tables the
// tool gets from nvtxGetExportTable.
type coreTables struct {
	a              *arena
	getExportTable uintptr // the callback passed to InitializeInjectionNvtx2
	callbacks      uintptr // *exportTableCallbacks
	versionInfo    uintptr // *exportTableVersionInfo
	tables         [numModules]uintptr
	slots          [numModules]uintptr
}

// newCoreTables lays out the tables and makes the callbacks. Each
// module's function table has size+1 entries: entry i (1 ≤ i < size)
// points to slot i, which the tool may fill with its function for
// callback ID i; entry 0 points to a slot nobody reads, and the last is
// NULL, as in NVTX's own tables.
func (a *arena) newCoreTables() *coreTables {
	t := &coreTables{a: a}
	for m := 1; m < numModules; m++ {
		n := uintptr(moduleSizes[m])
		t.slots[m] = a.alloc(n*8, 8)
		t.tables[m] = a.alloc((n+1)*8, 8)
		tab := unsafe.Slice((*uintptr)(a.ptr(t.tables[m])), n+1)
		for i := uintptr(0); i < n; i++ {
			tab[i] = t.slots[m] + i*8
		}
	}
	t.callbacks = a.alloc(unsafe.Sizeof(exportTableCallbacks{}), 8)
	*(*exportTableCallbacks)(a.ptr(t.callbacks)) = exportTableCallbacks{
		structSize:             uint64(unsafe.Sizeof(exportTableCallbacks{})),
		getModuleFunctionTable: purego.NewCallback(t.getModuleFunctionTable),
	}
	t.versionInfo = a.alloc(unsafe.Sizeof(exportTableVersionInfo{}), 8)
	*(*exportTableVersionInfo)(a.ptr(t.versionInfo)) = exportTableVersionInfo{
		structSize:              uint64(unsafe.Sizeof(exportTableVersionInfo{})),
		version:                 nvtxVersion,
		setInjectionNvtxVersion: purego.NewCallback(func(uintptr) {}),
	}
	t.getExportTable = purego.NewCallback(t.exportTable)
	return t
}

// exportTable is nvtxGetExportTable: const void* (uint32_t id).
func (t *coreTables) exportTable(id uintptr) uintptr {
	switch uint32(id) {
	case etidCallbacks:
		return t.callbacks
	case etidVersionInfo:
		return t.versionInfo
	}
	return 0
}

// getModuleFunctionTable is NvtxExportTableCallbacks.GetModuleFunctionTable:
// int (NvtxCallbackModule module, NvtxFunctionTable* out_table,
// unsigned int* out_size). The out pointers are the tool's memory.
func (t *coreTables) getModuleFunctionTable(module, outTable, outSize uintptr) uintptr {
	m := int(uint32(module))
	if m <= 0 || m >= numModules {
		return 0
	}
	if outTable != 0 {
		*(*uintptr)(foreign(outTable)) = t.tables[m]
	}
	if outSize != 0 {
		*(*uint32)(foreign(outSize)) = moduleSizes[m]
	}
	return 1
}

// slot returns what the tool wrote in module m's slot for callback id.
func (t *coreTables) slot(m, id int) uintptr {
	if id <= 0 || id >= int(moduleSizes[m]) {
		return 0
	}
	return *(*uintptr)(t.a.ptr(t.slots[m] + uintptr(id)*8))
}

// foreign turns an address of C memory (never the Go heap) into a
// pointer.
func foreign(addr uintptr) unsafe.Pointer {
	return *(*unsafe.Pointer)(unsafe.Pointer(&addr))
}
