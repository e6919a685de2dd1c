#!/bin/bash
# One device call over `make gpu` binaries (bin/, carried, with
# bin/VERSION): the GPU tests, the C example, compute-sanitizer's cases
# (scripts/gpu-run.sh stages tests, capi, sanitize), python/smoke_gpu.py,
# the symbols libtlsf.so exports, tlsf-stress multi (K = 2, seeds 30 and
# 31, -g 2 and 16), two default replays of the nine traces pinned to core
# 3, and, on an H200 (or with BENCH_ANY set), alternating benchmark rounds of the index and
# the pool until LIMIT seconds (default 150). Writes $OUT/res.tgz.
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $r/gpu.txt
lscpu | grep "Model name" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
OUT=$r STAGES="tests capi sanitize" scripts/gpu-run.sh > $r/gpu-run.txt 2>&1; t gpu-run $?
python3 python/smoke_gpu.py bin/libtlsf.so > $r/smoke_gpu.txt 2>&1; t smoke_gpu $?
nm -D --defined-only bin/libtlsf.so | awk '$2 == "T" { print $3 }' > $r/exports.txt; t exports $?
for g in 2 16; do for seed in 30 31; do
  ./bin/tlsf-stress multi --device cuda --procs 2 -g $g --ops 20000 --seed $seed --json > $r/multi-g$g-s$seed.json 2> $r/multi-g$g-s$seed.err; t multi-g$g-s$seed $?
done; done
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
for i in 1 2; do
  taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json $T > $r/replay-c3-$i.json 2> $r/replay-c3-$i.err; t replay-$i $?
done
if grep -q H200 $r/gpu.txt || [ -n "${BENCH_ANY:-}" ]; then
  for i in $(seq 1 10); do
    (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit(-locked)?-harness' -test.count 1) >> $r/bench-index.txt 2>&1
    (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1) >> $r/bench-pool.txt 2>&1
    [ $(( $(date +%s)-s )) -gt ${LIMIT:-150} ] && break
  done
  t bench $?
fi
tar czf $OUT/res.tgz $r
cat $r/times.txt $r/summary.txt $r/gpu.txt; tail -3 $r/smoke_gpu.txt; cat $r/exports.txt | tr '\n' ' '; echo
for f in $r/multi-*.json; do echo "== $f"; python3 -c '
import sys,json
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("calls/op %.2f ops/s %.0f oom %d within90 %d still %d ok %s" % (d["device_calls_per_op"], d["ops_per_s"], d["out_of_memory"], d["out_of_memory_within_90pct_of_share"], d["out_of_memory_still_within_90pct_of_share"], d["ok"]))' $f; done
for f in $r/replay-*.json; do echo "== $f"; python3 -c '
import sys,json
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("%-16s res/live %.4f warm %.1f min %.1f cold %.0f warmcalls %d" % (d["trace"], d["reserved_over_live"], d["ns_per_op"], d["min_ns_per_op"], d["cold_ns_per_op"], d["warm_device_calls"]))' $f; done
for f in $r/bench-index.txt $r/bench-pool.txt; do [ -f $f ] || continue; echo "== $f"; grep -E "^Benchmark" $f | awk '{for(i=1;i<=NF;i++) {if ($(i+1)=="min-ns/traceop") m=$i; if ($(i+1)=="ns/traceop") d=$i}; print $1, d, m}' | sort | awk '{k=$1; med[k]=med[k]" "$2; mn[k]=mn[k]" "$3} END{for(k in med) print k, "med:" med[k], "| min:" mn[k]}'; done
