#!/usr/bin/env bash
# Fortieth session, device calls s80c (the tree of a171e52: eight items per thread) and s80e (the final split rule),
# the lent Xeon, CPU only, built with that machine's toolchain: test_cache.py + test_simd.py (every ISA), then the #3
# rows at 32K b1 on 16 threads, both shapes, two runs of the warm interleaved group (kvarn int16 and int8, the fp16
# kernel, numpy, SDPA enable_gqa and folded).
set -uo pipefail
. benchmarks/results/device_prologue.sh
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
export PYTHONPATH=/tmp/site_new
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 240 python3 -m pytest -q -p no:cacheprovider tests/test_cache.py tests/test_simd.py 2>&1 |
  tail -3 | tee "$OUT/tests.log"
echo "[$(el) s] tested"
for run in 1 2; do
  (cd benchmarks && KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_SHAPES=hq32-hk8-d128,smollm2-hq9-hk3-d64 \
    KVARN_BENCH_CONTEXTS=32768 KVARN_BENCH_BATCHES=1 KVARN_BENCH_TABLE="$OUT/bench16_run$run.md" timeout 200 \
    python3 -m pytest -q -p no:cacheprovider bench_attend.py -k "warm" 2>&1 | tail -4)
  grep -E "^warm|int8 score" "$OUT/bench16_run$run.md"
  echo "[$(el) s] bench run $run"
done
