#!/usr/bin/env bash
# Device call s45 (thirteenth session, final): the whole suite on the Xeon + H200 with this session's code (new:
# load_cpu of a CPU cache whose tail holds a whole tile, on the GPU); that test under compute-sanitizer memcheck;
# the Xeon's CPU decode rows at 16 threads on the current code (1K / 4K / 32K, batch 1 / 16, both shapes:
# kvarn int16 default vs the fp16 kernel, warm and cold, and the quantise share).
set -uo pipefail
source benchmarks/results/device_build.sh
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; } | tee "$OUT/machine.txt"
echo "== whole suite"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s]"
echo "== memcheck: load_cpu with a full tail"
timeout 120 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "full_tail or cpu_records_decode" >"$OUT/memcheck_load_cpu.log" 2>&1; echo "rc $?"; tail -3 "$OUT/memcheck_load_cpu.log"
echo "[$(el) s]"
echo "== Xeon CPU decode, 16 threads"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_COLD_MB=1200 KVARN_BENCH_CONTEXTS=1024,4096,32768 KVARN_BENCH_BATCHES=1,16 \
  KVARN_BENCH_TABLE="$OUT/xeon_16t_table.md" timeout 240 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
  -k "copy_bandwidth or quantize_share or decode_cold or (test_attend and (avx512-int16 or fp16-avx512) and not novnni)" \
  >"$OUT/xeon_16t_bench.log" 2>&1; echo "bench exit $?"
tail -2 "$OUT/xeon_16t_bench.log"
echo "[$(el) s] end"
