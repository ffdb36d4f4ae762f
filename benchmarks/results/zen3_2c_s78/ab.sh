#!/bin/bash
# Thirty-eighth session, Zen 3 box: the avx2 int16 score loop's odd tokens from the whole bytes (D <= 256), whole_bytes.patch.
# old = the CI venv (7dd1212), new = /tmp/site_s78 (this change); alternating processes, one thread, 32K, six rounds.
R=/work/main/benchmarks/results/zen3_2c_s77
for r in ${ROUNDS:-1 2 3 4 5 6}; do for shape in 8,32,128 3,9,64; do
  echo -n "r$r $shape old: "; SHAPE=$shape N=200 /tmp/kvarn-ci-venv/bin/python $R/aprof.py
  echo -n "r$r $shape new: "; SHAPE=$shape N=200 PYTHONPATH=/tmp/site_s78 /tmp/kvarn-ci-venv/bin/python $R/aprof.py
done; done
