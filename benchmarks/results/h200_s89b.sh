#!/usr/bin/env bash
# Forty-ninth session, device call s89b: after s89's initcheck flagged PagedKVCache.to_cpu's whole-slot copies of
# the sink / tail buffers (rows never written), to_cpu copies only the rows in use: h200_s89b_to_cpu_rows.patch,
# not yet applied to src/ (no device came for it in the forty-ninth session; this script applies it). The GPU tests
# over that change, then the state machine under initcheck again. Short: little device time was left.
set -uo pipefail
git apply benchmarks/results/h200_s89b_to_cpu_rows.patch 2>/dev/null || patch -p1 -N < benchmarks/results/h200_s89b_to_cpu_rows.patch || exit 1
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
timeout 90 python3 -m pytest -q -p no:cacheprovider -rs -x tests/test_cuda.py tests/test_cuda_stateful.py \
  > "$OUT/test_cuda.log" 2>&1; echo "rc $?" >> "$OUT/test_cuda.log"; tail -n 3 "$OUT/test_cuda.log"; echo "[$(el) s] tests"
KVARN_CUDA_STATEFUL_EXAMPLES=10 timeout 90 compute-sanitizer --tool initcheck --error-exitcode 9 \
  python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py > "$OUT/initcheck.log" 2>&1
echo "rc $?" >> "$OUT/initcheck.log"; tail -n 3 "$OUT/initcheck.log"; echo "[$(el) s] initcheck"
