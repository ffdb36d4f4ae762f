#!/usr/bin/env bash
# Device call s58 (nineteenth session): the clean-up of test_cuda.py's bare __cuda_array_interface__ helper
# (one BareCAI class instead of two local copies): the CUDA build and test_cuda.py.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
timeout 240 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -4 | tee "$OUT/test_cuda.log"
timeout 60 python3 -m pytest -q -p no:cacheprovider -rA tests/test_cuda.py -k "placed_by or another_gpu" 2>&1 | grep -E "PASSED|FAILED|SKIPPED" | tee -a "$OUT/test_cuda.log"
