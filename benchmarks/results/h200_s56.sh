#!/usr/bin/env bash
# Device call s56 (nineteenth session): the CUDA API fixes (copy/pickle refusal, pointer placement of
# __cuda_array_interface__ arrays, the cache's own GPU checked, launch limits) and the C ABI fixes (fork-safe
# error lock, alignment and forced-ISA checks): the CUDA build, the whole suite on the Xeon + H200, and
# scripts/asan.sh (ASan + UBSan native tests on scalar, avx2, avx512 and the unusable-ISA mode).
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
python3 -c "import kvarn, kvarn.cuda as kc; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kc.is_available(), kc.is_available(0))" | tee "$OUT/machine.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -6 | tee "$OUT/test_cuda.log"
echo "[$(el) s] test_cuda"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s] suite"
CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 240 bash scripts/asan.sh build-asan-s56 >"$OUT/asan.log" 2>&1; echo "asan.sh rc $?" | tee -a "$OUT/asan.log"
grep -E "^ok|FAILED|ERROR|runtime error|all SIMD|native test" "$OUT/asan.log" | tail -12
echo "[$(el) s] end"
