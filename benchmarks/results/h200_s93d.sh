#!/usr/bin/env bash
# Fifty-third session, device call s93d: the q_rows rule in PagedKVCache._choose_q_rows, as committed: the GPU tests,
# the rule against always-8 at untimed points (h200_s93d_rule.py), and scripts/gpu_run.sh sanitize (its workload now
# also runs 4-row programs).
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cuda_steps.py \
  tests/test_cuda_stateful.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/test_cuda.log"; echo "[$(el) s] tested"
timeout 150 python3 benchmarks/results/h200_s93d_rule.py > "$OUT/rule.log" 2>&1; echo "rc $?" >> "$OUT/rule.log"
cat "$OUT/rule.log"; echo "[$(el) s] rule"
OUT=/tmp/san timeout 240 scripts/gpu_run.sh sanitize > "$OUT/sanitize.log" 2>&1
echo "sanitize rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|passed|failed|ok" "$OUT/sanitize.log" | head -20
echo "[$(el) s] end"
