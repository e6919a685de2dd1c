package nvtx

// Go mirrors of the C structures the tool reads or keeps, for 64-bit
// Linux (LP64: size_t, pointers and function pointers are 8 bytes). The
// field names are the headers'; layout_test.go asserts sizes and offsets.

// NVTX constants (nvToolsExt.h, nvtxDetail/nvtxTypes.h, nvToolsExtMem.h).
const (
	nvtxVersion = 3 // NVTX_VERSION

	etidCallbacks   = 1 // NVTX_ETID_CALLBACKS
	etidVersionInfo = 3 // NVTX_ETID_VERSIONINFO

	extModuleIDMem = 1      // NVTX_EXT_MODULEID_MEM
	extCompatIDMem = 0x0102 // NVTX_EXT_COMPATID_MEM

	memHeapUsageSubAllocator = 1 // NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR
	memTypeVirtualAddress    = 1 // NVTX_MEM_TYPE_VIRTUAL_ADDRESS
	memRegionRefTypePointer  = 1 // NVTX_MEM_REGION_REF_TYPE_POINTER

	// The memory extension's function slots, as the CUDA 13 toolkit's
	// nvToolsExtMem.h numbers them (NVTX3EXT_CBID_*, 0-based: the
	// loader's slot array holds the module state at [0] and function ID
	// i at [i+1], i.e. the segment's functionSlots[i]), and the segment
	// it declares (nvtxDetail/nvtxExtImplMem_v1.h: segment ID 1,
	// NVTX_EXT_MEM_SLOT_COUNT = 63). compute-sanitizer 2025.3.1 fills 17
	// slots, 0 to 16, of a segment with ID 1 and none of a segment with
	// ID 0, the layout of older NVTX releases on GitHub (1-based IDs,
	// segment 0, 17 slots).
	cbidMemHeapRegister      = 0
	cbidMemHeapUnregister    = 1
	cbidMemHeapReset         = 2
	cbidMemRegionsRegister   = 3
	cbidMemRegionsUnregister = 5
	memSegmentID             = 1
	memSlotCount             = 63

	cbidCore2DomainCreateA    = 12 // NVTX_CBID_CORE2_DomainCreateA
	memHeapHandleNoTool       = ^uintptr(0)
	maxSlotsPerSegmentAllowed = 64 // slots mapped for the segment: room for newer headers' 63
)

// Core callback modules (NvtxCallbackModule) and the number of entries
// of each one's function table (NVTX_CBID_<module>_SIZE): the tool checks
// the size it is given against its own.
var moduleSizes = [...]uint32{
	1: 16, // NVTX_CB_MODULE_CORE: NVTX_CBID_CORE_SIZE
	2: 9,  // NVTX_CB_MODULE_CUDA: NVTX_CBID_CUDA_SIZE
	3: 15, // NVTX_CB_MODULE_OPENCL: NVTX_CBID_OPENCL_SIZE
	4: 7,  // NVTX_CB_MODULE_CUDART: NVTX_CBID_CUDART_SIZE
	5: 16, // NVTX_CB_MODULE_CORE2: NVTX_CBID_CORE2_SIZE
	6: 7,  // NVTX_CB_MODULE_SYNC: NVTX_CBID_SYNC_SIZE
}

const (
	moduleCore2 = 5
	numModules  = len(moduleSizes) // 7: index 0 is NVTX_CB_MODULE_INVALID
)

// exportTableCallbacks is NvtxExportTableCallbacks.
type exportTableCallbacks struct {
	structSize             uint64  // sizeof(NvtxExportTableCallbacks)
	getModuleFunctionTable uintptr // int (*)(NvtxCallbackModule, NvtxFunctionTable*, unsigned int*)
}

// exportTableVersionInfo is NvtxExportTableVersionInfo.
type exportTableVersionInfo struct {
	structSize              uint64 // sizeof(NvtxExportTableVersionInfo)
	version                 uint32 // NVTX_VERSION
	reserved0               uint32
	setInjectionNvtxVersion uintptr // void (*)(uint32_t)
}

// extModuleSegment is nvtxExtModuleSegment_t.
type extModuleSegment struct {
	segmentID     uint64
	slotCount     uint64
	functionSlots uintptr // intptr_t*, indexed by callback ID
}

// extModuleInfo is nvtxExtModuleInfo_t.
type extModuleInfo struct {
	nvtxVer           uint16
	structSize        uint16
	moduleID          uint16
	compatID          uint16
	segmentsCount     uint64
	segments          uintptr // nvtxExtModuleSegment_t*
	getExportFunction uintptr // NvtxExtGetExportFunction_t; none needed
	extInfo           uintptr
}

// memVirtualRangeDesc is nvtxMemVirtualRangeDesc_t: size first.
type memVirtualRangeDesc struct {
	size uint64
	ptr  uintptr
}

// memHeapDesc is nvtxMemHeapDesc_t.
type memHeapDesc struct {
	extCompatID          uint16
	structSize           uint16
	reserved0            uint32
	usage                uint32
	typ                  uint32 // "type"
	typeSpecificDescSize uint64
	typeSpecificDesc     uintptr
	category             uint32
	messageType          uint32
	message              uintptr // nvtxMessageValue_t, a union of pointers
}

// memRegionsRegisterBatch is nvtxMemRegionsRegisterBatch_t.
type memRegionsRegisterBatch struct {
	extCompatID             uint16
	structSize              uint16
	regionType              uint32
	heap                    uintptr
	regionCount             uint64
	regionDescElementSize   uint64
	regionDescElements      uintptr
	regionHandleElementsOut uintptr
}

// memRegionsUnregisterBatch is nvtxMemRegionsUnregisterBatch_t.
type memRegionsUnregisterBatch struct {
	extCompatID    uint16
	structSize     uint16
	refType        uint32
	refCount       uint64
	refElementSize uint64
	refElements    uintptr // nvtxMemRegionRef_t const*: a union of pointers
}
