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

// callNames are the driver entry points, in Call order (call_test.go
// checks there is one per Call).
var callNames = strings.Fields(`
	cuMemGetInfo cuMemAlloc cuMemFree cuMemAllocPitch
	cuMemAddressReserve cuMemAddressFree cuMemCreate cuMemRelease
	cuMemMap cuMemUnmap cuMemSetAccess cuStreamCreate
	cuStreamDestroy cuStreamSynchronize cuStreamWaitEvent cuEventCreate
	cuEventDestroy cuEventRecord cuEventQuery cuEventSynchronize
	cuMemsetD32 cuMemsetD32Async cuMemcpyDtoH cuMemAllocAsync
	cuMemFreeAsync cuMemPoolTrimTo cuMemPoolGetAttribute cuMemPoolSetAttribute
	cuMemsetD8Async cuCtxEnablePeerAccess cuMemcpyDtoDAsync
`)

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
