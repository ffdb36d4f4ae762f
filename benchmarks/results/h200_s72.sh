#!/usr/bin/env bash
# Thirty-second session, device call s72 (the lent Xeon, CPU only): the shared SIMD conversion (convert_simd.inc, 74f68f6)
# and the completing append's new path (e0a5aa3) built with that machine's toolchain: the SIMD and quantiser tests, the
# cache tests, and the native drivers (native_test per ISA, simd_test) without sanitizers.
set -uo pipefail
. benchmarks/results/device_prologue.sh
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target build/site_new \
  -C build-dir=build/cpu . >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
PYTHONPATH=$PWD/build/site_new python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee "$OUT/machine.txt"
PYTHONPATH=$PWD/build/site_new timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py tests/test_quantize.py tests/test_cache.py tests/test_cache_stateful.py tests/test_hadamard.py 2>&1 | tail -3 | tee "$OUT/tests.log"
echo "[$(el) s] tested"
KVARN_SANITIZE=OFF timeout 200 bash scripts/asan.sh build/drivers 2>&1 | grep -E "native test|failure|match|FAILED" | tee "$OUT/drivers.log"
echo "[$(el) s] end"
