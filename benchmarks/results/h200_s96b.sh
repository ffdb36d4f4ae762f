#!/usr/bin/env bash
# Fifty-sixth session, device call s96b: WRITTEN, NOT RUN (the session's device budget went on refused starts); for
# the next GPU session, first. s96 found an illegal address in test_gpu_beam_search_and_refused_step: a deferred step
# (append_attend's flags=) whose NaN keys the checks flagged skipped the store kernel, and with it the block-table
# entry of the tile its token completed, which the step's attend then read (stale: cudaMalloc's garbage). The store
# kernel now writes the entry first (1f7b554). (1) The new regression test and the one that faulted, the CUDA step,
# checkpoint and transformers-cache test files; compute-sanitizer memcheck over the new test. (2) End to end
# (bench_generate_cuda.py) with the session's lighter step path, three of s95b's points, one round.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"
need_transformers >> "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
build_cuda || exit 1
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/test_cuda_checkpoint.py tests/test_cuda_steps.py \
  tests/test_integration_transformers_gpu.py > "$OUT/tests.log" 2>&1; echo "tests rc $?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"; echo "[$(el) s] tested"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_cuda_checkpoint.py -k "flagged_deferred" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3; echo "[$(el) s] memcheck"
timeout 200 python3 benchmarks/bench_generate_cuda.py --points 16384x1,8192x8,32768x4 --steps 24 --rounds 1 \
  --out "$OUT/generate_cuda.json" > "$OUT/generate.log" 2>&1
echo "generate rc $?"; cat "$OUT/generate.log"; echo "[$(el) s] end"
