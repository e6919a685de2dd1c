package pool

// In assembly (bias_amd64.s), so that the compiler neither reorders nor
// drops the plain stores the biased lock relies on.

// biasEnter is biasMutex.enter's check and store.
//
//go:noescape
func biasEnter(gate *uintptr, busy *uint32) bool

// storeRelease stores val to *addr with release order (no load or store
// before it is seen after it) and no locked instruction: sync/atomic's
// Store is an XCHG on amd64, a locked instruction as costly as the
// mutex's.
//
//go:noescape
func storeRelease(addr *uint32, val uint32)

// curg returns the running goroutine's identity (its g's address).
func curg() uintptr
