#!/usr/bin/env bash
# Device call s60 (twentieth session): the build changes (extension modules export only PyInit_*, hidden
# visibility in the CPU and CUDA cores, -mno-avx on the wrappers and the CUDA host C++, the nvcc >= 12 rule) and
# the C ABI's NULL-with-no-tiles rule, on the Xeon + H200: the CUDA build, its exports, test_cuda.py, the whole
# suite, scripts/asan.sh (scalar, avx2, avx512, unusable ISA), compute-sanitizer memcheck + racecheck.
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
grep -E "CUDA module|nvcc" "$OUT/build.log" | head -3
echo "[$(el) s] built"
python3 -c "import kvarn, kvarn.cuda as kc; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kc.is_available(), kc.is_available(0))" | tee "$OUT/machine.txt"
PKG=$(python3 -c "import kvarn, os; print(os.path.dirname(kvarn.__file__))")
for so in "$PKG"/_*.so; do echo "$(basename "$so"): $(nm -D --defined-only -C "$so" | grep -v ' PyInit_' | grep -c kvarn) exported kvarn symbols besides PyInit_"; done | tee "$OUT/exports.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -6 | tee "$OUT/test_cuda.log"
echo "[$(el) s] test_cuda"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s] suite"
for tool in memcheck racecheck; do
  timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
echo "[$(el) s] sanitized"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 bash scripts/asan.sh build-asan-s60 >"$OUT/asan.log" 2>&1; echo "asan.sh rc $?" | tee -a "$OUT/asan.log"
grep -E "^ok|FAILED|ERROR|runtime error|all SIMD|native test" "$OUT/asan.log" | tail -12
echo "[$(el) s] end"
