#!/usr/bin/env bash
# Device calls s62 (twenty-second session), on the Xeon + H200. Step "gpu": the CUDA build (with the
# review's fixes: the q limit's 2^9 headroom, no pending runtime error after a failed call, CAI v3 streams,
# CuPy's per-device stream), test_cuda.py, the reviewer's sweep of shapes the tests do not reach (GQA 5/7/9/12/17,
# sink 0/4/200, every preset x D 64/128/256, against the CPU kernels over the GPU's records), compute-sanitizer.
# Step "cpu": the with_head_count clean-up (cede6df) on avx512: per-record times before / after in alternating
# rounds (a CPU-only build of the previous kernels from .s15/old22), test_simd, and the whole suite (which now
# builds the native drivers under ASan + UBSan and runs them on every ISA: tests/test_native.py) in step "suite".
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
if [ "${1:-gpu}" = gpu ]; then
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -v -C build-dir=build/gpu . \
    >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "[$(el) s] built"
  python3 -c "import kvarn, kvarn.cuda as kc; print(kvarn.available_isas(), kvarn.active_isa(), kc.is_available())" | tee "$OUT/machine.txt"
  nvcc --version | tail -1 | tee -a "$OUT/machine.txt"
  timeout 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
    | grep -E "^(FAILED|SKIPPED|E |tests/test_cuda.py:[0-9]+:|[0-9]+ (passed|failed))" | tail -30 | tee "$OUT/test_cuda.log"
  echo "[$(el) s] test_cuda"
  KVARN_SCORES=float timeout 200 python3 benchmarks/results/s62_gpu_edge_sweep.py > "$OUT/edge_sweep.log" 2>&1; echo "sweep rc $?"; tail -3 "$OUT/edge_sweep.log"
  grep -c "^ok" "$OUT/edge_sweep.log"; grep "^BAD" "$OUT/edge_sweep.log" | head
  echo "[$(el) s] sweep"
  for tool in memcheck racecheck; do
    timeout 100 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
    echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
  done
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = cpu ]; then
  rm -rf /tmp/old_src && mkdir -p /tmp/old_src && cp -r CMakeLists.txt pyproject.toml README.md LICENSE include native src /tmp/old_src/
  cp .s15/old22/kernels_avx512.cpp /tmp/old_src/native/cpu/avx512/ && cp .s15/old22/kernels_avx2.cpp /tmp/old_src/native/cpu/avx2/ \
    && cp .s15/old22/dispatch.h /tmp/old_src/native/cpu/
  KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_old \
    -C build-dir=/tmp/build_old /tmp/old_src >"$OUT/build_old.log" 2>&1 || { tail -30 "$OUT/build_old.log"; exit 1; }
  KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target /tmp/site_new \
    -C build-dir=/tmp/build_new . >"$OUT/build_new.log" 2>&1 || { tail -30 "$OUT/build_new.log"; exit 1; }
  NEW=/tmp/site_new  # the same kind of build as the old one (CPU only); the suite below uses the installed CUDA build
  echo "[$(el) s] old and new CPU-only builds"
  taskset -c 2 python3 benchmarks/results/s62_dispatch_ab.py /tmp/site_old "$NEW" 5 2>&1 | tee "$OUT/dispatch_ab.log" | tail -8
  echo "[$(el) s] A/B"
  KVARN_REQUIRE_ISAS=avx2,avx512 PYTHONPATH=$NEW timeout 200 python3 -m pytest -q -p no:cacheprovider -rs tests/test_simd.py 2>&1 | tail -4 | tee "$OUT/test_simd.log"
  echo "[$(el) s] test_simd"
  echo "[$(el) s] end"
fi
if [ "${1:-gpu}" = suite ]; then  # the working tree's CUDA build (incremental), then every test
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
    >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
  echo "[$(el) s] built"
  KVARN_REQUIRE_ISAS=avx2,avx512 timeout 500 python3 -m pytest -q -p no:cacheprovider -rfs tests 2>&1 | tail -12 | tee "$OUT/suite.log"
  echo "[$(el) s] end"
fi
