#!/bin/bash
# usage: ab.sh siteA siteB rounds (env SHAPE, CTX, TH, N go to ../xeon2c_s67_stages/aprof.py): per round "A B B/A" (best ms of each
# process, alternating), then the median, min and max of B/A
A=$1; B=$2; R=${3:-6}; rows=$(mktemp)
for i in $(seq $R); do
  a=$(python "$(dirname "$0")/../xeon2c_s67_stages/aprof.py" $A | sed 's/.*best \([0-9.]*\).*/\1/')
  b=$(python "$(dirname "$0")/../xeon2c_s67_stages/aprof.py" $B | sed 's/.*best \([0-9.]*\).*/\1/')
  echo "$a $b $(python -c "print(f'{$b/$a:.3f}')")" | tee -a $rows
done
awk '{print $3}' $rows | sort -n | awk '{a[NR]=$1} END {print "median B/A", a[int((NR+1)/2)], "min", a[1], "max", a[NR]}'
rm -f $rows
