#!/usr/bin/env bash
# Device call s31 (eleventh session): the store kernel's key-norm sums now add up in registers per thread
# (one shared atomic per column per thread instead of one per code): GPU tests and the docs' examples,
# store/key-norm tests under compute-sanitizer, the whole suite, then the store kernel's time
# new / old / new / old (old = the kernel of s30, prebuilt into .s15/old/), bench_cuda.py --store-only.
set -uo pipefail
source benchmarks/results/device_build.sh
timeout 200 python3 -m pytest -q -rs -p no:cacheprovider tests/test_cuda.py tests/test_docs.py >"$OUT/test_cuda.log" 2>&1
echo "test_cuda + test_docs exit $?"; grep -E "^(FAILED|ERROR|SKIPPED)" "$OUT/test_cuda.log" | head; tail -1 "$OUT/test_cuda.log"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "beyond_the_q_bound or store or quantize_tiles" >"$OUT/memcheck.log" 2>&1; echo "memcheck exit $?"; tail -2 "$OUT/memcheck.log"
timeout 170 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head; tail -1 "$OUT/tests_all.log"
echo "[$(el) s] tested"
install_lib() {  # $1: library file -> .s15/libkvarn_cuda_kernels.a, rebuild (the CUDA sources are not compiled here)
  cp "$1" .s15/libkvarn_cuda_kernels.a
  cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --force-reinstall \
    -C build-dir=build/gpu . >>"$OUT/build.log" 2>&1 || { echo "install failed"; tail -20 "$OUT/build.log"; }
  git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
}
# Mutation: a kernel whose threads never add their register sums to shared memory (built on the dev
# machine into .s15/mut/) must fail the agreement test.
install_lib .s15/mut/libkvarn_cuda_kernels.a
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k agrees_with_the_cpu >"$OUT/mutant.log" 2>&1
echo "mutant kernel: pytest exit $? (expected 1)"; tail -1 "$OUT/mutant.log"
install_lib .s15/new_lib.a
for round in 1 2; do
  for which in new old; do
    lib=.s15/new_lib.a; [ $which = old ] && lib=.s15/old/libkvarn_cuda_kernels.a
    [ $round = 1 ] && [ $which = new ] || install_lib $lib
    echo "== $which (round $round)" | tee -a "$OUT/store_ab.log"
    timeout 120 python3 benchmarks/bench_cuda.py --store-only 2>&1 | grep -E "^store" | tee -a "$OUT/store_ab.log"
  done
done
cp .s15/new_lib.a .s15/libkvarn_cuda_kernels.a
echo "[$(el) s] end"
