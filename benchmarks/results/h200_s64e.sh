#!/usr/bin/env bash
# Device call s64e (twenty-fourth session): the new GPU test test_attend_precision_many_tiles_per_program on the
# tree (each tile's own P.V scale) and on a copy with the previous scale (the sed below): it must fail there.
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_cuda || exit 1
rm -rf /tmp/src_old && mkdir -p /tmp/src_old && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/src_old/
sed -i 's/pow2_shift(vmax \* fast_exp2(tmax - m_new), 64)/pow2_shift(vmax, 64)/' /tmp/src_old/native/cuda/attend.cuh
[ "$(grep -c 'pow2_shift(vmax, 64)' /tmp/src_old/native/cuda/attend.cuh)" = 2 ] || exit 1
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_old \
  -C build-dir=/tmp/build_old /tmp/src_old >"$OUT/build_old.log" 2>&1 || { tail -30 "$OUT/build_old.log"; exit 1; }
echo "[$(el) s] built the old scale"
for build in new old; do
  pp=""; [ $build = old ] && pp=/tmp/site_old
  echo "== $build"
  PYTHONPATH=$pp timeout 120 python3 -m pytest -q -s -p no:cacheprovider tests/test_cuda.py -k many_tiles_per_program 2>&1 \
    | grep -E "\[precision\]|passed|failed|^E " | head -8
done
echo "[$(el) s] end"
