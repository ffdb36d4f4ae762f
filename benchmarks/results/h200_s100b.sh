#!/usr/bin/env bash
# Sixtieth session, device call s100b (after s100, on the same lease): every GPU test file on the lent GPU, with the
# transformers wheels (.whl carried), then initcheck over the step and checkpoint files (the zeroed pool's tests).
set -uo pipefail
. benchmarks/results/device_prologue.sh
record_machine
build_cuda || exit 1
KVARN_CUDA_STATEFUL_EXAMPLES=60 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cuda_steps.py \
  tests/test_cuda_checkpoint.py tests/test_cuda_fork.py tests/test_cuda_stateful.py tests/test_integration_transformers_gpu.py \
  > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR" "$OUT/test_cuda.log" | head; tail -4 "$OUT/test_cuda.log"; echo "[$(el) s] tested"
timeout 100 compute-sanitizer --tool initcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_steps.py \
  tests/test_cuda_checkpoint.py > "$OUT/initcheck_steps.log" 2>&1
echo "initcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/initcheck_steps.log" | tail -2; echo "[$(el) s] end"
