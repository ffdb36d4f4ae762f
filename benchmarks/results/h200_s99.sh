#!/usr/bin/env bash
# Fifty-ninth session, device call s99: h200_s98.sh as written (initcheck over the flagged deferred tests and the
# checkpoint tests, on the build whose page pool is zeroed at construction), then the rest of the GPU cache tests on
# that build (test_cuda.py, test_cuda_steps.py), which every PagedKVCache made goes through.
set -uo pipefail
bash benchmarks/results/h200_s98.sh
. benchmarks/results/device_prologue.sh
timeout 230 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/test_cuda.py tests/test_cuda_steps.py \
  > "$OUT/cuda_tests.log" 2>&1
echo "cuda tests rc $?"; tail -4 "$OUT/cuda_tests.log"; echo "[$(el) s] cuda tests"
