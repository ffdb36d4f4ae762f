#!/usr/bin/env bash
# Device call s51b: after s51 (one GPU test still matched the old zero-stride message; bench_cuda.py's warm-up
# gave only three of the layer plans their buffers, so the capture refused): tests/test_cuda.py and the quick
# benchmark, twice, the copy measured in each run.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py 2>&1 | tail -4 | tee "$OUT/test_cuda.log"
echo "[$(el) s]"
for run in 1 2; do
  mkdir -p "$OUT/run$run"
  timeout 240 python3 benchmarks/bench_cuda.py --quick --out "$OUT/run$run" >"$OUT/run$run/bench_quick.log" 2>&1
  echo "run $run exit $?"; grep -E "copy|^\| *(4096|32768)" "$OUT/run$run/bench_quick.log" | head -20
  echo "[$(el) s]"
done
