#!/usr/bin/env bash
# Lead's device call (s16), tree of the review fixes (CUDA kernels prebuilt from the current sources: .s15/, md5s
# checked): (1) the GPU and CPU tests with the Python validation changes (test_cuda, test_cache, test_quantize,
# test_simd, test_cli); (2) bench_cuda.py's new output checks (kvarn vs the CPU path on sequence 0; dequant+SDPA
# vs a float64 oracle) and --kvarn-only without a made-up copy bandwidth, both run for the first time on a GPU.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
md5sum -c --quiet .s15/src.md5 && echo "sources match .s15's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . >"$OUT/build.log" 2>&1 ||
  { tail -30 "$OUT/build.log"; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
echo "[$(el) s] built"
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_cache.py tests/test_quantize.py tests/test_simd.py tests/test_cli.py \
  >"$OUT/tests.log" 2>&1; echo "pytest exit $?"; tail -2 "$OUT/tests.log"
echo "[$(el) s] tested"
cd benchmarks
timeout 200 python3 bench_cuda.py --quick --out "$OUT" --tag s16quick >"$OUT/bench_quick.log" 2>&1; echo "bench --quick exit $?"
grep -E -i "check|FAILED|err" "$OUT/bench_quick.log" | head -20; tail -15 "$OUT/bench_quick.log"
echo "[$(el) s] quick"
timeout 100 python3 bench_cuda.py --kvarn-only --points 4096x1 --out "$OUT" --tag s16ko >"$OUT/bench_ko.log" 2>&1; echo "bench --kvarn-only exit $?"
tail -8 "$OUT/bench_ko.log"
echo "[$(el) s] end"
