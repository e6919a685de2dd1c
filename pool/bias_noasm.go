//go:build !amd64

package pool

import "sync/atomic"

// Where biasable is false: never called with a gate open.

func biasEnter(gate *uintptr, busy *uint32) bool { return false }

func storeRelease(addr *uint32, val uint32) { atomic.StoreUint32(addr, val) }

func curg() uintptr { return 0 }
