package pool

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime/debug"
	"slices"
	"strconv"
	"testing"

	"github.com/gpumem/tlsf/device"
	"github.com/gpumem/tlsf/device/sim"
	"github.com/stretchr/testify/require"
)

type rblock struct {
	size     uint64
	last     device.Stream // last writer
	recorded []device.Stream
	val      uint32
}

type rrig struct {
	t       *testing.T
	sd      *sim.Device
	d       testDevice
	p       *Pool
	streams []device.Stream // index 0 is the default stream
	held    map[device.Stream]bool
	live    map[uintptr]*rblock
	val     uint32
	rng     *rand.Rand
	known   map[device.Stream]bool
	log     []string
}

func (r *rrig) logf(f string, a ...any) {
	r.log = append(r.log, fmt.Sprintf(f, a...))
}

func (r *rrig) fail(msg string, a ...any) {
	r.t.Helper()
	n := len(r.log)
	from := max(0, n-60)
	for _, l := range r.log[from:] {
		r.t.Log(l)
	}
	r.t.Fatalf(msg, a...)
}

func (r *rrig) check() {
	r.t.Helper()
	if err := r.p.Check(); err != nil {
		r.fail("p.Check: %v", err)
	}
	if v := r.sd.Violations(); len(v) > 0 {
		r.fail("violations: %v", v)
	}
	if err := r.sd.Check(); err != nil {
		r.fail("sd.Check: %v", err)
	}
}

// order makes work issued on t from now on come after everything issued on
// s so far.
func (r *rrig) order(s, t device.Stream) {
	if s == t {
		return
	}
	ev, err := r.sd.EventCreate()
	require.NoError(r.t, err)
	require.NoError(r.t, r.sd.EventRecord(ev, s))
	require.NoError(r.t, r.sd.StreamWaitEvent(t, ev))
	require.NoError(r.t, r.sd.EventDestroy(ev))
}

func (r *rrig) write(ptr uintptr, b *rblock, s device.Stream) {
	r.order(b.last, s)
	r.val++
	b.val = r.val
	b.last = s
	require.NoError(r.t, r.sd.MemsetD32Async(ptr, b.val, wordCount(b.size), s))
}

func (r *rrig) pick() device.Stream { return r.streams[r.rng.IntN(len(r.streams))] }

func (r *rrig) anyLive() (uintptr, *rblock, bool) {
	if len(r.live) == 0 {
		return 0, nil, false
	}
	keys := make([]uintptr, 0, len(r.live))
	for k := range r.live {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	k := keys[r.rng.IntN(len(keys))]
	return k, r.live[k], true
}

func (r *rrig) size() uint64 {
	switch r.rng.IntN(4) {
	case 0:
		return uint64(1 + r.rng.IntN(4096))
	case 1:
		return uint64(1 + r.rng.IntN(64<<10))
	case 2:
		return uint64(1+r.rng.IntN(8)) * 256 * 1024
	default:
		return uint64(1+r.rng.IntN(4)) * miB / 2
	}
}

func (r *rrig) step() {
	t := r.t
	switch op := r.rng.IntN(100); {
	case op < 30: // alloc and write on the allocating stream
		s := r.pick()
		n := r.size()
		ptr, err := r.p.AllocOn(n, s)
		r.known[s] = true
		if err != nil {
			if errors.Is(err, ErrOutOfMemory) {
				r.logf("alloc %d on %#x: OOM", n, s)
				return
			}
			r.fail("alloc: %v", err)
		}
		if _, dup := r.live[ptr]; dup {
			r.fail("alloc returned live %#x", ptr)
		}
		b := &rblock{size: n, last: s}
		r.live[ptr] = b
		r.logf("alloc %d on %#x -> %#x", n, s, ptr)
		r.write(ptr, b, s)
	case op < 40: // use on another stream, recorded
		ptr, b, ok := r.anyLive()
		if !ok {
			return
		}
		s := r.pick()
		require.NoError(t, r.p.RecordStream(ptr, s))
		r.known[s] = true // the pool knows it now: ForgetStream must wait for it
		if !slices.Contains(b.recorded, s) {
			b.recorded = append(b.recorded, s)
		}
		r.logf("record %#x on %#x, write", ptr, s)
		r.write(ptr, b, s)
	case op < 45: // use on another stream, ordered (not recorded)
		ptr, b, ok := r.anyLive()
		if !ok {
			return
		}
		s := r.pick()
		r.logf("write %#x on %#x (unrecorded)", ptr, s)
		r.write(ptr, b, s)
	case op < 70: // free, on the last writer or on a stream when the last writer is recorded
		ptr, b, ok := r.anyLive()
		if !ok {
			return
		}
		f := b.last
		if slices.Contains(b.recorded, b.last) && r.rng.IntN(2) == 0 {
			f = r.pick()
		} else if r.rng.IntN(3) == 0 {
			f = r.pick()
			r.order(b.last, f)
		}
		r.logf("free %#x (%d) on %#x (last %#x, recorded %v)", ptr, b.size, f, b.last, b.recorded)
		var err error
		r.known[f] = true
		if r.rng.IntN(2) == 0 {
			err = r.p.FreeSizedOn(ptr, b.size, f)
		} else {
			err = r.p.FreeOn(ptr, f)
		}
		if err != nil {
			r.fail("free: %v", err)
		}
		delete(r.live, ptr)
	case op < 82: // hold
		s := r.pick()
		r.logf("hold %#x", s)
		require.NoError(t, r.sd.HoldStream(s))
		r.held[s] = true
	case op < 92: // release
		s := r.pick()
		r.logf("release %#x", s)
		require.NoError(t, r.sd.ReleaseStream(s))
		delete(r.held, s)
	case op < 94:
		r.logf("trim")
		if _, err := r.p.Trim(); err != nil {
			r.fail("trim: %v", err)
		}
	case op < 95 && len(r.streams) > 1:
		// forget, destroy and replace a created stream
		i := 1 + r.rng.IntN(len(r.streams)-1)
		s := r.streams[i]
		r.logf("forget+destroy %#x (known %v)", s, r.known[s])
		if err := r.p.ForgetStream(s); err != nil {
			r.fail("forget: %v", err)
		}
		if !r.known[s] {
			// A stream the pool never saw: its work is the caller's to
			// finish before destroying it.
			require.NoError(t, r.sd.StreamSynchronize(s))
		}
		delete(r.known, s)
		// live blocks last written on s: their writes are done (synchronized)
		require.NoError(t, r.sd.StreamDestroy(s))
		delete(r.held, s)
		ns, err := r.sd.StreamCreate()
		require.NoError(t, err)
		r.streams[i] = ns
		for _, b := range r.live {
			if b.last == s {
				b.last = 0 // done: any stream may follow
			}
			b.recorded = slices.DeleteFunc(b.recorded, func(x device.Stream) bool { return x == s })
		}
	case op < 96:
		s := r.pick()
		r.logf("forget %#x", s)
		if err := r.p.ForgetStream(s); err != nil {
			r.fail("forget: %v", err)
		}
		if r.known[s] {
			delete(r.held, s) // synchronized
		}
		delete(r.known, s)
	case op < 98:
		s := r.pick()
		r.logf("sync %#x", s)
		require.NoError(t, r.sd.StreamSynchronize(s))
		delete(r.held, s)
	default:
		r.verify()
	}
}

// verify synchronizes every stream and checks the contents of live blocks.
func (r *rrig) verify() {
	r.logf("verify")
	for _, s := range r.streams {
		require.NoError(r.t, r.sd.StreamSynchronize(s))
	}
	clear(r.held)
	r.check()
	for ptr, b := range r.live {
		got := make([]byte, 4*wordCount(b.size))
		require.NoError(r.t, r.sd.MemcpyDtoH(got, ptr))
		want := wordPattern(uint64(len(got)), b.val)
		if string(got) != string(want) {
			r.fail("block %#x (%d) lost its contents (want %#x)", ptr, b.size, b.val)
		}
	}
}

// streamPropSteps is the operations per run of TestRandomStreamOrder
// (TLSF_STREAM_STEPS sets it; 300 by default).
var streamPropSteps = func() int {
	if s := os.Getenv("TLSF_STREAM_STEPS"); s != "" {
		n, _ := strconv.Atoi(s)
		return n
	}
	return 300
}()

// TestRandomStreamOrder runs random programs on four streams (the
// default stream and three created ones): allocations written on their
// stream, RecordStream and writes on another stream ordered by events,
// frees on the last writer's stream (or any, where that one was
// recorded), held and released streams, Trim, ForgetStream, and streams
// forgotten, destroyed and replaced; VMM and chunks, caches on and off,
// no cap and caps of 8 and 24 MiB. After every step p.Check, the
// simulated device's Check and its violations (memory freed, unmapped or
// reused under queued work) must be clean; at synchronization points
// every live block holds what was written; at the end, after Trim with
// everything freed, nothing is pending or active. TLSF_STREAM_SEEDS sets
// the seeds per configuration (6 by default, 2 with -short or -race).
func TestRandomStreamOrder(t *testing.T) {
	type cfg struct {
		name string
		o    Options
	}
	var cfgs []cfg
	for _, be := range pooledBackends {
		for _, eager := range []bool{false, true} {
			for _, cap_ := range []uint64{0, 8 * miB, 24 * miB} {
				o := Options{Backend: be, MaxBytes: cap_}
				o.Cache.Eager = eager
				cfgs = append(cfgs, cfg{fmt.Sprintf("%v/eager=%v/cap=%d", be, eager, cap_>>20), o})
			}
		}
	}
	seeds := 6
	if testing.Short() || RaceBuild() {
		seeds = 2
	}
	if s := os.Getenv("TLSF_STREAM_SEEDS"); s != "" {
		seeds, _ = strconv.Atoi(s)
	}
	for _, c := range cfgs {
		for seed := range seeds {
			t.Run(fmt.Sprintf("%s/seed=%d", c.name, seed), func(t *testing.T) {
				sd := sim.New(sim.Config{Capacity: giB, Shadow: true})
				d := onSim(sd)
				r := &rrig{t: t, sd: sd, d: d, streams: []device.Stream{0},
					held: map[device.Stream]bool{}, known: map[device.Stream]bool{}, live: map[uintptr]*rblock{},
					rng: rand.New(rand.NewPCG(uint64(seed), 7))}
				for range 3 {
					s, err := sd.StreamCreate()
					require.NoError(t, err)
					r.streams = append(r.streams, s)
				}
				t.Cleanup(func() {
					for _, s := range r.streams[1:] {
						_ = sd.StreamDestroy(s)
					}
				})
				p := openPool(t, d, c.o)
				r.p = p
				for range streamPropSteps {
					r.step()
					r.check()
				}
				r.verify()
				for ptr, b := range r.live {
					require.NoError(t, p.FreeOn(ptr, b.last))
				}
				clear(r.live)
				_, err := p.Trim()
				require.NoError(t, err)
				r.check()
				st := p.Stats()
				if st.Pending != 0 || st.PendingBlocks != 0 || st.Active != 0 {
					r.fail("after Trim with everything free: %+v", st)
				}
			})
		}
	}
}

// RaceBuild reports whether the test binary was built with -race: fewer
// runs of the slowest tests, which the race detector slows tenfold. (A
// test-only export: the package's external tests use it too.)
func RaceBuild() bool {
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, st := range bi.Settings {
		if st.Key == "-race" {
			return st.Value == "true"
		}
	}
	return false
}
