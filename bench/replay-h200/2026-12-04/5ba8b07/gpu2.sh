#!/bin/bash
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run 'GPU' > $r/pool-gpu-test.txt 2>&1; t pool-gpu $?
./bin/tlsf-example > $r/capi-example.txt 2>&1; t example $?
TLSF_REQUIRE_GPU=1 python3 python/smoke_gpu.py bin/libtlsf.so > $r/smoke-gpu.txt 2>&1; t smoke-gpu $?
TLSF_ALLOC_CONF=bogus:1 python3 -c 'import sys; sys.path.insert(0,"python"); import tlsf_torch
try:
    tlsf_torch.install("bin/libtlsf.so"); print("accepted")
except ValueError as e: print("ValueError:", e)' > $r/bad-env.txt 2>&1; t bad-env $?
./bin/tlsf-stress sanitize --device cuda --case guard > $r/sanitize-guard.txt 2>&1; t sanitize-guard $?
python3 bench/e2e/train.py --lib bin/libtlsf.so --out $r/e2e --quick --allocators native,tlsf > $r/e2e-stdout.txt 2>&1; t e2e-quick $?
tar czf $OUT/res.tgz $r
cat $r/times.txt; tail -n 2 $r/pool-gpu-test.txt $r/capi-example.txt $r/smoke-gpu.txt $r/bad-env.txt $r/sanitize-guard.txt; tail -n 15 $r/e2e-stdout.txt
