#!/usr/bin/env bash
# Fifty-seventh session, device call s97c: written then, not run (refused starts spent that session's device budget);
# run as written in the fifty-eighth session as s98a (logs results/h200_s98a/). (1) End to end with the decode path on and off in one process
# (bench_generate_cuda.py --general-path: kvarn-general is KVarNCache with kvarn.cuda._DECODE_ROWS = 0), two rounds,
# so that the end-to-end share of this session's change is measured beside StaticCache on one machine instance.
# (2) compute-sanitizer initcheck over the deferred path (not run before): the flagged deferred tests and the step
# tests against one token at a time (n = 1: the decode path). (Cut to fit the device budget left: 24 steps, initcheck
# only; memcheck ran over the flagged deferred tests in s97.)
set -uo pipefail
. benchmarks/results/device_prologue.sh
record_machine
build_cuda || exit 1
timeout 150 python3 benchmarks/bench_generate_cuda.py --points 16384x1,8192x8 --steps 24 --rounds 2 \
  --general-path --out "$OUT/generate_cuda.json" > "$OUT/generate.log" 2>&1
echo "generate rc $?"; cat "$OUT/generate.log"; echo "[$(el) s] generated"
for tool in initcheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_cuda_checkpoint.py tests/test_cuda_steps.py -k "flagged_deferred or one_token_at_a_time" \
    > "$OUT/$tool.log" 2>&1
  echo "$tool rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/$tool.log" | tail -3; echo "[$(el) s] $tool"
done
