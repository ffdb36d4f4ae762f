#!/usr/bin/env bash
# Device call s27 (tenth session): the C ABI's new argument checks (iters cap, byte-count overflow, thread-safe ISA
# errors), the packaging's CMake changes (KVARN_CUDA parsing, non-x86 stub) and the Python changes (checkpoint /
# rollback, from_parts key bound, compute-capability check) on the Xeon + H200: the whole suite, then the native
# test drivers on every ISA. No kernel changed, so no benchmark.
set -uo pipefail
python3 -m pip show scikit-build-core 2>/dev/null | grep -i '^version'
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
v = tuple(int(x) for x in version("scikit-build-core").split(".")[:2])
sys.exit(0 if v >= (0, 11) else 1)  # pyproject's license-files needs 0.11
PY
python3 -m pip show scikit-build-core 2>/dev/null | grep -i '^version'
source benchmarks/results/device_build.sh
timeout 400 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head -20; tail -2 "$OUT/tests_all.log"
echo "[$(el) s] tested"
cmake -S . -B build/nt -G Ninja -DKVARN_CUDA=OFF -DCMAKE_BUILD_TYPE=Release >"$OUT/native_build.log" 2>&1 &&
  cmake --build build/nt -j16 --target kvarn_native_test kvarn_simd_test >>"$OUT/native_build.log" 2>&1 || { echo "native build failed"; tail -20 "$OUT/native_build.log"; }
for isa in scalar avx2 avx512; do
  KVARN_ISA=$isa timeout 120 build/nt/native/cpu/kvarn_native_test >"$OUT/native_test_$isa.log" 2>&1; echo "native_test $isa exit $?"; tail -1 "$OUT/native_test_$isa.log"
done
timeout 120 build/nt/native/cpu/kvarn_simd_test >"$OUT/simd_test.log" 2>&1; echo "simd_test exit $?"; tail -1 "$OUT/simd_test.log"
echo "[$(el) s] end"
