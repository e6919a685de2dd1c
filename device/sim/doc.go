// Package sim is a deterministic simulated GPU implementing device.Device,
// the stand-in for a real GPU in every test and CI run: New(Config{})
// gives the first process on a simulated H200, NewProcess another process
// sharing its capacity.
//
// It models what a pool depends on: capacity shared between processes
// (Occupy takes memory as another program would), linear allocations with
// the driver's pitch rules, virtual memory management with its mapping
// rules, streams and events with vector clocks (sim_stream.go), the
// driver's stream-ordered allocator (sim_async.go), a latency model
// measured on an H200 (sim_latency.go), fault injection by call kind
// (sim_fault.go), and, with Config.Shadow, memory contents (sim_shadow.go).
// Misuse the driver would not report (freeing or reusing memory that
// queued work still uses) is recorded as a violation (Violations); misuse
// it would report is an error wrapping the same sentinel. Check verifies
// the simulator's own invariants. sim.go explains the design.
package sim
