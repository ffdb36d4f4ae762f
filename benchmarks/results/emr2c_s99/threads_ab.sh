#!/bin/bash
# Fifty-ninth session: one- and two-thread attend times, main before (/tmp/site_b) and after the line-aligned item
# states (/tmp/site_new), alternating processes, three rounds; threads_scaling.py HQ HK D (min of 3 x 1 s per point).
cd /tmp
for shape in "9 3 64" "32 8 128"; do
  for r in 1 2 3; do
    for site in site_b site_new; do
      echo "== $site round $r shape $shape"
      PYTHONPATH=/tmp/$site /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/emr2c_s99/threads_scaling.py $shape
    done
  done
done
