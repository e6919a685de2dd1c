#!/bin/bash
set -u
r=res; mkdir -p $r/multi $r/e2e
s=$(date +%s)
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > $r/gpu.txt 2>&1
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run '^TestGPU' > $r/pool-gpu-test.txt 2>&1; echo "pool gpu tests rc $? $(( $(date +%s)-s )) s" >> $r/times.txt
LD_LIBRARY_PATH=bin ./bin/tlsf-example > $r/capi-example.txt 2>&1; echo "example rc $? $(( $(date +%s)-s )) s" >> $r/times.txt
tar czf $OUT/res.tgz $r
python3 bench/e2e/train.py --lib bin/libtlsf.so --out $r/e2e --budget 330 --probes 5 --allocators native,expandable,tlsf,tlsf-goodfit > $r/e2e/stdout.txt 2>&1; echo "e2e rc $? $(( $(date +%s)-s )) s" >> $r/times.txt
tar czf $OUT/res.tgz $r
for seed in 30 31 32; do
  KS=3 G=2 bench/multi/run.sh $r/multi "$seed" new
  KS=3 G=16 bench/multi/run.sh $r/multi "$seed" new
done
echo "multi $(( $(date +%s)-s )) s" >> $r/times.txt
python3 bench/multi/summarize.py $r/multi > $r/multi/summary.txt 2>&1
tar czf $OUT/res.tgz $r
cat $r/times.txt $r/multi/summary.txt; tail -30 $r/e2e/stdout.txt
