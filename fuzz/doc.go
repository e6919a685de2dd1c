// Package fuzz holds the module's fuzz targets, kept apart so that they use
// only the packages' public APIs, as a caller would. Each target states the
// invariants its package promises on any input (no panic; an error or a
// value that passes the package's Check), and its seed corpus lives in
// testdata/fuzz/<Target>/ in the "go test fuzz v1" format; a failure the
// fuzzer finds is written there too, and is committed as a regression case
// once fixed (named regress-*, beside the hand-made seed-*).
//
// The targets: FuzzParse, FuzzParseText, FuzzParseCSV and FuzzParsePickle
// (the trace parsers); FuzzIndex (the TLSF index against a reference
// model) and FuzzPool (the pool on a simulated GPU with injected faults),
// which read their input as a program of operations (ops.go). Run one
// target with
// go test ./fuzz -run '^$' -fuzz '^FuzzPool$' -fuzztime 60s.
package fuzz
