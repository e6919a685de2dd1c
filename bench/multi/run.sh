#!/bin/bash
# Runs tlsf-stress multi on the GPU for K = 2, 3 and 4 processes, alternating
# builds of tlsf-stress so that each is measured on the machine as it is at
# that moment.
#
# usage: [KS="2 4"] [G=2] bench/multi/run.sh OUTDIR "SEEDS" VARIANT...
#   VARIANT "new" is bin/tlsf-stress; any other is bin/tlsf-stress-VARIANT.
#   KS lists the process counts (default 2 3 4); G, where set, is each
#   process's goroutines (-g; multi's default is the CPU count).
#   Writes OUTDIR/VARIANT[-gG]-K-SEED.json (one JSON object per process)
#   and .err (progress lines); bench/multi/summarize.py OUTDIR prints the
#   medians.
set -u
o=$1; seeds=$2; shift 2; mkdir -p "$o"
for seed in $seeds; do for k in ${KS:-2 3 4}; do for v in "$@"; do
  b=bin/tlsf-stress-$v; [ "$v" = new ] && b=bin/tlsf-stress
  n=$v${G:+-g$G}-$k-$seed
  timeout 100 "$b" multi --device cuda --procs "$k" --ops 20000 --duration 60s --seed "$seed" ${G:+-g "$G"} --json > "$o/$n.json" 2> "$o/$n.err"
done; done; done
