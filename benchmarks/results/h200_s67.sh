#!/usr/bin/env bash
# Twenty-seventh session, device call s67 (Xeon + H200): the session's changes on that machine's toolchain.
# test_cuda.py now compares the GPU with the CPU's float path (h52's audit: the int16 default had let the GPU
# off with 4x its rounding), so the whole file runs; test_simd.py for the avx512 kernels (the avx2 int8 quad
# reuse, no avx512 kernel change); test_cache.py's new split-state cap and read-only settings tests.
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_cuda || exit 1
python3 -c "import kvarn, kvarn.cuda as kc; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode(), kc.is_available())" | tee "$OUT/machine.txt"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
  | grep -E "^(FAILED|SKIPPED|E |tests/test_cuda.py:[0-9]+:|[0-9]+ (passed|failed))" | tail -30 | tee "$OUT/test_cuda.log"
echo "[$(el) s] test_cuda"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_simd.py 2>&1 | tail -3 | tee "$OUT/test_simd.log"
timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_cache.py -k "split_state or read_only or thread_counts" 2>&1 | tail -3 | tee "$OUT/test_cache.log"
echo "[$(el) s] end"
