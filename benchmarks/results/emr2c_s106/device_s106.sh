#!/usr/bin/env bash
# Sixty-sixth session, device call 2 (after xeon_s104.sh's wake-choice A/B on the same lease): the final code's
# CUDA build, every GPU test file on the lent GPU (h200_s100b.sh's list), then the whole suite on the lent host's
# Xeon with avx2 and avx512 required (h200_s100c.sh's command) -- the first such run since the sixtieth session;
# eleven commits since touched src/ and the CPU pool, none native/cuda/.
set -uo pipefail
. benchmarks/results/device_prologue.sh
record_machine
build_cuda || exit 1
python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee -a "$OUT/machine.txt"
KVARN_CUDA_STATEFUL_EXAMPLES=60 timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cuda_steps.py \
  tests/test_cuda_checkpoint.py tests/test_cuda_fork.py tests/test_cuda_stateful.py tests/test_integration_transformers_gpu.py \
  > "$OUT/test_cuda.log" 2>&1
echo "gpu tests rc $?"; grep -E "^FAILED|^ERROR" "$OUT/test_cuda.log" | head; tail -4 "$OUT/test_cuda.log"; echo "[$(el) s] gpu tested"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 280 python3 -m pytest -q -rs -n 12 -p no:cacheprovider tests/ > "$OUT/suite.log" 2>&1
echo "suite rc $?"; grep -E "^FAILED|^ERROR" "$OUT/suite.log" | head; tail -8 "$OUT/suite.log"; echo "[$(el) s] end"
