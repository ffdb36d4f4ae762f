#!/usr/bin/env bash
# Device call s30 (tenth session): the store kernel now also sums each key token's decoded norm and flags a
# tile beyond sqrt(D) * 2^17 (KVARN_FLAG_KEY_NORM): GPU tests + the new one under compute-sanitizer, the
# whole suite, then the store kernel's time new / old / new / old (old = the kernel before, prebuilt here
# from the previous commit into .s15/old/), kernel alone via the profiler, bench_cuda.py --store-only.
set -uo pipefail
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
source benchmarks/results/device_build.sh
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py >"$OUT/test_cuda.log" 2>&1; echo "test_cuda exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/test_cuda.log" | head; tail -1 "$OUT/test_cuda.log"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "beyond_the_q_bound or store" >"$OUT/memcheck.log" 2>&1; echo "memcheck exit $?"; tail -2 "$OUT/memcheck.log"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head; tail -1 "$OUT/tests_all.log"
echo "[$(el) s] tested"
install_lib() {  # $1: library file -> .s15/libkvarn_cuda_kernels.a, rebuild (the CUDA sources are not compiled here)
  cp "$1" .s15/libkvarn_cuda_kernels.a
  cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --force-reinstall \
    -C build-dir=build/gpu . >>"$OUT/build.log" 2>&1 || { echo "install failed"; tail -20 "$OUT/build.log"; }
  git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
}
for round in 1 2; do
  for which in new old; do
    lib=.s15/new_lib.a; [ $which = old ] && lib=.s15/old/libkvarn_cuda_kernels.a
    [ $round = 1 ] && [ $which = new ] || install_lib $lib
    echo "== $which (round $round)"
    timeout 120 python3 benchmarks/bench_cuda.py --store-only 2>&1 | grep -E "^store" | tee -a "$OUT/store_ab.log"
  done
done
cp .s15/new_lib.a .s15/libkvarn_cuda_kernels.a
echo "[$(el) s] end"
