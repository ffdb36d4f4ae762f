#!/usr/bin/env bash
# Thirty-sixth session, device call s76 (the lent Xeon, CPU only): the avx2 int16 value loop rewritten (masks in
# place, no widening). On a CPU with AVX-VNNI, which the Zen 3 lacks: test_simd.py (every ISA against scalar, the
# VNNI and vpmaddwd forms bit-identical), bitid.py's 336 outputs of the new against the old avx2 kernels (KVARN_ISA=avx2,
# VNNI on), and one-thread per-record times of both builds at 32K in alternating processes (aprof.py).
# The old kernels file (74811df) travels untracked as old_kernels_avx2.cpp.
set -uo pipefail
. benchmarks/results/device_prologue.sh
R=benchmarks/results/zen3_2c_s76
lscpu | grep -E 'Model name|^CPU\(s\)' | tee "$OUT/machine.txt"; grep -o -E 'avx_vnni|avx512_vnni' /proc/cpuinfo | sort -u | tee -a "$OUT/machine.txt"
build_ab_sites old_kernels_avx2.cpp native/cpu/avx2/kernels_avx2.cpp || exit 1
PYTHONPATH=/tmp/site_new python3 -c "import kvarn; print(kvarn.__file__, kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee -a "$OUT/machine.txt"
PYTHONPATH=/tmp/site_new KVARN_REQUIRE_ISAS=avx2,avx512 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py 2>&1 | tail -2 | tee "$OUT/test_simd.log"
echo "[$(el) s] tested"
KVARN_ISA=avx2 PYTHONPATH=/tmp/site_old python3 $R/bitid.py /tmp/old.npz && KVARN_ISA=avx2 PYTHONPATH=/tmp/site_new python3 $R/bitid.py /tmp/new.npz
python3 -c "
import numpy as np
a=np.load('/tmp/old.npz'); b=np.load('/tmp/new.npz'); diff=[k for k in a.files if not np.array_equal(a[k], b[k])]
print('avx2 with AVX-VNNI, old vs new: %d cases, %d differ' % (len(a.files), len(diff)), diff[:4])" | tee "$OUT/bitid.log"
for r in 1 2 3 4; do for shape in 8,32,128 3,9,64; do
  echo -n "r$r old: "; KVARN_ISA=avx2 SHAPE=$shape N=300 PYTHONPATH=/tmp/site_old taskset -c 2 python3 $R/aprof.py
  echo -n "r$r new: "; KVARN_ISA=avx2 SHAPE=$shape N=300 PYTHONPATH=/tmp/site_new taskset -c 2 python3 $R/aprof.py
done; done 2>&1 | tee "$OUT/ab_avx2_vnni_1t.log"
echo "[$(el) s] end"
