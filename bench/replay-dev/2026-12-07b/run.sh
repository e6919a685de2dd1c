#!/bin/bash
# run.sh OUTDIR ROUNDS OLD NEW
out=$1; cd /work/main/bench
for r in $(seq $2); do
  taskset -c 0 $4 -test.run '^$' -test.bench 'BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf-fit' -test.count 1 2>&1 | grep harness >> $out/index.txt
  taskset -c 0 $3 -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1 2>&1 | grep Bench >> $out/pool-old.txt
  taskset -c 0 $4 -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1 2>&1 | grep Bench >> $out/pool-new.txt
done
echo done > $out/DONE
