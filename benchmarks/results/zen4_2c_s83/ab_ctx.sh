#!/bin/bash
# Forty-third session: main (s43) against the change (B=c1) at contexts 4K and 128K, avx512, batch 1, both shapes (cold.py).
PY=/work/scratch/s42/v/bin/python
for r in $(seq 1 ${ROUNDS:-3}); do for th in 1 2; do for ctx in 4096 131072; do for shape in 3,9,64 8,32,128; do
  rr=20; [ $ctx = 131072 ] && rr=4
  for b in s43 $B; do
    echo -n "r$r avx512 th$th $shape@$ctx $b: "; CTX=$ctx TH=$th SHAPE=$shape R=$rr PYTHONPATH=/tmp/site_$b $PY $(dirname "$0")/cold.py
  done
done; done; done; done
