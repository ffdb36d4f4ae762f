#!/usr/bin/env bash
# Device call s53 (seventeenth session): the CUDA store kernel's signed-zero fix and the tightened GPU-vs-CPU record
# tests, compute-sanitizer memcheck on the sanitizer workload, and the audit's new tests (exact rounding ties,
# int16 mean error, NaN records in int8) on the Xeon's AVX-512 kernels.
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
timeout 200 python3 -m pytest -q -s -p no:cacheprovider tests/test_cuda.py 2>&1 | grep -E "vs cpu|passed|failed|Error" | tail -40 \
  | tee "$OUT/test_cuda.log"
echo "[$(el) s]"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py tests/test_quantize.py \
  tests/test_hadamard.py tests/test_packaging.py 2>&1 | tail -3 | tee "$OUT/cpu_tests.log"
echo "[$(el) s]"
timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_memcheck.log" 2>&1
echo "memcheck exit $?"; tail -3 "$OUT/sanitize_memcheck.log"
echo "[$(el) s] end"
