#!/usr/bin/env bash
# Fifty-seventh session, device call s97: s96b's plan (written in the fifty-sixth session, never run: its device
# budget went on refused starts) with this session's decode path. (1) The regression test of s96's fault (a deferred
# tile-completing step read a stale block-table entry; mended in 1f7b554) and the test that faulted, the CUDA step,
# checkpoint and transformers-cache test files (their GPU tests run the new one-token decode path, e5be537, against
# one-at-a-time attends, the host cache and the oracle); compute-sanitizer memcheck over the regression test.
# (2) A GPU cache layer's host time per decode step (checkpoint + append_attend flags, h200_s96_profile.py
# --step-only): this tree's cuda.py against the session's starting one (2ba8fbb, carried as .whl/old_cuda.py),
# alternating processes. (3) End to end (bench_generate_cuda.py), three of s95b's points, one round.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"
need_transformers >> "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
build_cuda || exit 1
timeout 150 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/test_cuda_checkpoint.py tests/test_cuda_steps.py \
  tests/test_integration_transformers_gpu.py > "$OUT/tests.log" 2>&1; echo "tests rc $?"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20; tail -1 "$OUT/tests.log"; echo "[$(el) s] tested"
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/old_site && mkdir -p /tmp/old_site && cp -r "$site/kvarn" /tmp/old_site/ && cp .whl/old_cuda.py /tmp/old_site/kvarn/cuda.py
for r in 1 2 3; do
  echo "old: $(PYTHONPATH=/tmp/old_site timeout 40 python3 benchmarks/results/h200_s96_profile.py --step-only 2>&1 | tail -1)"
  echo "new: $(timeout 40 python3 benchmarks/results/h200_s96_profile.py --step-only 2>&1 | tail -1)"
done 2>&1 | tee "$OUT/ab_step.log"; echo "[$(el) s] A/B"
timeout 200 python3 benchmarks/bench_generate_cuda.py --points 16384x1,8192x8,32768x4 --steps 24 --rounds 1 \
  --out "$OUT/generate_cuda.json" > "$OUT/generate.log" 2>&1
echo "generate rc $?"; cat "$OUT/generate.log"; echo "[$(el) s] generated"
timeout 90 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_cuda_checkpoint.py -k "flagged_deferred" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3; echo "[$(el) s] end"
