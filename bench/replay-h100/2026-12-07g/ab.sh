set -u
r=res; mkdir -p $r
for round in 1 2; do for v in old new; do b=./bin/tlsf-stress; [ $v = old ] && b=./bin/tlsf-stress-old
for g in 2 16; do for seed in 30 31 32; do
  $b multi --device cuda --procs 2 -g $g --ops 20000 --seed $seed --json > $r/ab-$v-r$round-g$g-s$seed.json 2>/dev/null
done; done; done; done
tar czf $OUT/ab.tgz $r
for v in old new; do for g in 2 16; do echo "$v g$g: $(cat $r/ab-$v-*-g$g-*.json | python3 -c '
import sys,json,statistics as st
xs=[json.loads(l) for l in sys.stdin if l.startswith("{")]
c=sorted(d["device_calls_per_op"] for d in xs); o=sorted(d["ops_per_s"] for d in xs)
print("calls/op median %.2f [%.2f-%.2f] ops/s median %.0f n %d still %d" % (st.median(c), c[0], c[-1], st.median(o), len(xs), sum(d["out_of_memory_still_within_90pct_of_share"] for d in xs)))')"; done; done
