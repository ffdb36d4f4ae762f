#!/usr/bin/env bash
# Thirty-seventh session, device call s77b (the lent Xeon, CPU only): call s77's int16 A/B again with more rounds
# (it read 0.97-1.10 in three), the avx2 kernels forced, VNNI on and off, six alternating pairs per point.
set -uo pipefail
. benchmarks/results/device_prologue.sh
R7=benchmarks/results/zen3_2c_s77
# a warm machine still has call s77's builds
[ -d /tmp/site_new ] && [ -d /tmp/site_old ] || build_ab_sites old_kernels_avx2.cpp native/cpu/avx2/kernels_avx2.cpp || exit 1
for r in 1 2 3 4 5 6; do for vnni in 1 0; do for shape in 8,32,128 3,9,64; do
  for b in old new; do
    echo -n "r$r vnni$vnni $b: "; KVARN_ISA=avx2 VNNI=$vnni SHAPE=$shape N=300 PYTHONPATH=/tmp/site_$b taskset -c 2 python3 $R7/aprof.py
  done
done; done; done 2>&1 | tee "$OUT/ab_avx2_int16_1t.log"
echo "[$(el) s] end"
