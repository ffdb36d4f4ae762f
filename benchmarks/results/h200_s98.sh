#!/usr/bin/env bash
# Fifty-eighth session, device call s98: WRITTEN, NOT RUN (the device budget went on refused starts); for the next
# GPU session, first. s97c's initcheck (results/h200_s98a/, run as h200_s97c.sh) found the
# flagged deferred step's attend reading its tile's page unwritten (the store kernel skips a flagged tile); the pool
# is now zeroed when a cache is made. (1) initcheck over the flagged deferred tests again, (2) the GPU tests of
# test_cuda_checkpoint.py on that build (cut to the device budget left).
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"; cat "$OUT/machine.txt"  # no transformers needed
build_cuda || exit 1
timeout 60 compute-sanitizer --tool initcheck --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_cuda_checkpoint.py tests/test_cuda_steps.py -k "flagged_deferred" \
  > "$OUT/initcheck.log" 2>&1
echo "initcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/initcheck.log" | tail -3; echo "[$(el) s] initcheck"
timeout 90 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_cuda_checkpoint.py \
  > "$OUT/tests.log" 2>&1
echo "tests rc $?"; tail -3 "$OUT/tests.log"; echo "[$(el) s] tests"
