#!/bin/bash
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run 'GPU' > $r/pool-gpu-test.txt 2>&1; t pool-gpu $?
TLSF_REQUIRE_GPU=1 ./bin/cuda.test -test.count=1 > $r/cuda-test.txt 2>&1; t cuda $?
./bin/tlsf-example > $r/capi-example.txt 2>&1; t example $?
./bin/tlsf-stress sanitize --device cuda --case guard > $r/sanitize-guard.txt 2>&1; t sanitize-guard $?
TLSF_REQUIRE_GPU=1 python3 python/smoke_gpu.py bin/libtlsf.so > $r/smoke-gpu.txt 2>&1; t smoke-gpu $?
tar czf $OUT/res.tgz $r
cat $r/times.txt; tail -n 2 $r/pool-gpu-test.txt $r/cuda-test.txt $r/capi-example.txt $r/sanitize-guard.txt $r/smoke-gpu.txt
