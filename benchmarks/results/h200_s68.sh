#!/usr/bin/env bash
# Twenty-eighth session, device call s68 (the lent Xeon, CPU only): after 327d119 (the quantiser's codes by the
# reciprocal with the exact division near half-integers), test_simd.py (every ISA against scalar, records byte for
# byte, the new exact-tie test), test_cache.py and test_quantize.py built with that machine's toolchain.
set -uo pipefail
. benchmarks/results/device_prologue.sh
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/cpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee "$OUT/machine.txt"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py 2>&1 | tail -2 | tee "$OUT/test_simd.log"
timeout 200 python3 -m pytest -q -p no:cacheprovider tests/test_cache.py tests/test_quantize.py 2>&1 | tail -2 | tee "$OUT/test_cache_quantize.log"
echo "[$(el) s] end"
