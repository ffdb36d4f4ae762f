#!/usr/bin/env bash
# Thirty-sixth session, device call s76b (the lent Xeon, CPU only): the avx2 int16 score loop for head_dim <= 256 rewritten
# (masks in place, no widening), measured as call s76 measured the value loop: test_simd.py, bitid.py's 336 outputs of
# the new against the old avx2 kernels (KVARN_ISA=avx2, VNNI on), one-thread per-record times at 32K in alternating
# processes. The old kernels file (4a7c404: the new value loop, the old score loop) travels untracked as
# old_kernels_avx2.cpp; "new" is 4a7c404 with results/zen3_2c_s76/scores_in_place_avx2.patch applied (slower here: not
# landed).
exec bash benchmarks/results/h200_s76.sh
