package device

import (
	"fmt"
	"strings"
)

// Call names one kind of driver call, for counters, latency models and
// fault injection. The String of each is the driver entry point it stands
// for.
type Call int

// The driver calls a Device makes, one per method.
const (
	CallMemGetInfo Call = iota
	CallMemAlloc
	CallMemFree
	CallMemAllocPitch
	CallAddressReserve
	CallAddressFree
	CallMemCreate
	CallMemRelease
	CallMemMap
	CallMemUnmap
	CallMemSetAccess
	CallStreamCreate
	CallStreamDestroy
	CallStreamSynchronize
	CallStreamWaitEvent
	CallEventCreate
	CallEventDestroy
	CallEventRecord
	CallEventQuery
	CallEventSynchronize
	CallMemsetD32
	CallMemsetD32Async
	CallMemcpyDtoH
	// The stream-ordered allocator (AsyncAllocator, async.go).
	CallMemAllocAsync
	CallMemFreeAsync
	CallMemPoolTrimTo
	CallMemPoolGetAttribute
	CallMemPoolSetAttribute
	// Byte fills (ByteSetter, memset.go).
	CallMemsetD8Async
	// Several GPUs (PeerAccessor, peer.go).
	CallCtxEnablePeerAccess
	CallMemcpyDtoDAsync
	NumCalls // the number of Call kinds; not a call
)

var callNames = [NumCalls]string{
	CallMemGetInfo:          "cuMemGetInfo",
	CallMemAlloc:            "cuMemAlloc",
	CallMemFree:             "cuMemFree",
	CallMemAllocPitch:       "cuMemAllocPitch",
	CallAddressReserve:      "cuMemAddressReserve",
	CallAddressFree:         "cuMemAddressFree",
	CallMemCreate:           "cuMemCreate",
	CallMemRelease:          "cuMemRelease",
	CallMemMap:              "cuMemMap",
	CallMemUnmap:            "cuMemUnmap",
	CallMemSetAccess:        "cuMemSetAccess",
	CallStreamCreate:        "cuStreamCreate",
	CallStreamDestroy:       "cuStreamDestroy",
	CallStreamSynchronize:   "cuStreamSynchronize",
	CallStreamWaitEvent:     "cuStreamWaitEvent",
	CallEventCreate:         "cuEventCreate",
	CallEventDestroy:        "cuEventDestroy",
	CallEventRecord:         "cuEventRecord",
	CallEventQuery:          "cuEventQuery",
	CallEventSynchronize:    "cuEventSynchronize",
	CallMemsetD32:           "cuMemsetD32",
	CallMemsetD32Async:      "cuMemsetD32Async",
	CallMemcpyDtoH:          "cuMemcpyDtoH",
	CallMemAllocAsync:       "cuMemAllocAsync",
	CallMemFreeAsync:        "cuMemFreeAsync",
	CallMemPoolTrimTo:       "cuMemPoolTrimTo",
	CallMemPoolGetAttribute: "cuMemPoolGetAttribute",
	CallMemPoolSetAttribute: "cuMemPoolSetAttribute",
	CallMemsetD8Async:       "cuMemsetD8Async",
	CallCtxEnablePeerAccess: "cuCtxEnablePeerAccess",
	CallMemcpyDtoDAsync:     "cuMemcpyDtoDAsync",
}

// String returns the driver entry point's name, e.g. "cuMemAlloc".
func (c Call) String() string {
	if c >= 0 && c < NumCalls {
		return callNames[c]
	}
	return "Call(?)"
}

// Counts holds a count per Call kind.
type Counts [NumCalls]uint64

// Total is the sum over all kinds.
func (c Counts) Total() uint64 {
	var t uint64
	for _, n := range c {
		t += n
	}
	return t
}

// Map returns the non-zero counts keyed by driver entry point name.
func (c Counts) Map() map[string]uint64 {
	m := make(map[string]uint64)
	for k, n := range c {
		if n != 0 {
			m[Call(k).String()] = n
		}
	}
	return m
}

// String lists the non-zero counts by driver entry point, e.g.
// "cuMemCreate=3 cuMemMap=3".
func (c Counts) String() string {
	var b strings.Builder
	for k, n := range c {
		if n != 0 {
			if b.Len() > 0 {
				b.WriteByte(' ')
			}
			fmt.Fprintf(&b, "%v=%d", Call(k), n)
		}
	}
	return b.String()
}
