#!/usr/bin/env bash
# Fifty-fourth session, device call s94c: fork's sink and tail rows by one strided copy per layer and buffer (cudaMemcpy2DAsync)
# instead of one per head: the GPU tests (the state machine at 100 examples), what a fork costs
# (h200_s94b_fork.py), and scripts/gpu_run.sh sanitize (its workload and state machine now fork).
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
KVARN_CUDA_STATEFUL_EXAMPLES=100 timeout 280 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py \
  tests/test_cuda_steps.py tests/test_cuda_fork.py tests/test_cuda_stateful.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR" "$OUT/test_cuda.log" | head; tail -3 "$OUT/test_cuda.log"; echo "[$(el) s] tested"
timeout 90 python3 benchmarks/results/h200_s94b_fork.py > "$OUT/fork.log" 2>&1; echo "rc $?" >> "$OUT/fork.log"
cat "$OUT/fork.log"; echo "[$(el) s] fork"
OUT=/tmp/san timeout 170 scripts/gpu_run.sh sanitize > "$OUT/sanitize.log" 2>&1
echo "sanitize rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|passed|failed|ok" "$OUT/sanitize.log" | head -20
echo "[$(el) s] end"
