#!/usr/bin/env bash
# Device call s51 (sixteenth session): the CUDA module after a reading review's fixes (q x scale x log2(e) in two
# steps; K/V scale-overflow flag bits; Python refusals: plan/layer, misaligned pointers, self-overlapping out,
# batch > 65,535, quantize_tiles range check and capture guard). Build, tests/test_cuda.py, the quick
# benchmark (attend timings against the published 74-77 us at 32K x 8), compute-sanitizer memcheck and
# racecheck on the sanitizer workload, and the whole suite.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; nvidia-smi --query-gpu=name,driver_version --format=csv; } | tee "$OUT/machine.txt"
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
echo "== tests/test_cuda.py"
timeout 400 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -15 | tee "$OUT/test_cuda.log"
echo "[$(el) s]"
echo "== quick benchmark"
timeout 300 python3 benchmarks/bench_cuda.py --quick --out "$OUT" 2>&1 | tee "$OUT/bench_quick.log" | grep -E "^\||store share|copy" | head -40
echo "[$(el) s]"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool"
  timeout 300 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "exit $?"; tail -3 "$OUT/sanitize_$tool.log"
  echo "[$(el) s]"
done
echo "== whole suite"
timeout 400 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s] end"
