#!/usr/bin/env bash
# Device call s59 (nineteenth session), two H200s: the cross-GPU refusal of a bare __cuda_array_interface__ array
# (test_cai_array_on_another_gpu_is_refused, which needs two GPUs) and the other tests that use a second GPU, then
# test_cuda.py whole.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=32 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
python3 -c "import torch; print(torch.cuda.device_count(), 'GPUs')" | tee "$OUT/test_cuda.log"
timeout 120 python3 -m pytest -q -p no:cacheprovider -rA tests/test_cuda.py -k "another_gpu or callers_current_device or placed_by" 2>&1 | grep -E "PASSED|FAILED|SKIPPED|Error" | tee -a "$OUT/test_cuda.log"
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -3 | tee -a "$OUT/test_cuda.log"
