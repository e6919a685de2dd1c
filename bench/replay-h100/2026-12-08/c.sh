#!/bin/bash
# lstm's (and tdnn's) cold replay on the GPU: HEAD (also with idle_release:off) against 84d61b5 (ts.old)
# and 6d0120b (ts.6d), alternating, pinned to core 3; then the per-call driver costs (CUDAVMMPage).
r=$OUT
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,pstate --format=csv,noheader > $r/gpu.txt
for i in 1 2 3 4 5 6; do for v in 6d old new new-idleoff; do for tr in lstm tdnn; do
  b=./bin/tlsf-stress; c=""; case $v in 6d) b=./bin/ts.6d;; old) b=./bin/ts.old;; new-idleoff) c="--conf idle_release:off";; esac
  echo "$i $v $tr $(taskset -c 3 $b replay --device cuda --backend tlsf-vmm --json $c $tr 2>/dev/null | python3 -c 'import json,sys; d=json.loads(sys.stdin.readline()); print(round(d["cold_ns_per_op"]), round(d["ns_per_op"],1), d["device_calls"], json.dumps(d.get("device_calls_by_name"),separators=(",",":")))')" >> $r/cold.txt
done; done; done
./bin/cuda.test -test.run '^$' -test.bench 'CUDAVMMPage|CUDAMemAllocFree' -test.benchtime 20x > $r/bench-device.txt 2>&1
cut -c1-40 $r/cold.txt; grep ^Bench $r/bench-device.txt
