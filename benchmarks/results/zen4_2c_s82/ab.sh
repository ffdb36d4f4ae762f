#!/bin/bash
# Forty-second session, Zen 4 box: scoring centred codes in the integer modes. old = /tmp/site_s42 (e312c38),
# new = /tmp/site_new (this change); alternating processes, one thread, 32K tokens, per-record time
# (zen3_2c_s76/aprof.py), the avx512 kernels (default here) and the avx2 ones forced, int16 and int8, six rounds.
# ab_1t_both_modes.log: a first build that centred int16's codes too (1.005-1.011 of the old time at 32K in int16,
# for an error already ~4e-5 of the output: not kept); ab_1t.log: the final build (int8 only); ab_1t_reversed.log:
# the same with the new build first in each pair (ORDER=reversed), to see the order's own bias.
R=/work/main/benchmarks/results
PY=${PY:-/work/scratch/s42/v/bin/python}
for r in 1 2 3 4 5 6; do for isa in avx512 avx2; do for mode in int16 int8; do for shape in 8,32,128 3,9,64; do
  builds="old:s42 new:new"; [ "$ORDER" = reversed ] && builds="new:new old:s42"
  for b in $builds; do
    echo -n "r$r ${b%%:*}: "; KVARN_ISA=$isa KVARN_SCORES=$mode SHAPE=$shape N=200 PYTHONPATH=/tmp/site_${b##*:} $PY $R/zen3_2c_s76/aprof.py
  done
done; done; done; done
