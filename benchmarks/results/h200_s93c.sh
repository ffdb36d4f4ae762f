#!/usr/bin/env bash
# Fifty-third session, device call s93c: attend programs of at most 4 query rows (the kernels' new q_rows, default
# still 8). The CUDA build, and beside it the previous commit's kernels and cuda.py (h200_s93c_old_native/) into
# /tmp/site_old; the GPU tests (new: test_attend_four_row_programs*); the 8-vs-4-row timings (h200_s93c_qrows.py);
# one-token decode at Hq 32, old vs new kernels, alternating (the kernels now read q_rows at run time).
# h200_s93c_old_native/ held native/cuda/{attend.cuh,api.cu,kvarn_cuda.h,_cuda.pyx,attend_d128.cu} and src/kvarn/cuda.py
# as of 5953c28, made with `git show 5953c28:PATH` before the call and not kept (copies of tracked history).
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; } > "$OUT/machine.txt"
rm -rf /tmp/oldtree /tmp/site_old && mkdir /tmp/oldtree &&
  cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/oldtree/ &&
  cp benchmarks/results/h200_s93c_old_native/cuda.py /tmp/oldtree/src/kvarn/ &&
  for f in attend.cuh api.cu kvarn_cuda.h _cuda.pyx attend_d128.cu; do cp benchmarks/results/h200_s93c_old_native/$f /tmp/oldtree/native/cuda/; done
(cd /tmp/oldtree && KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=8 python3 -m pip install --no-build-isolation --no-deps -q \
  --target /tmp/site_old -C build-dir=build/gpu_old . > "$OUT/build_old.log" 2>&1; echo "old build rc $?" >> "$OUT/build_old.log") &
old_pid=$!
build_cuda || exit 1
wait $old_pid; tail -1 "$OUT/build_old.log"; echo "[$(el) s] both built"
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cuda_steps.py \
  tests/test_cuda_stateful.py > "$OUT/test_cuda.log" 2>&1
echo "tests rc $?"; tail -4 "$OUT/test_cuda.log"; echo "[$(el) s] tested"
timeout 240 python3 benchmarks/results/h200_s93c_qrows.py > "$OUT/qrows.log" 2>&1; echo "rc $?" >> "$OUT/qrows.log"
cat "$OUT/qrows.log"; echo "[$(el) s] q_rows"
for round in 1 2; do
  for build in old new; do
    site=""; [ $build = old ] && site=/tmp/site_old
    PYTHONPATH=$site timeout 60 python3 benchmarks/bench_cuda.py --kvarn-only --points 4096x1,32768x1,32768x8 \
      --out /tmp --tag "${build}_$round" 2>&1 | grep -E "^ctx |Error|error" | sed "s/^/[$build $round] /"
  done
done > "$OUT/decode_ab.log" 2>&1
cat "$OUT/decode_ab.log"; echo "[$(el) s] end"
