#!/usr/bin/env bash
# Fifty-third session, device call s93e: the final tree's GPU tests (test_cuda_stateful.py's shared refusal model
# and the step's out made like q came after s93d), 200 state-machine examples.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
KVARN_CUDA_STATEFUL_EXAMPLES=200 timeout 240 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py \
  tests/test_cuda_steps.py tests/test_cuda_stateful.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/test_cuda.log"; echo "[$(el) s] end"
