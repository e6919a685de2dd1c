#!/usr/bin/env bash
# A/B on the H200: old (HEAD 27c7f4e) and new (sized free) binaries, pinned.
set -u
OUT=${OUT:-out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv >"$OUT/gpu.txt" 2>&1; nproc >>"$OUT/gpu.txt"; lscpu | grep "Model name" >>"$OUT/gpu.txt"
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
spin() { timeout 5 taskset -c "$1" sh -c 'while :; do :; done'; }
s=$(date +%s)
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run '^TestGPU' >"$OUT/pool-gpu-test.txt" 2>&1; echo "pool rc $?" >>"$OUT/times.txt"
echo "tests $(( $(date +%s)-s )) s" >>"$OUT/times.txt"
for c in 3 9 12; do
  spin $c
  for i in 1 2 3; do
    for v in old new; do
      b=./bin/tlsf-stress; [ $v = old ] && b=./bin/old/tlsf-stress
      taskset -c $c $b replay --device cuda --backend tlsf-vmm --json $T >"$OUT/replay-$v-c$c-$i.json" 2>"$OUT/replay-$v-c$c-$i.err"
    done
  done
  echo "replay c$c $(( $(date +%s)-s )) s" >>"$OUT/times.txt"
done
spin 3
for i in 1 2; do
  for v in old new; do
    b=./bin/bench.test; [ $v = old ] && b=./bin/old/bench.test
    (cd bench && taskset -c 3 ../$b -test.run '^$' -test.bench 'BenchmarkPoolReplay/.*/vmm$|BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit(-locked)?-harness$' -test.benchtime 20x) >"$OUT/bench-$v-$i.txt" 2>&1
  done
done
echo "bench $(( $(date +%s)-s )) s" >>"$OUT/times.txt"
LD_LIBRARY_PATH=bin ./bin/tlsf-example >"$OUT/capi-example.txt" 2>&1; echo "example rc $?" >>"$OUT/times.txt"
