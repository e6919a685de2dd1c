#!/usr/bin/env python3
"""Summarizes bench/multi/run.sh output: per variant and K, the median
[range] over the processes of driver calls per operation and operations per
second, out-of-memory errors, failures within 90% of the share (still
within at return), and cuMemMap / cuMemCreate / cuMemRelease per operation.

usage: bench/multi/summarize.py DIR
"""
import glob
import json
import os
import statistics as st
import sys

rows = {}
for f in sorted(glob.glob(os.path.join(sys.argv[1], '*.json'))):
    v, k, _seed = os.path.basename(f)[:-5].rsplit('-', 2)
    for line in open(f):
        if line.strip():
            rows.setdefault((v, int(k)), []).append(json.loads(line))


def per_op(d, name):
    return d['device_calls_by_name'].get(name, 0) / d['ops']


for (v, k), r in sorted(rows.items(), key=lambda x: (x[0][1], x[0][0])):
    c = [d['device_calls_per_op'] for d in r]
    o = [d['ops_per_s'] for d in r]
    print('%-8s K=%d n=%2d calls/op %.2f [%.2f-%.2f] ops/s %d [%d-%d] ooms %d within90 %d (%d) '
          'maps/op %.2f creates/op %.2f releases/op %.2f' % (
              v, k, len(r), st.median(c), min(c), max(c), st.median(o), min(o), max(o),
              sum(d['out_of_memory'] for d in r),
              sum(d['out_of_memory_within_90pct_of_share'] for d in r),
              sum(d.get('out_of_memory_still_within_90pct_of_share', 0) for d in r),
              st.median(per_op(d, 'cuMemMap') for d in r),
              st.median(per_op(d, 'cuMemCreate') for d in r),
              st.median(per_op(d, 'cuMemRelease') for d in r)))
