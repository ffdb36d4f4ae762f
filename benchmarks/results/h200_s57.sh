#!/usr/bin/env bash
# Device call s57 (nineteenth session; two H200s were asked for, none was lent: one H200): the whole-change review's fixes -- the cross-GPU refusal of a
# __cuda_array_interface__ array (its own test, which needs two GPUs), the device= error path -- and the new int16
# tests on the Xeon's avx512 (VNNI) kernels: the CUDA build, test_cuda.py, then the whole suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=32 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
python3 -c "import torch, kvarn, kvarn.cuda as kc; print(torch.cuda.device_count(), 'GPUs', kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kc.is_available(0), kc.is_available(1))" | tee "$OUT/machine.txt"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -6 | tee "$OUT/test_cuda.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rA tests/test_cuda.py -k "another_gpu or callers_current_device or placed_by" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|passed|failed" | tee -a "$OUT/test_cuda.log"
echo "[$(el) s] test_cuda"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 120 python3 -m pytest -q -p no:cacheprovider -rA tests/test_simd.py -k "int16_error_in_every or loops_over" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|passed|failed" | tee -a "$OUT/suite.log"
echo "[$(el) s] end"
