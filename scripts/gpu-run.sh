#!/usr/bin/env bash
# Runs the project's GPU checks and measurements on a machine with an
# NVIDIA driver, from binaries built by `make gpu` (no Go toolchain needed
# there). Results go to $OUT (default ./out): logs, JSON and a summary.
#
#   make gpu && scripts/gpu-run.sh            # everything
#   STAGES="tests replay" scripts/gpu-run.sh  # some stages
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out}
mkdir -p "$OUT"
STAGES=${STAGES:-"tests bench replay run multi sanitize capi peers e2e"}
RUN_OPS=${RUN_OPS:-10000000}
export TLSF_REQUIRE_GPU=1
log() { echo "== $*" | tee -a "$OUT/summary.txt"; }
# Speed figures run pinned to one core: the host's cores differ by up to
# 1.7x (README, Measurements). PIN_CPU=none runs them unpinned.
PIN_CPU=${PIN_CPU:-2}
pin() { if [ "$PIN_CPU" != none ] && command -v taskset >/dev/null; then taskset -c "$PIN_CPU" "$@"; else "$@"; fi; }

nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv >"$OUT/gpu.txt" 2>&1
nproc >>"$OUT/gpu.txt"

for stage in $STAGES; do
	case $stage in
	tests)
		log "device/cuda tests"
		./bin/cuda.test -test.v -test.count=1 >"$OUT/cuda.log" 2>&1
		echo "cuda exit $?" | tee -a "$OUT/summary.txt"
		grep -E "^(--- FAIL|FAIL|ok|PASS)" "$OUT/cuda.log" | tail -5 | tee -a "$OUT/summary.txt"
		log "pool tests on the GPU"
		./bin/pool.test -test.v -test.count=1 -test.run '^TestGPU' >"$OUT/pool.log" 2>&1
		echo "pool exit $?" | tee -a "$OUT/summary.txt"
		grep -cE "^    --- PASS|^--- PASS" "$OUT/pool.log" | sed 's/^/passed: /' | tee -a "$OUT/summary.txt"
		grep -E "^(--- FAIL|    --- FAIL)" "$OUT/pool.log" | tee -a "$OUT/summary.txt"
		;;
	bench)
		log "benchmarks"
		./bin/cuda.test -test.run '^$' -test.bench 'CUDAVMMPage|CUDAMemAllocFree|CUDABareCall' -test.benchtime 20x >"$OUT/bench-device.txt" 2>&1
		pin ./bin/bench.test -test.run '^$' -test.bench 'Small|Replay$' -test.benchtime 2s >"$OUT/bench.txt" 2>&1
		grep -E "^Benchmark" "$OUT/bench-device.txt" "$OUT/bench.txt" | tee -a "$OUT/summary.txt"
		;;
	replay)
		log "replay: every trace, every backend (warm ns/op), min cap of the TLSF backends"
		pin ./bin/tlsf-stress replay --backend tlsf-vmm,tlsf-chunks,passthrough,async | tee "$OUT/replay.txt"
		pin ./bin/tlsf-stress replay --backend tlsf-vmm,tlsf-chunks,passthrough,async --json >"$OUT/replay.json"
		./bin/tlsf-stress replay --backend tlsf-vmm,tlsf-chunks --min-cap --json >"$OUT/mincap.json"
		echo "replay exit $?" | tee -a "$OUT/summary.txt"
		;;
	run)
		log "run: $RUN_OPS operations on 16 goroutines, verified"
		./bin/tlsf-stress run -g 16 --ops "$RUN_OPS" --sizes resnet50 --json >"$OUT/run.json" 2>"$OUT/run.err"
		echo "run exit $?" | tee -a "$OUT/summary.txt"
		tail -c 2000 "$OUT/run.json" | tee -a "$OUT/summary.txt"
		;;
	multi)
		for k in 2 3 4; do
			log "multi: $k processes, 1/$k of the GPU each, oversubscribed"
			./bin/tlsf-stress multi --device cuda --procs $k --ops 20000 --duration 120s >"$OUT/multi$k.txt" 2>&1
			echo "multi $k exit $?" | tee -a "$OUT/summary.txt"
			grep -E "fairness|within 90|^ +[0-9]" "$OUT/multi$k.txt" | tee -a "$OUT/summary.txt"
		done
		;;
	sanitize)
		log "compute-sanitizer: planted stores past the end and after free (chunks), a leak, guard mode"
		for c in inside past-end after-free; do
			compute-sanitizer --tool memcheck ./bin/tlsf-stress sanitize --device cuda --backend tlsf-chunks --case $c 2>&1 |
				grep -E "Invalid|out of bounds|nearest|ERROR SUMMARY|Warning" | sed "s/^/$c: /" | tee -a "$OUT/summary.txt"
		done
		compute-sanitizer --tool memcheck --leak-check full ./bin/tlsf-stress sanitize --device cuda --case leak 2>&1 |
			grep -E "LEAK SUMMARY" | tee -a "$OUT/summary.txt"
		./bin/tlsf-stress sanitize --device cuda --case guard 2>&1 | tail -1 | tee -a "$OUT/summary.txt"
		;;
	capi)
		log "C ABI: the C example (malloc+free pair timing)"
		./bin/tlsf-example 2>&1 | tail -4 | tee -a "$OUT/summary.txt"
		;;
	peers)
		log "every allocator side by side (bench/peers/run.sh)"
		OUT="$OUT/peers" bench/peers/run.sh >"$OUT/peers.log" 2>&1
		echo "peers exit $?" | tee -a "$OUT/summary.txt"
		;;
	e2e)
		log "end-to-end training (bench/e2e/train.py)"
		python3 bench/e2e/train.py --lib bin/libtlsf.so --out "$OUT/e2e" >"$OUT/e2e.log" 2>&1
		echo "e2e exit $?" | tee -a "$OUT/summary.txt"
		;;
	esac
done
