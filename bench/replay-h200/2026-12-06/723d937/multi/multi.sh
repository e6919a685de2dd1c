#!/bin/bash
# A/B of coarse handles (env knobs of the experimental build) in tlsf-stress multi on the GPU.
set -u
r=resm; mkdir -p $r
for K in 2 4; do for G in 2 16; do for seed in 1 2; do
  for cfg in base coarse; do
    if [ $cfg = base ]; then E="EXPMAX=64"; else E="EXPDIV=16 EXPMAX=256 EXPCAPDIV=256"; fi
    env $E ./bin/tlsf-stress-exp multi --device cuda --procs $K -g $G --ops 20000 --seed $seed --json > $r/multi-$cfg-K$K-g$G-s$seed.json 2> $r/multi-$cfg-K$K-g$G-s$seed.err
    python3 -c '
import sys,json
c=[];o=[];w=0;bad=0
for l in open(sys.argv[1]):
    if not l.startswith("{"): continue
    d=json.loads(l); c.append(d["device_calls_per_op"]); o.append(d["ops_per_s"]); w+=d["out_of_memory_still_within_90pct_of_share"]; bad+= 0 if d["ok"] else 1
c.sort(); o.sort()
print(sys.argv[2], "calls/op med %.2f max %.2f ops/s med %.0f still-within %d notok %d" % (c[len(c)//2], c[-1], o[len(o)//2], w, bad))' $r/multi-$cfg-K$K-g$G-s$seed.json "$cfg K=$K g=$G seed=$seed"
  done
done; done; done
tar czf $OUT/resm.tgz $r
