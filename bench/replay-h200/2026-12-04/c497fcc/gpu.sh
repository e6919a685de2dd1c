#!/bin/bash
set -u
r=res; mkdir -p $r
s=$(date +%s)
t() { echo "$1 rc $2 $(( $(date +%s)-s )) s" >> $r/times.txt; }
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv > $r/gpu.txt 2>&1
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run 'GPU' > $r/pool-gpu-test.txt 2>&1; t pool-gpu $?
TLSF_REQUIRE_GPU=1 ./bin/cuda.test -test.count=1 > $r/cuda-test.txt 2>&1; t cuda $?
./bin/tlsf-example > $r/capi-example.txt 2>&1; t example $?
env -u TLSF_ALLOC_CONF ./bin/tlsf-late-env > $r/late-env.txt 2>&1; t late-env $?
TLSF_REQUIRE_GPU=1 python3 python/smoke_gpu.py bin/libtlsf.so > $r/smoke-gpu.txt 2>&1; t smoke-gpu $?
./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json lstm resnet50 tdnn > $r/replay.json 2> $r/replay.err; t replay $?
./bin/tlsf-stress multi --device cuda --procs 2 -g 16 --ops 20000 --seed 30 --json > $r/multi-g16.json 2> $r/multi-g16.err; t multi $?
tar czf $OUT/res.tgz $r
cat $r/times.txt
grep -E "^(--- FAIL|FAIL|ok|PASS)" $r/pool-gpu-test.txt $r/cuda-test.txt | head
tail -2 $r/capi-example.txt $r/late-env.txt $r/smoke-gpu.txt
python3 -c '
import json
for l in open("res/replay.json"):
    d=json.loads(l); print(d["trace"], "reserved/live %.4f" % d["reserved_over_live"], "warm %.1f ns" % d["ns_per_op"], "min %.1f" % d["min_ns_per_op"], "cold %.0f ns" % d["cold_ns_per_op"], "warm calls", d["warm_device_calls"])
for l in open("res/multi-g16.json"):
    d=json.loads(l); print("multi proc", d["proc"], "calls/op %.2f" % d["device_calls_per_op"], "ops/s %.0f" % d["ops_per_s"], "ok", d["ok"])
'
