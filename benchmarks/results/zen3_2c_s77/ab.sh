#!/bin/bash
# Thirty-seventh session, Zen 3 box: the avx2 score loops' unpacking without lane-crossing shuffles (final form: the
# non-VNNI instantiations; this CPU has no AVX-VNNI). old = the CI venv (f7acd60), new = /tmp/site_s77 (this change),
# alternating processes, one thread, 32K, int16 (default) and int8, six rounds.
R=/work/main/benchmarks/results/zen3_2c_s77
for r in 1 2 3 4 5 6; do for mode in int16 int8; do for shape in 8,32,128 3,9,64; do
  echo -n "r$r vnni0 old: "; KVARN_SCORES=$mode SHAPE=$shape N=200 /tmp/kvarn-ci-venv/bin/python $R/aprof.py
  echo -n "r$r vnni0 new: "; KVARN_SCORES=$mode SHAPE=$shape N=200 PYTHONPATH=/tmp/site_s77 /tmp/kvarn-ci-venv/bin/python $R/aprof.py
done; done; done
