#!/usr/bin/env bash
# Thirty-first session, device call s71 (Xeon + H200): the quantiser statistics' fused y*y (e5d32bc) changed the
# records of every backend; the GPU store must still write the CPU's records byte for byte (test_cuda.py), the
# avx512 kernels on that machine's toolchain the scalar's (test_simd.py, test_quantize.py); the changed store
# kernel under compute-sanitizer memcheck.
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_cuda || exit 1
python3 -c "import kvarn, kvarn.cuda as kc; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kc.is_available())" | tee "$OUT/machine.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
  | grep -E "^(FAILED|SKIPPED|E |tests/test_cuda.py:[0-9]+:|[0-9]+ (passed|failed))" | tail -30 | tee "$OUT/test_cuda.log"
echo "[$(el) s] test_cuda"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py tests/test_quantize.py 2>&1 | tail -3 | tee "$OUT/test_simd_quantize.log"
echo "[$(el) s] test_simd"
timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "store_matches_cpu_records or gpu_cache_records" >"$OUT/memcheck_store.log" 2>&1; echo "memcheck exit $?" | tee -a "$OUT/memcheck_store.log"
tail -3 "$OUT/memcheck_store.log"
echo "[$(el) s] end"
