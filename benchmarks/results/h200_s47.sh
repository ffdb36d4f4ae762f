#!/usr/bin/env bash
# Device call s47 (thirteenth session): the Xeon's numpy and torch rows with the corrected baselines (numpy in
# float32 throughout; torch SDPA with enable_gqa and with the query heads folded), beside kvarn and the fp16
# kernel, 16 threads, 1K / 4K / 32K, batch 1 and 16; copy and read bandwidth.
set -uo pipefail
source benchmarks/results/device_build.sh
cd benchmarks
for r in 1 2; do
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.3 KVARN_BENCH_CONTEXTS=1024,4096,32768 KVARN_BENCH_BATCHES=1,16 \
  KVARN_BENCH_TABLE="$OUT/xeon_16t_table_run$r.md" timeout 250 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
  -k "copy_bandwidth or read_bandwidth or (test_attend and (avx512-int16 or fp16-avx512 or numpy or torch) and not novnni)" \
  >"$OUT/xeon_16t_bench_run$r.log" 2>&1; echo "bench exit $?"; tail -1 "$OUT/xeon_16t_bench_run$r.log"
done
echo "[$(el) s] end"
