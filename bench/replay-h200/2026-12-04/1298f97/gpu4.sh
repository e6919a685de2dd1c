#!/bin/bash
# 1298f97 on the H200: GPU tests, C example, guard mode, PyTorch smoke,
# the nine-trace replay (pinned, two runs) and the 4 KiB pair benchmark.
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $r/gpu.txt 2>&1; nproc >> $r/gpu.txt; lscpu | grep "Model name" >> $r/gpu.txt
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run 'GPU' > $r/pool-gpu-test.txt 2>&1; t pool-gpu $?
TLSF_REQUIRE_GPU=1 ./bin/cuda.test -test.count=1 > $r/cuda-test.txt 2>&1; t cuda $?
LD_LIBRARY_PATH=bin ./bin/tlsf-example > $r/capi-example.txt 2>&1; t example $?
./bin/tlsf-stress sanitize --device cuda --case guard > $r/sanitize-guard.txt 2>&1; t sanitize-guard $?
TLSF_REQUIRE_GPU=1 python3 python/smoke_gpu.py bin/libtlsf.so > $r/smoke-gpu.txt 2>&1; t smoke-gpu $?
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
for i in 1 2; do
  taskset -c 3 ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json $T > $r/replay-c3-$i.json 2> $r/replay-c3-$i.err; t replay-$i $?
done
(cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkSmallAllocFree' -test.count 5) > $r/bench-small.txt 2>&1; t bench-small $?
tar czf $OUT/res.tgz $r
cat $r/times.txt; tail -n 2 $r/pool-gpu-test.txt $r/cuda-test.txt $r/capi-example.txt $r/sanitize-guard.txt $r/smoke-gpu.txt; grep -h "ns/op" $r/bench-small.txt
