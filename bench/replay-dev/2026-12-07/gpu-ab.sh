#!/bin/bash
# The A/B of this folder on a GPU machine (not run yet: no machine could
# be started on 2026-12-07). Build on the development machine, into bin/
# (ignored by git; carried to the GPU machine):
#   GOOS=linux GOARCH=amd64 CGO_ENABLED=0, -ldflags="-s -w":
#     bin/tlsf-stress (go build ./cmd/tlsf-stress), bin/cuda.test,
#     bin/pool.test, bin/bench.test (go test -c ./device/cuda, ./pool,
#     ./bench) at the code to measure; bin/tlsf-stress-old and
#     bin/bench-old.test at 9803132; optionally bin/bench-flat.test,
#     6f77774's fast paths with the state still in p.meta (no commit has
#     that code; the script skips it if absent);
#   make capi (bin/libtlsf.so, bin/tlsf-example).
# Then, from the repository root there: bash bench/replay-dev/2026-12-07/gpu-ab.sh
# (LIMIT=seconds ends the alternating benchmark rounds sooner; default 470).
# It writes $OUT/res.tgz and prints a summary.
# The GPU machine: GPU tests, C example, nine-trace replays of this change (new) and the commit before it (old), alternating, pinned; the pool beside the index (BenchmarkPoolReplay against BenchmarkReplay) for old, flat (the fast paths written out, state in p.meta) and new (state in the index's tag), alternating.
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
# The GPU's name, the device and pool GPU tests and the C example: the
# project's GPU script (scripts/gpu-run.sh), into $r.
OUT=$r STAGES="tests capi" scripts/gpu-run.sh > $r/gpu-run.txt 2>&1; t gpu-run $?
lscpu | grep "Model name" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
for i in 1 2; do
  taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json $T > $r/replay-new-c3-$i.json 2> $r/replay-new-c3-$i.err; t replay-new-$i $?
  taskset -c 3 ./bin/tlsf-stress-old replay --device cuda --backend tlsf-vmm --json $T > $r/replay-old-c3-$i.json 2> $r/replay-old-c3-$i.err; t replay-old-$i $?
done
for i in 1 2 3 4 5 6 7 8 9 10; do
  (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit(-locked)?-harness' -test.count 1) >> $r/bench-index.txt 2>&1
  (cd bench && taskset -c 3 ../bin/bench-old.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1) >> $r/bench-old.txt 2>&1
  [ -x bin/bench-flat.test ] && (cd bench && taskset -c 3 ../bin/bench-flat.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1) >> $r/bench-flat.txt 2>&1
  (cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1) >> $r/bench-new.txt 2>&1
  [ $(( $(date +%s)-s )) -gt ${LIMIT:-470} ] && break
done
t bench $?
tar czf $OUT/res.tgz $r
cat $r/times.txt $r/summary.txt
for f in $r/replay-*.json; do echo "== $f"; python3 -c '
import sys,json
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("%-16s res/live %.4f warm %.1f min %.1f cold %.0f warmcalls %d" % (d["trace"], d["reserved_over_live"], d["ns_per_op"], d["min_ns_per_op"], d["cold_ns_per_op"], d["warm_device_calls"]))' $f; done
for f in $r/bench-index.txt $r/bench-old.txt $r/bench-flat.txt $r/bench-new.txt; do echo "== $f"; grep -E "^Benchmark" $f | awk '{for(i=1;i<=NF;i++) {if ($(i+1)=="min-ns/traceop") m=$i; if ($(i+1)=="ns/traceop") d=$i}; print $1, d, m}' | sort | awk '{k=$1; med[k]=med[k]" "$2; mn[k]=mn[k]" "$3} END{for(k in med) print k, "med:" med[k], "| min:" mn[k]}'; done
