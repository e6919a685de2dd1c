#!/bin/bash
set -u
r=res; mkdir -p $r; s=$(date +%s)
T="lstm resnet50 tdnn bench/traces/bert.trace.gz bench/traces/deeplab.trace.gz bench/traces/llama-bf16.trace.gz bench/traces/mobilenet.trace.gz bench/traces/resnet50-infer.trace.gz bench/traces/vit.trace.gz"
TLSF_REQUIRE_GPU=1 ./bin/pool.test -test.count=1 -test.run '^TestGPU' -test.v > $r/pool-gpu-test.txt 2>&1; echo "pool gpu tests rc $? $(( $(date +%s)-s )) s" >> $r/times.txt
spin() { timeout 5 taskset -c "$1" sh -c 'while :; do :; done'; }
for c in 3 9 12; do spin $c; taskset -c $c ./bin/tlsf-stress replay --device cuda --backend tlsf-vmm --json $T > $r/replay-c$c.json 2> $r/replay-c$c.err; echo "replay c$c rc $? $(( $(date +%s)-s )) s" >> $r/times.txt; done
LD_LIBRARY_PATH=bin ./bin/tlsf-example > $r/capi-example.txt 2>&1; echo "example rc $? $(( $(date +%s)-s )) s" >> $r/times.txt
tar czf $OUT/res.tgz $r
cat $r/times.txt; grep -c "^--- PASS" $r/pool-gpu-test.txt; grep "^--- FAIL\|SKIP" $r/pool-gpu-test.txt | head
for f in $r/replay-c*.json; do python3 -c '
import json,sys
for l in open(sys.argv[1]):
  l=l.strip()
  if l.startswith("{"):
    d=json.loads(l); print(sys.argv[1][-10:], d["trace"][:8], "warm %.1f cold %.2f res %.4f wcalls %d" % (d["ns_per_op"], d["cold_ns_per_op"]/1e3, d["reserved_over_live"], d["warm_device_calls"]))' $f; done
grep "pair" $r/capi-example.txt
