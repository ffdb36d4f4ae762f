#!/bin/bash
# The new build (/tmp/site_new) with VBMI's layouts on and off (S61_NOVBMI), alternating processes, three pairs per shape.
cd /tmp
for shape in "9 3 64" "32 8 128"; do
  for r in 1 2 3; do
    for e in on off; do
      if [ $e = on ]; then pre="env -u S61_NOVBMI"; else pre="env S61_NOVBMI=1"; fi
      echo "vbmi $e, Hq/Hk/D $shape, pair $r:"
      $pre PYTHONPATH=/tmp/site_new /tmp/kvarn-ci-venv/bin/python /work/main/benchmarks/results/emr2c_s101/per_record.py $shape
    done
  done
done
