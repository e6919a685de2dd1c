#!/bin/bash
# The script of this run (bin/h200.sh then; named for the machine kind asked,
# the machine lent was an H100). Run from the repository root with bin/ built
# by `make gpu`.
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
(cd bench && taskset -c 3 ../bin/bench.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$|BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit(-locked)?-harness' -test.benchtime 20x -test.count 3) > $r/bench-ratio.txt 2>&1; t bench-ratio $?
