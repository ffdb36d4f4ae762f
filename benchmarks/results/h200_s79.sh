#!/usr/bin/env bash
# Thirty-ninth session, device calls s79 to s79c and s79e (the lent Xeon, CPU only): scripts/asan_python.sh there, i.e. the Python test
# suite over an ASan + UBSan build of the extension on a CPU with AVX-512 (VNNI, and AVX-VNNI for the avx2 kernels), so
# the avx512 kernels and both VNNI forms run instrumented from Python. test_cuda.py and test_benchmarks.py are left out
# (the sanitizer's shadow memory and the CUDA driver's mappings do not mix; this run is about the CPU module).
# s79 ended silently (pytest's capture took UBSan's report), s79b (by hand, -v -s -x) showed it: a signed overflow in
# avx512's int-mode weights on a NaN record; s79c is this script after the fix and with -s in asan_python.sh; s79e the
# same after KVARN_SANITIZE gained float-cast-overflow (logs in results/h200_s79e/).
set -uo pipefail
. benchmarks/results/device_prologue.sh
lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-400 | tee "$OUT/machine.txt"
python3 -c "import sys, numpy, pytest, hypothesis; print(sys.version.split()[0], numpy.__version__, pytest.__version__, hypothesis.__version__)"
PYTHON=python3 KVARN_REQUIRE_ISAS=avx2,avx512 CMAKE_BUILD_PARALLEL_LEVEL=16 timeout 540 bash scripts/asan_python.sh /tmp/asan/site -- \
  tests --ignore=tests/test_cuda.py --ignore=tests/test_benchmarks.py 2>&1 | tee "$OUT/asan_python.log"
echo "rc=${PIPESTATUS[0]} [$(el) s]" | tee -a "$OUT/asan_python.log"
