#!/usr/bin/env bash
# Twenty-ninth session, device call s69 (the lent Xeon, CPU only): the adaptive pool spin (2090bc2) built with
# that machine's toolchain: test_simd.py (with the new helpers-sleep test) and test_cache.py; then the old pool
# (spin.patch reversed) beside it, pool_ab.py alternating old / new three times (all cores).
set -uo pipefail
. benchmarks/results/device_prologue.sh
D=benchmarks/results/xeon2c_s69_pool_spin
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target build/site_new \
  -C build-dir=build/cpu . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built new"
PYTHONPATH=$PWD/build/site_new python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kvarn.get_num_threads())" | tee "$OUT/machine.txt"
PYTHONPATH=$PWD/build/site_new timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py tests/test_cache.py 2>&1 | tail -3 | tee "$OUT/tests.log"
echo "[$(el) s] tested"
patch -R -p1 -s < $D/spin.patch || exit 1
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target build/site_old \
  -C build-dir=build/cpu_old . >"$OUT/build_old.log" 2>&1 || { tail -40 "$OUT/build_old.log"; exit 1; }
patch -p1 -s < $D/spin.patch
echo "[$(el) s] built old"
for r in 1 2 3; do
  for s in old new; do timeout 100 python3 $D/pool_ab.py $PWD/build/site_$s 2>&1 | tee -a "$OUT/pool_ab.log"; done
done
echo "[$(el) s] end"
