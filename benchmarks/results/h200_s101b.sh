#!/usr/bin/env bash
# Sixty-first session, device call s101b: s101's per-record A/B of the VBMI layouts on the lent Xeon again, with six
# alternating pairs per shape, each process pinned to one vCPU (taskset; s101's two pairs did not resolve them).
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
for shape in "9 3 64" "32 8 128"; do
  for r in 1 2 3 4 5 6; do
    for e in on off; do
      if [ $e = on ]; then pre="env -u S61_NOVBMI"; else pre="env S61_NOVBMI=1"; fi
      echo "vbmi $e, Hq/Hk/D $shape, pair $r: $($pre PYTHONPATH=/tmp/site_new taskset -c 3 python3 benchmarks/results/emr2c_s101/per_record.py $shape | tail -1)"
    done
  done
done | tee "$OUT/per_record_ab_pinned.log"
echo "[$(el) s] end"
