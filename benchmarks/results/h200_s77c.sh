#!/usr/bin/env bash
# Thirty-seventh session, device call s77c (the lent Xeon, CPU only): call s77 (h200_s77.sh) again, four rounds, on the
# tree whose AVX-VNNI instantiations keep their old forms (s77 and s77b: the broadcast forms took 1.02-1.10 of the time
# there at head_dim 64). The old kernels file (f7acd60) travels untracked as old_kernels_avx2.cpp.
ROUNDS=4 exec bash benchmarks/results/h200_s77.sh
