#!/usr/bin/env bash
# Device call s54 (seventeenth session, final): the whole suite on the Xeon + H200 with the session's last code
# (after the whole-change review's fixes: -mno-avx512f for the avx2 file, the x86-64-v4 object check, odd records
# dequantized as they are), KVARN_REQUIRE_ISAS=avx2,avx512, and the native drivers under ASan + UBSan on scalar,
# avx2 and avx512.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee "$OUT/machine.txt"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 420 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s]"
cmake -S . -B build/asan -G Ninja -DKVARN_CUDA=OFF -DKVARN_SANITIZE=ON >"$OUT/asan_cmake.log" 2>&1 \
  && cmake --build build/asan -j16 --target kvarn_native_test kvarn_simd_test >"$OUT/asan_build.log" 2>&1 \
  || { tail -20 "$OUT/asan_build.log"; }
for isa in scalar avx2 avx512; do
  KVARN_ISA=$isa timeout 120 build/asan/native/cpu/kvarn_native_test 2>&1 | tail -2 | tee -a "$OUT/asan_native.log"
done
timeout 120 build/asan/native/cpu/kvarn_simd_test 2>&1 | tail -2 | tee -a "$OUT/asan_native.log"
echo "[$(el) s] end"
