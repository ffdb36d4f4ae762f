#!/usr/bin/env bash
# Sixtieth session, device call s100: the sanitizer runs that s99c planned (written in the fifty-ninth session, not
# run there). (1) memcheck over the step and checkpoint test files (one-token and multi-token steps, deferred flags,
# rollbacks), which the fixed workload of scripts/gpu_run.sh sanitize does not reach; (2) racecheck and synccheck over
# the step-vs-oracle, late-refusal and flagged-deferred tests; (3) scripts/gpu_run.sh sanitize (last run in s94b).
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"; cat "$OUT/machine.txt"
build_cuda || exit 1
san() {  # TOOL LIMIT LOG PYTEST-ARGS...
  local tool=$1 limit=$2 log=$3 extra=(); shift 3
  [ "$tool" = synccheck ] && extra=(--num-cuda-barriers 64)
  timeout "$limit" compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider "$@" \
    > "$OUT/$log" 2>&1
  echo "$tool rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" "$OUT/$log" | tail -3; echo "[$(el) s] $tool"
}
san memcheck 120 memcheck_steps.log tests/test_cuda_steps.py tests/test_cuda_checkpoint.py
SEL=(tests/test_cuda_steps.py tests/test_cuda_checkpoint.py -k "against_the_oracle or refused_by_a_late or flagged_deferred")
san racecheck 90 racecheck_steps.log "${SEL[@]}"
san synccheck 60 synccheck_steps.log "${SEL[@]}"
OUT=/tmp/san timeout 170 scripts/gpu_run.sh sanitize > "$OUT/sanitize.log" 2>&1
echo "sanitize rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|passed|failed|ok" "$OUT/sanitize.log" | head -20
echo "[$(el) s] end"
