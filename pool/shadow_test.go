package pool

// The shadow-memory test: the simulated GPU keeps the contents of device
// memory (sim.Config.Shadow), every live block is filled with a word of its
// own over its whole size, and blocks are read back before each free and,
// all of them, every so often. A block handed out twice, a page unmapped
// or remapped under a live block, or a release that takes live memory
// shows up as a word that is not the block's own.

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

func TestEveryLiveBlockOwnsItsBytes(t *testing.T) {
	for _, be := range pooledBackends {
		for _, cm := range cacheModes {
			for _, maxBytes := range []uint64{0, 24 * miB} {
				name := fmt.Sprintf("%v/%s/MaxBytes=%d", be, cm.name, maxBytes)
				t.Run(name, func(t *testing.T) {
					runShadow(t, Options{Backend: be, MaxBytes: maxBytes, Cache: cm.opts()}, 1200, uint64(len(name)))
				})
			}
		}
	}
}

type shadowBlock struct {
	n uint64 // bytes the caller may use: the request, or pitch × height
	v uint32 // the word it is filled with
}

func runShadow(t *testing.T, o Options, steps int, seed uint64) {
	sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
	d := onSim(sd)
	ss := newStreams(t, sd, 2)
	streams := []device.Stream{0, ss[0], ss[1]}
	p := openPool(t, d, o)
	r := rand.New(rand.NewPCG(seed, 7))

	live := map[uintptr]shadowBlock{}
	verified := 0
	var order []uintptr // live pointers, for reproducible choices
	next := uint32(0x100)
	ooms := 0
	verifyAll := func() {
		verified++
		for _, ptr := range order {
			b := live[ptr]
			expectFilled(t, sd, ptr, b.n, b.v)
		}
	}
	// afterOOM reads everything back after the first out-of-memory
	// errors and every tenth: that path releases and remaps memory.
	afterOOM := func() {
		ooms++
		if ooms <= 4 || ooms%10 == 0 {
			verifyAll()
		}
	}
	add := func(ptr uintptr, n, align uint64) {
		require.Zero(t, ptr%uintptr(align), "%#x not aligned to %d", ptr, align)
		requireDisjoint(t, toSizes(live), ptr, n)
		next++
		fillBlock(t, sd, ptr, n, next)
		live[ptr] = shadowBlock{n, next}
		order = append(order, ptr)
	}
	size := func() uint64 {
		switch k := r.IntN(20); {
		case k < 14:
			return 1 + r.Uint64N(64*kiB)
		case k < 19:
			return 64*kiB + r.Uint64N(miB)
		default:
			return miB + r.Uint64N(5*miB)
		}
	}
	for step := range steps {
		k := r.IntN(10)
		if len(order) > 48 {
			k = 9 // keep reading back cheap: free
		}
		switch {
		case k < 5:
			n := size()
			var ptr uintptr
			var err error
			if s := streams[r.IntN(len(streams))]; s == 0 && r.IntN(2) == 0 {
				ptr, err = p.Alloc(n)
			} else {
				ptr, err = p.AllocOn(n, s)
			}
			if err != nil {
				require.ErrorIs(t, err, ErrOutOfMemory, "step %d: %d bytes", step, n)
				require.NotZero(t, o.MaxBytes, "step %d: out of memory without a cap", step)
				afterOOM()
				break
			}
			add(ptr, n, 256)
		case k < 6:
			w, h := 1+r.Uint64N(20000), 1+r.Uint64N(64)
			ptr, pitch, err := p.AllocPitch(w, h)
			if err != nil {
				require.ErrorIs(t, err, ErrOutOfMemory, "step %d: pitch %d × %d", step, w, h)
				require.NotZero(t, o.MaxBytes)
				afterOOM()
				break
			}
			require.GreaterOrEqual(t, pitch, w)
			add(ptr, pitch*h, 512)
		default:
			if len(order) == 0 {
				break
			}
			i := r.IntN(len(order))
			ptr := order[i]
			b := live[ptr]
			expectFilled(t, sd, ptr, b.n, b.v)
			if s := streams[r.IntN(len(streams))]; s == 0 {
				require.NoError(t, p.Free(ptr))
			} else {
				require.NoError(t, p.FreeOn(ptr, s))
			}
			delete(live, ptr)
			order = slices.Delete(order, i, i+1)
		}
		checkStep(t, p, d)
		if step%200 == 199 {
			verifyAll()
		}
		if step%400 == 399 {
			_, err := p.Trim()
			require.NoError(t, err)
			verifyAll()
			checkStep(t, p, d)
		}
	}
	verifyAll()
	t.Logf("%d steps, %d out-of-memory errors, %d full read-backs; %+v", steps, ooms, verified, p.Stats())
	if o.MaxBytes > 0 {
		require.Positive(t, ooms, "a tight cap must exercise the out-of-memory path")
		if o.Backend == BackendVMM {
			st := p.Stats()
			require.Positive(t, st.Releases+st.RecycledBytes, "pages were released or moved (and later remapped)")
		}
	}
	for _, ptr := range order {
		require.NoError(t, p.Free(ptr))
	}
	_, err := p.Trim()
	require.NoError(t, err)
	require.Zero(t, p.Stats().Reserved)
	checkStep(t, p, d)
}

func toSizes(live map[uintptr]shadowBlock) map[uintptr]uint64 {
	m := make(map[uintptr]uint64, len(live))
	for ptr, b := range live {
		m[ptr] = b.n
	}
	return m
}
