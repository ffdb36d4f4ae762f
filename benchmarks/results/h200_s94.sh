#!/usr/bin/env bash
# Fifty-fourth session, device call s94: the GPU tests and scripts/gpu_run.sh sanitize on the tree as the fifty-third
# session left it (ff6d6ae's refactor of cuda.py never ran on a GPU), and the split choice for groups above 8
# (h200_s94_splits.py).
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cuda_steps.py \
  tests/test_cuda_stateful.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/test_cuda.log"; echo "[$(el) s] tested"
timeout 180 python3 benchmarks/results/h200_s94_splits.py > "$OUT/splits.log" 2>&1; echo "rc $?" >> "$OUT/splits.log"
cat "$OUT/splits.log"; echo "[$(el) s] splits"
OUT=/tmp/san timeout 180 scripts/gpu_run.sh sanitize > "$OUT/sanitize.log" 2>&1
echo "sanitize rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|passed|failed|ok" "$OUT/sanitize.log" | head -20
echo "[$(el) s] end"
