#!/usr/bin/env bash
# Forty-eighth session, device call s88b: tests/test_cuda_stateful.py (new: a hypothesis state machine for
# PagedKVCache against a model of fp16 tokens and CPU KVCaches) on the GPU — the suite's default (40 examples, its
# time), a longer run (200 examples, with hypothesis's statistics), and memcheck over a short run. Timeouts fit the
# device time that was left.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
t=$SECONDS; timeout 90 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda_stateful.py \
  > "$OUT/stateful_default.log" 2>&1; echo "rc $? in $((SECONDS - t)) s" >> "$OUT/stateful_default.log"
tail -3 "$OUT/stateful_default.log"; echo "[$(el) s] default run"
KVARN_CUDA_STATEFUL_EXAMPLES=200 timeout 100 python3 -m pytest -q -p no:cacheprovider -rs --hypothesis-show-statistics \
  tests/test_cuda_stateful.py > "$OUT/stateful_200.log" 2>&1; echo "rc $?" >> "$OUT/stateful_200.log"
tail -3 "$OUT/stateful_200.log"; echo "[$(el) s] long run"
KVARN_CUDA_STATEFUL_EXAMPLES=2 timeout 80 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py > "$OUT/memcheck_stateful.log" 2>&1
echo "rc $?" >> "$OUT/memcheck_stateful.log"; tail -4 "$OUT/memcheck_stateful.log"
echo "[$(el) s] end"
