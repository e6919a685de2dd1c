package device

import "testing"

func TestCallNames(t *testing.T) {
	if len(callNames) != int(NumCalls) {
		t.Fatalf("%d call names for %d calls", len(callNames), NumCalls)
	}
	for c, want := range map[Call]string{
		CallMemGetInfo: "cuMemGetInfo", CallAddressReserve: "cuMemAddressReserve",
		CallMemcpyDtoDAsync: "cuMemcpyDtoDAsync", NumCalls: "Call(?)",
	} {
		if got := c.String(); got != want {
			t.Errorf("Call(%d).String() = %q, want %q", int(c), got, want)
		}
	}
}

func TestMemPoolAttributeNames(t *testing.T) {
	for a, want := range map[MemPoolAttribute]string{
		MemPoolReleaseThreshold: "CU_MEMPOOL_ATTR_RELEASE_THRESHOLD",
		MemPoolUsedMemHigh:      "CU_MEMPOOL_ATTR_USED_MEM_HIGH",
		MemPoolAttribute(1):     "MemPoolAttribute(1)",
	} {
		if got := a.String(); got != want {
			t.Errorf("%d: %q, want %q", int(a), got, want)
		}
	}
}
