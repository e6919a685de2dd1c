# Targets: test (vet, race-enabled tests, and a cgo-free build and test),
# fuzz (every fuzz target for FUZZTIME each), bench, stress (the main job),
# gpu (test binaries and tlsf-stress built for the GPU machine, in bin/).

GO       ?= go
FUZZTIME ?= 20s
# go test -fuzz takes one target per run.
FUZZ_TARGETS := FuzzIndex FuzzPool FuzzParse FuzzParseText FuzzParseCSV FuzzParsePickle

.PHONY: test fuzz bench stress gpu

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 ./...
	CGO_ENABLED=0 $(GO) vet ./...
	CGO_ENABLED=0 $(GO) test -count=1 ./...

fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "== $$t ($(FUZZTIME))"; \
		$(GO) test ./fuzz -run '^$$' -fuzz "^$$t$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s || exit 1; \
	done

bench:
	$(GO) test ./... -run '^$$' -bench . -benchmem

stress:
	$(GO) run ./cmd/tlsf-stress

gpu:
	mkdir -p bin
	GOOS=linux GOARCH=amd64 CGO_ENABLED=0 $(GO) build -o bin/tlsf-stress ./cmd/tlsf-stress
	for p in device/cuda pool bench; do \
		GOOS=linux GOARCH=amd64 CGO_ENABLED=0 $(GO) test -c -o bin/$$(basename $$p).test ./$$p || exit 1; \
	done
