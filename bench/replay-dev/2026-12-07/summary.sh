#!/bin/bash
# summary.sh INDEX POOL-OLD POOL-NEW: per trace and variant, the median
# over the rounds of ns/traceop and of min-ns/traceop, and the rounds.
med() { sort -n | awk '{a[NR]=$1} END{n=NR; if (n%2) printf "%.2f", a[(n+1)/2]; else printf "%.2f", (a[n/2]+a[n/2+1])/2}'; }
summ() {
  grep "$2" "$1" | awk '{for(i=1;i<=NF;i++){ if($(i+1)=="ns/traceop") d=$i; if($(i+1)=="min-ns/traceop") m=$i}; print d, m}' > /tmp/summary.$$
  echo "$3 $(cut -d' ' -f1 /tmp/summary.$$ | med) $(cut -d' ' -f2 /tmp/summary.$$ | med) $(wc -l < /tmp/summary.$$)"
  rm -f /tmp/summary.$$
}
for t in lstm resnet50 tdnn; do
  summ "$1" "/$t/tlsf-harness" "$t index-goodfit"
  summ "$1" "/$t/tlsf-fit-harness" "$t index-fit"
  summ "$1" "/$t/tlsf-fit-locked-harness" "$t index-fit-locked"
  summ "$2" "/$t/vmm" "$t pool-old"
  summ "$3" "/$t/vmm" "$t pool-new"
done
