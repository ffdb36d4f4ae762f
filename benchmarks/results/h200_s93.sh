#!/usr/bin/env bash
# Fifty-third session, device call s93: multi-token steps on the GPU (PagedKVCache.append_attend; the attend
# kernels take q/out [B, T, Hq, D], meta row b * T + t per token). One call, each stage time-boxed:
#   1. the CUDA build of the working tree (installed) and, beside it, of the same tree with the five native files
#      of the commit before (h200_s93_old_native/) into /tmp/site_old, for a same-machine A/B of one-token decode;
#   2. the GPU tests: test_cuda.py, test_cuda_stateful.py (its new append_attend rule), test_cuda_steps.py;
#   3. benchmarks/bench_cuda_steps.py (one step launch vs n one-token launches; eager step vs token by token);
#   4. one-token decode, old vs new kernels, alternating (bench_cuda.py --kvarn-only, three points, two rounds);
#   5. scripts/gpu_run.sh sanitize (memcheck, racecheck, synccheck, initcheck over the fixed workload, which now
#      runs steps, and the state machine).
# h200_s93_old_native/ held the five files as of 8678b5c, made before the call and not kept (copies of tracked history):
#   mkdir -p benchmarks/results/h200_s93_old_native && for f in attend.cuh api.cu common.cuh _cuda.pyx kvarn_cuda.h; do
#     git show 8678b5c:native/cuda/$f > benchmarks/results/h200_s93_old_native/$f; done
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"
rm -rf /tmp/oldtree /tmp/site_old && mkdir /tmp/oldtree &&
  cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/oldtree/ &&
  cp benchmarks/results/h200_s93_old_native/* /tmp/oldtree/native/cuda/
(cd /tmp/oldtree && KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q \
  --target /tmp/site_old -C build-dir=build/gpu_old . > "$OUT/build_old.log" 2>&1; echo "old build rc $?" >> "$OUT/build_old.log") &
old_pid=$!
build_cuda || exit 1
wait $old_pid; tail -1 "$OUT/build_old.log"; echo "[$(el) s] both built"

timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cuda_stateful.py \
  tests/test_cuda_steps.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; tail -6 "$OUT/test_cuda.log"; echo "[$(el) s] tested"

timeout 170 python3 benchmarks/bench_cuda_steps.py --out "$OUT" > "$OUT/steps.log" 2>&1
echo "steps rc $?"; cat "$OUT/steps.log"; echo "[$(el) s] steps benched"

for round in 1 2; do
  for build in old new; do
    site=""; [ $build = old ] && site=/tmp/site_old
    PYTHONPATH=$site timeout 60 python3 benchmarks/bench_cuda.py --kvarn-only --points 4096x1,32768x1,32768x8 \
      --out /tmp --tag "${build}_$round" 2>&1 | grep -E "^ctx |device|Error|error" | sed "s/^/[$build $round] /"
  done
done > "$OUT/decode_ab.log" 2>&1
cat "$OUT/decode_ab.log"; echo "[$(el) s] a/b"

remaining=$(( 560 - $(el) ))
# its per-tool logs stay in /tmp/san (eight files come back at most); the step prints each one's tail
[ $remaining -gt 60 ] && OUT=/tmp/san timeout $remaining scripts/gpu_run.sh sanitize > "$OUT/sanitize.log" 2>&1
echo "sanitize rc $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|exit|passed|failed|ok" "$OUT/sanitize.log" | head -20
echo "[$(el) s] end"
