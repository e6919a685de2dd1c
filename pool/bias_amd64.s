#include "textflag.h"

// func biasEnter(gate *uintptr, busy *uint32) bool
// biasMutex.enter's check: if *gate is the running goroutine (its g,
// loaded from thread-local storage), store 1 to *busy, then read *gate
// again; true if it still names the goroutine, else store 0 back.
// Plain MOVs: no locked instruction.
TEXT ·biasEnter(SB), NOSPLIT, $0-17
	MOVQ (TLS), CX
	MOVQ gate+0(FP), AX
	CMPQ (AX), CX
	JNE  no
	MOVQ busy+8(FP), BX
	MOVL $1, (BX)
	CMPQ (AX), CX
	JNE  undo
	MOVB $1, ret+16(FP)
	RET
undo:
	MOVL $0, (BX)
no:
	MOVB $0, ret+16(FP)
	RET

// func storeRelease(addr *uint32, val uint32)
// A plain MOV: on amd64 (total store order) a store is never reordered
// with the loads and stores before it, so it releases them.
TEXT ·storeRelease(SB), NOSPLIT, $0-12
	MOVQ addr+0(FP), AX
	MOVL val+8(FP), BX
	MOVL BX, (AX)
	RET

// func curg() uintptr
// The running goroutine's g, from thread-local storage: an identity
// that no other live goroutine shares.
TEXT ·curg(SB), NOSPLIT, $0-8
	MOVQ (TLS), AX
	MOVQ AX, ret+0(FP)
	RET
