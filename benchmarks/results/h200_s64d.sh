#!/usr/bin/env bash
# Device call s64d (twenty-fourth session): s64c's A/B again at 32K x 8 and 128K (its 128K x 32 read 1.04x slower for
# the new scale, with the new build always timed first): five rounds, the order alternating per round.
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_cuda || exit 1
if [ ! -d /tmp/site_old/kvarn ]; then
  rm -rf /tmp/src_old && mkdir -p /tmp/src_old && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/src_old/
  sed -i 's/pow2_shift(vmax \* fast_exp2(tmax - m_new), 64)/pow2_shift(vmax, 64)/' /tmp/src_old/native/cuda/attend.cuh
  [ "$(grep -c 'pow2_shift(vmax, 64)' /tmp/src_old/native/cuda/attend.cuh)" = 2 ] || exit 1
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_old \
    -C build-dir=/tmp/build_old /tmp/src_old >"$OUT/build_old.log" 2>&1 || { tail -30 "$OUT/build_old.log"; exit 1; }
fi
echo "[$(el) s] builds ready"
for round in 1 2 3 4 5; do
  order="new old"; [ $((round % 2)) = 0 ] && order="old new"
  for build in $order; do
    pp=""; [ $build = old ] && pp=/tmp/site_old
    PYTHONPATH=$pp timeout 60 python3 benchmarks/bench_cuda.py --kvarn-only --points 32768x8,131072x8,131072x32 \
      --out /tmp >/tmp/ab.log 2>&1
    echo "$build round $round exit $?: $(grep -E '^ctx' /tmp/ab.log | sed 's/(eager.*//' | awk '{print $2"x"$4" "$6}' | tr '\n' ' ')"
  done
done
echo "[$(el) s] end"
