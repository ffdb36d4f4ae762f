#!/usr/bin/env bash
# Thirty-seventh session, device call s77e (the lent Xeon, CPU only): the avx2 row-layout helpers written once
# (interleaved_rows, rows_side_by_side; behaviour unchanged) and the device scripts' A/B builds moved into
# device_prologue.sh (build_ab_sites). test_simd.py on every ISA, and bitid.py's 336 outputs of this tree against
# a8577a1's kernels file (untracked old_kernels_avx2.cpp) with VNNI on and off: the VNNI forms run only here.
set -uo pipefail
. benchmarks/results/device_prologue.sh
R=benchmarks/results/zen3_2c_s76
build_ab_sites old_kernels_avx2.cpp native/cpu/avx2/kernels_avx2.cpp || exit 1
PYTHONPATH=/tmp/site_new KVARN_REQUIRE_ISAS=avx2,avx512 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py 2>&1 | tail -2 | tee "$OUT/test_simd.log"
for vnni in 1 0; do
  pre="import sys, kvarn._native; kvarn._native.set_vnni($vnni == 1); sys.argv = ['bitid.py', sys.argv[1]]; exec(open('$R/bitid.py').read())"
  KVARN_ISA=avx2 PYTHONPATH=/tmp/site_old python3 -c "$pre" /tmp/old$vnni.npz && KVARN_ISA=avx2 PYTHONPATH=/tmp/site_new python3 -c "$pre" /tmp/new$vnni.npz
  python3 -c "
import numpy as np
a=np.load('/tmp/old$vnni.npz'); b=np.load('/tmp/new$vnni.npz'); diff=[k for k in a.files if not np.array_equal(a[k], b[k])]
print('avx2, VNNI $vnni, old vs new: %d cases, %d differ' % (len(a.files), len(diff)), diff[:4])" | tee -a "$OUT/bitid.log"
done
echo "[$(el) s] end"
