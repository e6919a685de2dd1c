package nvtx

import (
	"testing"
	"unsafe"

	"github.com/stretchr/testify/require"
)

// Sizes and offsets of the C structures on 64-bit Linux, worked out from
// the headers (nvtxDetail/nvtxTypes.h, nvtxDetail/nvtxExtTypes.h,
// nvToolsExtMem.h) by the C layout rules: each field at the next multiple
// of its alignment, the struct padded to its largest alignment.
func TestLayoutsMatchTheHeaders(t *testing.T) {
	type field struct {
		name string
		got  uintptr
		want uintptr
	}
	var cb exportTableCallbacks
	var vi exportTableVersionInfo
	var seg extModuleSegment
	var mi extModuleInfo
	var vr memVirtualRangeDesc
	var hd memHeapDesc
	var rr memRegionsRegisterBatch
	var ru memRegionsUnregisterBatch
	for _, c := range []struct {
		name   string
		size   uintptr
		want   uintptr
		fields []field
	}{
		{"NvtxExportTableCallbacks", unsafe.Sizeof(cb), 16, []field{
			{"GetModuleFunctionTable", unsafe.Offsetof(cb.getModuleFunctionTable), 8}}},
		{"NvtxExportTableVersionInfo", unsafe.Sizeof(vi), 24, []field{
			{"version", unsafe.Offsetof(vi.version), 8},
			{"reserved0", unsafe.Offsetof(vi.reserved0), 12},
			{"SetInjectionNvtxVersion", unsafe.Offsetof(vi.setInjectionNvtxVersion), 16}}},
		{"nvtxExtModuleSegment_t", unsafe.Sizeof(seg), 24, []field{
			{"slotCount", unsafe.Offsetof(seg.slotCount), 8},
			{"functionSlots", unsafe.Offsetof(seg.functionSlots), 16}}},
		{"nvtxExtModuleInfo_t", unsafe.Sizeof(mi), 40, []field{
			{"structSize", unsafe.Offsetof(mi.structSize), 2},
			{"moduleId", unsafe.Offsetof(mi.moduleID), 4},
			{"compatId", unsafe.Offsetof(mi.compatID), 6},
			{"segmentsCount", unsafe.Offsetof(mi.segmentsCount), 8},
			{"segments", unsafe.Offsetof(mi.segments), 16},
			{"getExportFunction", unsafe.Offsetof(mi.getExportFunction), 24},
			{"extInfo", unsafe.Offsetof(mi.extInfo), 32}}},
		{"nvtxMemVirtualRangeDesc_t", unsafe.Sizeof(vr), 16, []field{
			{"size", unsafe.Offsetof(vr.size), 0},
			{"ptr", unsafe.Offsetof(vr.ptr), 8}}},
		{"nvtxMemHeapDesc_t", unsafe.Sizeof(hd), 48, []field{
			{"structSize", unsafe.Offsetof(hd.structSize), 2},
			{"reserved0", unsafe.Offsetof(hd.reserved0), 4},
			{"usage", unsafe.Offsetof(hd.usage), 8},
			{"type", unsafe.Offsetof(hd.typ), 12},
			{"typeSpecificDescSize", unsafe.Offsetof(hd.typeSpecificDescSize), 16},
			{"typeSpecificDesc", unsafe.Offsetof(hd.typeSpecificDesc), 24},
			{"category", unsafe.Offsetof(hd.category), 32},
			{"messageType", unsafe.Offsetof(hd.messageType), 36},
			{"message", unsafe.Offsetof(hd.message), 40}}},
		{"nvtxMemRegionsRegisterBatch_t", unsafe.Sizeof(rr), 48, []field{
			{"regionType", unsafe.Offsetof(rr.regionType), 4},
			{"heap", unsafe.Offsetof(rr.heap), 8},
			{"regionCount", unsafe.Offsetof(rr.regionCount), 16},
			{"regionDescElementSize", unsafe.Offsetof(rr.regionDescElementSize), 24},
			{"regionDescElements", unsafe.Offsetof(rr.regionDescElements), 32},
			{"regionHandleElementsOut", unsafe.Offsetof(rr.regionHandleElementsOut), 40}}},
		{"nvtxMemRegionsUnregisterBatch_t", unsafe.Sizeof(ru), 32, []field{
			{"refType", unsafe.Offsetof(ru.refType), 4},
			{"refCount", unsafe.Offsetof(ru.refCount), 8},
			{"refElementSize", unsafe.Offsetof(ru.refElementSize), 16},
			{"refElements", unsafe.Offsetof(ru.refElements), 24}}},
	} {
		require.Equal(t, c.want, c.size, "sizeof(%s)", c.name)
		for _, f := range c.fields {
			require.Equal(t, f.want, f.got, "offsetof(%s, %s)", c.name, f.name)
		}
	}
}

// The tables handed to the tool: the export tables by ID, and for each
// core module a table of NVTX_CBID_<module>_SIZE entries (plus a NULL)
// whose entry i points to slot i.
func TestCoreTables(t *testing.T) {
	a, err := newArena(arenaBytes)
	require.NoError(t, err)
	ct := a.newCoreTables()
	require.Equal(t, ct.callbacks, ct.exportTable(etidCallbacks))
	require.Equal(t, ct.versionInfo, ct.exportTable(etidVersionInfo))
	require.Zero(t, ct.exportTable(2), "NVTX_ETID_RESERVED0")
	require.Zero(t, ct.exportTable(1<<32), "ID 0 (high bits of the register ignored) is invalid")
	require.Equal(t, ct.callbacks, ct.exportTable(1<<40|etidCallbacks), "only the low 32 bits are the ID")
	vi := (*exportTableVersionInfo)(a.ptr(ct.versionInfo))
	require.Equal(t, uint32(3), vi.version)
	require.Equal(t, uint64(24), vi.structSize)

	want := map[int]uint32{1: 16, 2: 9, 3: 15, 4: 7, 5: 16, 6: 7}
	for m, n := range want {
		var table uintptr
		var size uint32
		require.Equal(t, uintptr(1), ct.getModuleFunctionTable(uintptr(m), uintptr(unsafe.Pointer(&table)), uintptr(unsafe.Pointer(&size))))
		require.Equal(t, n, size, "module %d", m)
		entries := unsafe.Slice((*uintptr)(a.ptr(table)), n+1)
		require.Zero(t, entries[n], "module %d: the table ends with NULL", m)
		for i := 1; i < int(n); i++ {
			// The tool writes its function through entry i.
			*(*uintptr)(a.ptr(entries[i])) = uintptr(0x1000 + i)
			require.Equal(t, uintptr(0x1000+i), ct.slot(m, i))
		}
		require.Zero(t, ct.slot(m, int(n)), "past the table")
	}
	var table uintptr
	require.Zero(t, ct.getModuleFunctionTable(0, uintptr(unsafe.Pointer(&table)), 0))
	require.Zero(t, ct.getModuleFunctionTable(7, uintptr(unsafe.Pointer(&table)), 0))
	require.Zero(t, table)
}

func TestParseSegment(t *testing.T) {
	for _, c := range []struct {
		in     string
		id, n  uint64
		wantOK bool
	}{
		{"0:17", 0, 17, true},
		{"1:63", 1, 63, true},
		{"1:65", 0, 0, false},
		{"1:0", 0, 0, false},
		{"17", 0, 0, false},
		{"a:b", 0, 0, false},
	} {
		id, n, ok := parseSegment(c.in)
		require.Equal(t, c.wantOK, ok, c.in)
		require.Equal(t, c.id, id, c.in)
		require.Equal(t, c.n, n, c.in)
	}
}

func TestOpenWithoutTool(t *testing.T) {
	_, err := Open("/nonexistent/libno-such-tool.so")
	require.ErrorIs(t, err, ErrNoTool)
	_, err = Open("libc.so.6") // loads, but has no NVTX entry point
	require.ErrorIs(t, err, ErrNoTool)
}

func TestDefaultWithoutVariable(t *testing.T) {
	t.Setenv(InjectionEnv, "")
	if defaultClient != nil {
		t.Skip("a tool is attached")
	}
	require.Nil(t, Default())
	require.NoError(t, DefaultError())
}
