#!/bin/bash
set -u
o=res/multi2; mkdir -p $o
start=$(date +%s)
for seeds in 33 34 35; do
  KS="2 4" G=2 bench/multi/run.sh $o "$seeds" d1024 d512 blk8
  KS="2 4" G=16 bench/multi/run.sh $o "$seeds" d1024 d512 blk8
  echo "seed $seeds done $(( $(date +%s) - start )) s" >> $o/times.txt
  python3 bench/multi/summarize.py $o > $o/summary.txt 2>&1
  tar czf $OUT/res.tgz res
done
cat $o/summary.txt $o/times.txt
