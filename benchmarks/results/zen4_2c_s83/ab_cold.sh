#!/bin/bash
# Forty-third session, Zen 4 box: per-call minima of cold and warm kvarn calls (cold.py: test_decode_cold's scheme),
# build A against build B in alternating processes, both shapes at 32K, one and two threads. Builds installed with
#   KVARN_CUDA=OFF pip install --no-build-isolation --no-deps --target /tmp/site_NAME .
# s43 = main (b522471); c1 / c1f = the change (final.patch; c1f with its final comment); the variant_*.patch builds:
# pf (scales first), v2 (L1 two ahead), v4 (scales burst), T1 (L2 one ahead), T01 (the pair in both ISA files),
# c2 (L2 three ahead), d2 (two lines a step; A=s43b, the landed change). Logs: ab_cold_<B>.log (A=s43), ab_cold_T01*.log (both ISAs), ab_cold_c2_<mode>.log (A=c1),
# ab_cold_c1_int8.log and ab_cold_final_<mode>.log (KVARN_SCORES=mode). Summaries: python ab_summ.py LOG.
PY=/work/scratch/s42/v/bin/python
for r in $(seq 1 ${ROUNDS:-4}); do for isa in ${ISAS:-avx512}; do for th in 1 2; do for shape in 3,9,64 8,32,128; do
  rr=20; [ $shape = 8,32,128 ] && rr=8
  for b in ${A:-s43} ${B:-c1}; do
    echo -n "r$r $isa th$th $shape $b: "; KVARN_ISA=$isa TH=$th SHAPE=$shape R=$rr PYTHONPATH=/tmp/site_$b $PY $(dirname "$0")/cold.py
  done
done; done; done; done
