#!/bin/bash
# HEAD on the GPU machine: GPU tests, C example, nine-trace replays (default x2, caches off, and the commit before the start-over fix with caches off), pinned.
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $r/gpu.txt 2>&1; nproc >> $r/gpu.txt; lscpu | grep "Model name" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run 'GPU' > $r/pool-gpu-test.txt 2>&1; t pool-gpu $?
TLSF_REQUIRE_GPU=1 ./bin/cuda.test -test.count=1 > $r/cuda-test.txt 2>&1; t cuda $?
LD_LIBRARY_PATH=bin ./bin/tlsf-example > $r/capi-example.txt 2>&1; t example $?
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
for i in 1 2; do
  taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json $T > $r/replay-c3-$i.json 2> $r/replay-c3-$i.err; t replay-$i $?
done
taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --conf caches:false --json $T > $r/replay-nocache-c3.json 2> $r/replay-nocache-c3.err; t replay-nocache $?
taskset -c 3 ./bin/tlsf-stress-old replay --device cuda --backend tlsf-vmm --conf caches:false --json $T > $r/replay-nocache-old-c3.json 2> $r/replay-nocache-old-c3.err; t replay-nocache-old $?
(cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$|BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit(-locked)?-harness' -test.benchtime 20x -test.count 3) > $r/bench-ratio.txt 2>&1; t bench-ratio $?
tar czf $OUT/res.tgz $r
cat $r/times.txt; tail -n 2 $r/pool-gpu-test.txt $r/cuda-test.txt $r/capi-example.txt
for f in $r/replay-*.json; do echo "== $f"; python3 -c '
import sys,json
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("%-16s res/live %.4f warm %.1f min %.1f cold %.0f warmcalls %d" % (d["trace"], d["reserved_over_live"], d["ns_per_op"], d["min_ns_per_op"], d["cold_ns_per_op"], d["warm_device_calls"]))' $f; done
grep -E "^Benchmark" $r/bench-ratio.txt | awk '{for(i=1;i<=NF;i++) if ($(i+1)=="min-ns/traceop") m=$i; print $1, m}'
