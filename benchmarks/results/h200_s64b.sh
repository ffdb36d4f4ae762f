#!/usr/bin/env bash
# Device call s64b (twenty-fourth session), as run with benchmarks/results/h200_s64b/pv_scale_2e12.patch applied (the
# offset-code P.V products scaled below 2^12, kPvOffsetTop 11) against a copy built with the previous 2^15 (the sed
# below): test_cuda.py, s64_gpu_offset_range.py on both, bench_cuda.py's checked points, a 3-round kvarn-only A/B. Refuted.
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_cuda || exit 1
timeout 200 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
  | grep -E "^(FAILED|E |[0-9]+ (passed|failed))" | tail -12 | tee "$OUT/test_cuda.log"
echo "[$(el) s] test_cuda"
rm -rf /tmp/src_old && mkdir -p /tmp/src_old && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/src_old/
sed -i 's/^constexpr int kPvOffsetTop = 11;$/constexpr int kPvOffsetTop = 14;/' /tmp/src_old/native/cuda/attend.cuh
grep -c "^constexpr int kPvOffsetTop = 14;$" /tmp/src_old/native/cuda/attend.cuh || exit 1
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_old \
  -C build-dir=/tmp/build_old /tmp/src_old >"$OUT/build_old.log" 2>&1 || { tail -30 "$OUT/build_old.log"; exit 1; }
echo "[$(el) s] built the old scale"
echo "== new (products < 2^12)"; timeout 150 python3 benchmarks/results/s64_gpu_offset_range.py 2>&1 | grep -v Warning | tee "$OUT/range_new.log"
echo "== old (products < 2^15)"; PYTHONPATH=/tmp/site_old timeout 150 python3 benchmarks/results/s64_gpu_offset_range.py 2>&1 | grep -v Warning | tee "$OUT/range_old.log"
echo "[$(el) s] probes"
timeout 120 python3 benchmarks/bench_cuda.py --kvarn-only --points 4096x1,32768x8,131072x8,131072x32 --out "$OUT" >"$OUT/check_new.log" 2>&1
echo "check exit $?"; grep -E "check: kvarn|FAILED" "$OUT/check_new.log"
for round in 1 2 3; do
  for build in new old; do
    pp=""; [ $build = old ] && pp=/tmp/site_old
    PYTHONPATH=$pp timeout 60 python3 benchmarks/bench_cuda.py --kvarn-only --points 4096x1,32768x8,131072x8,131072x32 \
      --out /tmp >"$OUT/ab_${build}_$round.log" 2>&1
    echo "$build round $round exit $?: $(grep -E '^ctx' "$OUT/ab_${build}_$round.log" | sed 's/(eager.*//' | awk '{print $2"x"$4" "$6}' | tr '\n' ' ')"
  done
done
echo "[$(el) s] end"
