#!/bin/bash
# The H200 run of 2026-12-07. Build on the development machine into bin/
# (ignored by git, carried to the GPU machine), GOOS=linux GOARCH=amd64
# CGO_ENABLED=0 -ldflags="-s -w": bin/tlsf-stress (./cmd/tlsf-stress),
# bin/cuda.test, bin/pool.test, bin/bench.test (go test -c of
# ./device/cuda, ./pool, ./bench); make capi (bin/libtlsf.so,
# bin/tlsf-example); bin/VERSION (git log -1). Then, from the repository
# root there: bash bench/replay-h200/2026-12-07/gpu.sh (LIMIT=seconds ends
# the alternating benchmark rounds sooner; default 300). It writes
# $OUT/res.tgz and prints a summary. Replays of the nine traces: the
# default (twice), caches:true (the caches on from the start, the default
# before), tlsf-vmm-wilderness and release_fraction:0.05; then rounds of
# the index, the pool (vmm: one goroutine, caches off) and vmm-caches.
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
OUT=$r STAGES="tests capi" scripts/gpu-run.sh > $r/gpu-run.txt 2>&1; t gpu-run $?
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader >> $r/gpu.txt
lscpu | grep "Model name" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
for i in 1 2; do
  taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json $T > $r/replay-c3-$i.json 2> $r/replay-c3-$i.err; t replay-$i $?
done
taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --conf caches:true --json $T > $r/replay-caches-c3.json 2> $r/replay-caches-c3.err; t replay-caches $?
taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm-wilderness --json $T > $r/replay-wilderness-c3.json 2> $r/replay-wilderness-c3.err; t replay-wilderness $?
taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --conf release_fraction:0.05 --json $T > $r/replay-rf0.05-c3.json 2> $r/replay-rf0.05-c3.err; t replay-rf0.05 $?
for i in 1 2 3 4 5 6 7 8 9 10; do
  (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit(-locked)?-harness' -test.count 1) >> $r/bench-index.txt 2>&1
  (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1) >> $r/bench-pool.txt 2>&1
  (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm-caches$' -test.count 1) >> $r/bench-caches.txt 2>&1
  [ $(( $(date +%s)-s )) -gt ${LIMIT:-300} ] && break
done
t bench $?
tar czf $OUT/res.tgz $r
cat $r/times.txt $r/summary.txt $r/gpu.txt
for f in $r/replay-*.json; do echo "== $f"; python3 -c '
import sys,json
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("%-16s res/live %.4f warm %.1f min %.1f cold %.0f warmcalls %d" % (d["trace"], d["reserved_over_live"], d["ns_per_op"], d["min_ns_per_op"], d["cold_ns_per_op"], d["warm_device_calls"]))' $f; done
for f in $r/bench-index.txt $r/bench-pool.txt $r/bench-caches.txt; do echo "== $f"; grep -E "^Benchmark" $f | awk '{for(i=1;i<=NF;i++) {if ($(i+1)=="min-ns/traceop") m=$i; if ($(i+1)=="ns/traceop") d=$i}; print $1, d, m}' | sort | awk '{k=$1; med[k]=med[k]" "$2; mn[k]=mn[k]" "$3} END{for(k in med) print k, "med:" med[k], "| min:" mn[k]}'; done
