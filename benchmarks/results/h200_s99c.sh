#!/usr/bin/env bash
# Fifty-ninth session, device call s99c: WRITTEN, NOT RUN (every start after s99b was refused until the device budget
# was spent); for the next GPU session. compute-sanitizer over what the fixed sanitizer workload does not reach.
# scripts/gpu_run.sh sanitize last ran in s94b, before checkpoint / rollback and deferred checks (s95) and the
# one-token decode path (s97), which memcheck and initcheck have seen only over selected tests since. (1) memcheck
# over the step and checkpoint test files (one-token and multi-token steps, deferred flags, rollbacks); (2) racecheck
# and synccheck over their one-token and deferred tests. (scripts/gpu_run.sh sanitize, first planned as (3), was cut:
# refused starts left too little device time for it; so were (2)'s racecheck and synccheck, memcheck alone is run.)
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
san memcheck 110 memcheck_steps.log tests/test_cuda_steps.py tests/test_cuda_checkpoint.py
echo "[$(el) s] end"
