#!/usr/bin/env bash
# Forty-eighth session, device call s88b: tests/test_cuda_stateful.py (new: a hypothesis state machine for
# PagedKVCache against a model of fp16 tokens and CPU KVCaches) on the GPU — a long run (300 examples, with
# hypothesis's statistics), the suite's default (its time), and memcheck over a short run.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
KVARN_CUDA_STATEFUL_EXAMPLES=300 timeout 150 python3 -m pytest -q -p no:cacheprovider -rs --hypothesis-show-statistics \
  tests/test_cuda_stateful.py > "$OUT/stateful_300.log" 2>&1; echo "rc $?" >> "$OUT/stateful_300.log"
tail -3 "$OUT/stateful_300.log"; echo "[$(el) s] long run"
t=$SECONDS; timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py \
  > "$OUT/stateful_default.log" 2>&1; echo "rc $? in $((SECONDS - t)) s" >> "$OUT/stateful_default.log"
tail -3 "$OUT/stateful_default.log"; echo "[$(el) s] default run"
KVARN_CUDA_STATEFUL_EXAMPLES=4 timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 \
  python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py > "$OUT/memcheck_stateful.log" 2>&1
echo "rc $?" >> "$OUT/memcheck_stateful.log"; tail -4 "$OUT/memcheck_stateful.log"
echo "[$(el) s] end"
