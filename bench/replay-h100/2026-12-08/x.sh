#!/bin/bash
# H200 call: the target command (tlsf-stress replay --backend tlsf-vmm, pinned to core 2
# as scripts/gpu-run.sh does) five times plus once beside async; BiasMutex; warm A/B 84d61b5 vs HEAD
# on cuda pinned to core 3 until LIMIT s; then GPU tests + C example.
set -u
r=$OUT; s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $r/gpu.txt; lscpu | grep -E "Model name|MHz" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
for i in 1 2 3 4 5; do taskset -c 2 ./bin/tlsf-stress replay --backend tlsf-vmm >> $r/target.txt 2>&1; done; t target $?
taskset -c 2 ./bin/tlsf-stress replay --backend tlsf-vmm,tlsf-chunks,async --json > $r/peers.json 2>&1; t peers $?
taskset -c 3 ./bin/pool.test -test.run XXX -test.bench 'BiasMutex' -test.count 5 2>&1 | grep ^Bench > $r/biasmutex.txt; t biasmutex $?
for i in $(seq 1 12); do for v in old new; do for tr in lstm resnet50 tdnn; do
  b=./bin/ts.old; [ $v = new ] && b=./bin/tlsf-stress
  echo "cuda $v $tr $(taskset -c 3 $b replay --device cuda --backend tlsf-vmm --warm-runs 200 --json $tr 2>/dev/null | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(round(d["ns_per_op"],2), round(d["min_ns_per_op"],2))')" >> $r/ab.txt
done; done; [ $(( $(date +%s)-s )) -gt ${LIMIT:-330} ] && break; done; t ab $?
mkdir -p $r/gpu; OUT=$r/gpu STAGES="tests capi" timeout $(( ${END:-570} - ($(date +%s)-s) )) scripts/gpu-run.sh > $r/gpu-run.txt 2>&1; t gpu-run $?; tar czf $r/gpu.tgz -C $r gpu; rm -rf $r/gpu
cat $r/times.txt $r/gpu.txt; grep -E "lstm|resnet50|tdnn" $r/target.txt | head -40
