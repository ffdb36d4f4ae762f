#!/usr/bin/env bash
# Forty-third session's plan for the lent Xeon (CPU only), not run that session (no device was lent): the avx512
# L2 prefetch of the record after next (13bbdc8) against the kernels before it, cold and warm per-call minima in
# alternating processes (zen4_2c_s83/cold.py; COLD_MB=1200 for the 300 MiB L3), 1 / 2 / 16 threads, both shapes at
# 32K; then the forty-second session's pending checks on this machine's AVX-VNNI: tests/test_simd.py and
# zen4_2c_s82/centred_scores_error.py.
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/zen4_2c_s83
rm -rf /tmp/oldtree && mkdir /tmp/oldtree && cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/oldtree/ &&
  (cd /tmp/oldtree && patch -R -p1 < "$OLDPWD/$D/prefetch_change.patch") || exit 1
build_site . /tmp/site_new & new=$!
build_site /tmp/oldtree /tmp/site_old; old=$?
wait $new && [ $old -eq 0 ] || exit 1
echo "[$(el) s] built"
for r in 1 2 3; do for th in 1 2 16; do for shape in 3,9,64 8,32,128; do
  rr=10; [ $shape = 8,32,128 ] && rr=4
  for b in old new; do
    echo -n "r$r avx512 th$th $shape $b: "
    COLD_MB=1200 TH=$th SHAPE=$shape R=$rr PYTHONPATH=/tmp/site_$b timeout 120 python3 $D/cold.py
  done
done; done; done 2>&1 | tee "$OUT/ab_cold_xeon.log"
python3 $D/ab_summ.py "$OUT/ab_cold_xeon.log" | tee "$OUT/ab_cold_xeon_summary.log"
echo "[$(el) s] A/B done"
PYTHONPATH=/tmp/site_new timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py 2>&1 | tail -3 | tee "$OUT/test_simd.log"
for isa in avx512 avx2; do  # avx2 forced: its int8 runs the AVX-VNNI (VEX vpdpbusd) form here
  KVARN_ISA=$isa timeout 150 python3 benchmarks/results/zen4_2c_s82/centred_scores_error.py /tmp/site_new "new $isa"
done 2>&1 | tee "$OUT/centred_scores_error.log"
echo "[$(el) s] end"
