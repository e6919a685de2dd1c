#!/bin/bash
# Runs tlsf-stress multi on the GPU for K = 2, 3 and 4 processes, alternating
# builds of tlsf-stress so that each is measured on the machine as it is at
# that moment.
#
# usage: bench/multi/run.sh OUTDIR "SEEDS" VARIANT...
#   VARIANT "new" is bin/tlsf-stress; any other is bin/tlsf-stress-VARIANT.
#   Writes OUTDIR/VARIANT-K-SEED.json (one JSON object per process) and .err
#   (progress lines); bench/multi/summarize.py OUTDIR prints the medians.
set -u
o=$1; seeds=$2; shift 2; mkdir -p "$o"
for seed in $seeds; do for k in 2 3 4; do for v in "$@"; do
  b=bin/tlsf-stress-$v; [ "$v" = new ] && b=bin/tlsf-stress
  timeout 100 "$b" multi --device cuda --procs "$k" --ops 20000 --duration 60s --seed "$seed" --json > "$o/$v-$k-$seed.json" 2> "$o/$v-$k-$seed.err"
done; done; done
