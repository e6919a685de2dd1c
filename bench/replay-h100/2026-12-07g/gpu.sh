#!/bin/bash
# A device call over `make gpu` binaries (bin/, carried): the GPU tests,
# the C example, compute-sanitizer's cases and python/smoke_gpu.py
# (scripts/gpu-run.sh stages tests, capi, sanitize), the symbols
# libtlsf.so exports, and tlsf-stress multi (K = 2, 20,000 operations,
# seeds 30 and 31, -g 2 and 16). Writes $OUT/res.tgz.
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > $r/gpu.txt
lscpu | grep "Model name" >> $r/gpu.txt; cat bin/VERSION >> $r/gpu.txt
OUT=$r STAGES="tests capi sanitize" scripts/gpu-run.sh > $r/gpu-run.txt 2>&1; t gpu-run $?
python3 python/smoke_gpu.py bin/libtlsf.so > $r/smoke_gpu.txt 2>&1; t smoke_gpu $?
nm -D --defined-only bin/libtlsf.so | awk '$2 == "T" { print $3 }' > $r/exports.txt; t exports $?
for g in 2 16; do for seed in 30 31; do
  ./bin/tlsf-stress multi --device cuda --procs 2 -g $g --ops 20000 --seed $seed --json > $r/multi-g$g-s$seed.json 2> $r/multi-g$g-s$seed.err; t multi-g$g-s$seed $?
done; done
tar czf $OUT/res.tgz $r
cat $r/times.txt $r/summary.txt $r/gpu.txt; tail -3 $r/smoke_gpu.txt; cat $r/exports.txt | tr '\n' ' '; echo
for f in $r/multi-*.json; do echo "== $f"; python3 -c '
import sys,json
for l in open(sys.argv[1]):
    if l.startswith("{"):
        d=json.loads(l); print("calls/op %.2f ops/s %.0f oom %d within90 %d still %d ok %s" % (d["device_calls_per_op"], d["ops_per_s"], d["out_of_memory"], d["out_of_memory_within_90pct_of_share"], d["out_of_memory_still_within_90pct_of_share"], d["ok"]))' $f; done
