#!/bin/bash
# run.sh ROUNDS: alternates the index alone, the pool of the commit before
# (../bin/bench-old.test) and this one (../bin/bench-new.test), each built
# with `go test -c ./bench`, pinned to core 0; appends to index.txt,
# pool-old.txt and pool-new.txt in the current directory.
out=$PWD
cd "$(dirname "$0")/../../.." && cd bench || exit 1
for r in $(seq "${1:-10}"); do
  taskset -c 0 ../bin/bench-new.test -test.run '^$' -test.bench 'BenchmarkReplay/(lstm|resnet50|tdnn)/tlsf' -test.count 1 2>&1 | grep harness >> "$out/index.txt"
  taskset -c 0 ../bin/bench-old.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1 2>&1 | grep Bench >> "$out/pool-old.txt"
  taskset -c 0 ../bin/bench-new.test -test.run '^$' -test.bench 'BenchmarkPoolReplay/(lstm|resnet50|tdnn)/vmm$' -test.count 1 2>&1 | grep Bench >> "$out/pool-new.txt"
done
