#!/usr/bin/env bash
# s8 device call 5 (lead, after the helper's runs): PagedKVCache.truncate / truncation_point (host-side
# Python only; the CUDA kernels are the committed s8 ones, prebuilt on the dev machine, md5-checked),
# pytest tests/test_cuda.py (the two new truncate tests included), then the full bench grid once more
# (a second reading of 32K x 8 against the 70 % copy-bandwidth target).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
md5sum -c --quiet .s8/src.md5 && echo "sources match the prebuilt library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s8/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
timeout 120 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -4 | tee "$OUT/test.log"
timeout 60 python3 -m pytest -q tests/test_cuda.py -k truncate -v 2>&1 | grep -E "PASS|FAIL|Error" | tee -a "$OUT/test.log"
echo "[$(el) s] tested"
timeout 160 python3 benchmarks/bench_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" | grep -E "^\||store|copy"
echo "[$(el) s] grid"
