#!/bin/bash
# Device run: PHASE=a GPU tests, C example, newcomer, lock benches, SmallParallel A/B;
# PHASE=b warm replay A/B (old 84d61b5 vs new), sim and cuda devices, pinned.
set -u
r=$OUT; s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > $r/gpu.txt; lscpu | grep "Model name" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
if [ $PHASE = a ]; then
mkdir -p $r/gpu; OUT=$r/gpu STAGES="tests capi" scripts/gpu-run.sh > $r/gpu-run.txt 2>&1; t gpu-run $?
python3 python/newcomer_gpu.py bin/libtlsf.so > $r/newcomer.txt 2>&1; t newcomer $?
taskset -c 3 ./bin/pool.test -test.run XXX -test.bench 'BiasMutex' -test.count 5 > $r/biasmutex.txt 2>&1; t biasmutex $?
fi
if [ $PHASE = sp ]; then
for i in 1 2 3 4; do for v in old new; do b=./bin/bench.test; [ $v = old ] && b=./bin/bench.old.test
  taskset -c 0-15 $b -test.run XXX -test.bench 'SmallParallel' -test.benchtime 0.4s 2>&1 | grep ^Bench | sed "s/^/$v /" >> $r/sp.txt
done; [ $(( $(date +%s)-s )) -gt 420 ] && break; done; t smallpar $?
fi
if [ $PHASE = b ]; then
for i in $(seq 1 12); do for dev in sim cuda; do for v in old new; do for tr in lstm resnet50 tdnn; do
  b=./bin/ts.old; [ $v = new ] && b=./bin/tlsf-stress
  echo "$dev $v $tr $(taskset -c 3 $b replay --device $dev --backend tlsf-vmm --warm-runs 200 --json $tr 2>/dev/null | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(round(d["ns_per_op"],2), round(d["min_ns_per_op"],2))')" >> $r/ab.txt
done; done; done; [ $(( $(date +%s)-s )) -gt ${LIMIT:-480} ] && break; done; t ab $?
fi
cat $r/times.txt $r/gpu.txt
