# Targets: test (vet, race-enabled tests, a cgo-free build and test, and
# vet for linux/arm64 and, the TLSF index, linux/386),
# fuzz (every fuzz target for FUZZTIME each), bench, stress (the main job),
# gpu (test binaries and tlsf-stress built for the GPU machine, in bin/),
# capi (the C ABI: bin/libtlsf.so and the C example bin/tlsf-example),
# capi-example (capi, then the example run on the simulated device).

GO       ?= go
# Fuzzing budgets are counts of executions (target:count, about 30 s each
# on a 2-core VM), not durations: with a duration, go1.26's coordinator can
# fail a clean run with "context deadline exceeded" when the deadline
# races a worker (golang/go#75804, fixed in Go 1.27). FUZZTIME, when set
# (e.g. FUZZTIME=20s or FUZZTIME=100000x), replaces every target's budget.
FUZZTIME ?=
# go test -fuzz takes one target per run.
FUZZ_TARGETS := FuzzIndex:40000 FuzzPool:60000 FuzzParse:90000 \
	FuzzParseText:500000 FuzzParseCSV:500000 FuzzParsePickle:400000

.PHONY: test fuzz bench stress gpu capi capi-example

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	CGO_ENABLED=0 $(GO) vet ./...
	CGO_ENABLED=0 $(GO) test -count=1 ./...
	@# Other targets must keep building: Grace hosts (make gpu GPU_ARCH=arm64;
	@# cgo off, so not capi, which needs a cross C compiler there), and the
	@# TLSF index, which needs no 64-bit word, on 32-bit ones.
	CGO_ENABLED=0 GOOS=linux GOARCH=arm64 $(GO) vet ./...
	CGO_ENABLED=0 GOOS=linux GOARCH=386 $(GO) vet ./tlsf

fuzz:
	@for tc in $(FUZZ_TARGETS); do \
		t=$${tc%%:*}; budget="$(FUZZTIME)"; [ -n "$$budget" ] || budget=$${tc#*:}x; \
		echo "== $$t ($$budget)"; \
		$(GO) test ./fuzz -run '^$$' -fuzz "^$$t$$" -fuzztime $$budget -fuzzminimizetime 2000x || exit 1; \
	done

bench:
	$(GO) test ./... -run '^$$' -bench . -benchmem

stress:
	$(GO) run ./cmd/tlsf-stress

# The GPU machine's architecture: amd64, or arm64 on Grace (GH200) with
# make gpu GPU_ARCH=arm64 (the C ABI, built with cgo, then needs a host
# of that architecture or a cross compiler as CC).
GPU_ARCH ?= amd64

gpu: capi
	mkdir -p bin
	GOOS=linux GOARCH=$(GPU_ARCH) CGO_ENABLED=0 $(GO) build -o bin/tlsf-stress ./cmd/tlsf-stress
	for p in device/cuda pool bench; do \
		GOOS=linux GOARCH=$(GPU_ARCH) CGO_ENABLED=0 $(GO) test -c -o bin/$$(basename $$p).test ./$$p || exit 1; \
	done

# The C ABI needs cgo (this package only) and gcc; the version script
# keeps the library's exports to tlsf.h's functions (capi/doc.go).
CC ?= gcc
capi:
	mkdir -p bin
	GOOS=linux GOARCH=$(GPU_ARCH) CGO_ENABLED=1 $(GO) build -buildmode=c-shared -ldflags="-extldflags=-Wl,--version-script=$(CURDIR)/capi/exports.map" -o bin/libtlsf.so ./capi
	@# The header go build writes declares the Go side, which the library does not export: capi/tlsf.h is the one to include.
	rm -f bin/libtlsf.h
	$(CC) -O2 -Wall -Werror -o bin/tlsf-example capi/example/example.c -Icapi -Lbin -ltlsf -lpthread -Wl,-rpath,'$$ORIGIN'
	$(CC) -O2 -Wall -Werror -o bin/tlsf-late-env capi/example/late_env.c -Icapi -Lbin -ltlsf -Wl,-rpath,'$$ORIGIN'
	$(CC) -O2 -Wall -Werror -o bin/tlsf-fork-child capi/example/fork_child.c -Icapi -Lbin -ltlsf -lpthread -Wl,-rpath,'$$ORIGIN'

capi-example: capi
	@# The library exports tlsf.h's functions and no other symbol (capi/exports.map).
	@if nm -D --defined-only bin/libtlsf.so | awk '{ print $$NF }' | grep -v '^tlsf_'; then \
		echo "bin/libtlsf.so exports the symbols above, outside tlsf.h"; exit 1; fi
	TLSF_ALLOC_CONF=device:sim bin/tlsf-example
	env -u TLSF_ALLOC_CONF bin/tlsf-late-env
	TLSF_ALLOC_CONF=device:sim bin/tlsf-fork-child
	if command -v python3 >/dev/null; then python3 python/smoke_sim.py bin/libtlsf.so; fi

# bench-gpu builds what bench/peers/run.sh needs on a GPU machine with
# PyTorch (which has no Go toolchain): bin/tlsf-stress, bin/libtlsf.so (the
# C ABI, from capi/, with cgo) and bin/VERSION; then prints the command to run there.
.PHONY: bench-gpu
bench-gpu: capi
	GOOS=linux GOARCH=$(GPU_ARCH) CGO_ENABLED=0 $(GO) build -o bin/tlsf-stress ./cmd/tlsf-stress
	@(git describe --always --dirty 2>/dev/null || echo unknown) >bin/VERSION
	@echo
	@echo "Copy the repository with bin/ to the GPU machine and run there (about 8 minutes):"
	@echo "  OUT=out/peers bench/peers/run.sh            # lstm resnet50 tdnn: out/peers/results.json, RESULTS.md"
	@echo "  OUT=out/peers bench/peers/run.sh --quick    # smoke run: one trace, 3 warm replays, no bisection"
	@echo "Then here: cp out/peers/RESULTS.md out/peers/results.json bench/ && python3 bench/peers/readme_tables.py"
