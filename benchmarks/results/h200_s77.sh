#!/usr/bin/env bash
# Thirty-seventh session, device call s77 (the lent Xeon, CPU only): the avx2 score loops' unpacking without
# lane-crossing shuffles (int16: vpbroadcastq x2 + vpblendd + vpshufb for vpunpcklbw + vpmovzxbw; int8 scores and
# values: row_quads, two in-lane vpshufb for vpinserti128 / vpermd). On a CPU with AVX-VNNI, which the Zen 3 lacks:
# test_simd.py (every ISA against scalar), bitid.py's 336 outputs of the new against the old avx2 kernels with VNNI
# on and off, and one-thread per-record times of both builds at 32K in alternating processes (aprof.py), int16 and
# int8, VNNI on and off. The old kernels file (f7acd60) travels untracked as old_kernels_avx2.cpp.
set -uo pipefail
. benchmarks/results/device_prologue.sh
R=benchmarks/results/zen3_2c_s76; R7=benchmarks/results/zen3_2c_s77
lscpu | grep -E 'Model name|^CPU\(s\)' | tee "$OUT/machine.txt"; grep -o -E 'avx_vnni|avx512_vnni' /proc/cpuinfo | sort -u | tee -a "$OUT/machine.txt"
build_ab_sites old_kernels_avx2.cpp native/cpu/avx2/kernels_avx2.cpp || exit 1
PYTHONPATH=/tmp/site_new python3 -c "import kvarn; print(kvarn.__file__, kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee -a "$OUT/machine.txt"
PYTHONPATH=/tmp/site_new KVARN_REQUIRE_ISAS=avx2,avx512 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py 2>&1 | tail -2 | tee "$OUT/test_simd.log"
echo "[$(el) s] tested"
for vnni in 1 0; do
  pre="import sys, kvarn._native; kvarn._native.set_vnni($vnni == 1); sys.argv = ['bitid.py', sys.argv[1]]; exec(open('$R/bitid.py').read())"
  KVARN_ISA=avx2 PYTHONPATH=/tmp/site_old python3 -c "$pre" /tmp/old$vnni.npz && KVARN_ISA=avx2 PYTHONPATH=/tmp/site_new python3 -c "$pre" /tmp/new$vnni.npz
  python3 -c "
import numpy as np
a=np.load('/tmp/old$vnni.npz'); b=np.load('/tmp/new$vnni.npz'); diff=[k for k in a.files if not np.array_equal(a[k], b[k])]
print('avx2, VNNI $vnni, old vs new: %d cases, %d differ' % (len(a.files), len(diff)), diff[:4])" | tee -a "$OUT/bitid.log"
done
echo "[$(el) s] bitid"
for r in $(seq "${ROUNDS:-3}"); do for mode in int16 int8; do for vnni in 1 0; do for shape in 8,32,128 3,9,64; do
  for b in old new; do
    echo -n "r$r vnni$vnni $b: "; KVARN_ISA=avx2 KVARN_SCORES=$mode VNNI=$vnni SHAPE=$shape N=200 PYTHONPATH=/tmp/site_$b taskset -c 2 python3 $R7/aprof.py
  done
done; done; done; done 2>&1 | tee "$OUT/ab_avx2_1t.log"  # cut short by the call limit if need be
echo "[$(el) s] end"
