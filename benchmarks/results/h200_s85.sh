#!/usr/bin/env bash
# Forty-fifth session, device call s85: the #3 benchmark grid on the lent Xeon with the current code (the last whole
# CPU grid there ran in the thirteenth session, s45, before the int8 value weights, the centred int8 key codes, the
# split rule and the L2 prefetch): bench_attend.py at 16 threads, both shapes, 1K / 4K / 32K / 128K, batch 1 and 16,
# every row but the scalar and float kernels (the exact paths, far off the targets and slow at 128K x 16), then
# bench_quantize.py. One pytest process per context set, each with its own copy-bandwidth row, so that a timeout
# loses one table only. CPU-only build with that machine's toolchain.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3|Flags" | cut -c1-200; nproc; free -g | head -2; } | tee "$OUT/machine.txt"
build_site . /tmp/site_new || exit 1
echo "[$(el) s] built"
export PYTHONPATH=/tmp/site_new
cd benchmarks
grid() {  # NAME CONTEXTS TIMEOUT
  KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.2 KVARN_BENCH_COLD_MB=1200 KVARN_BENCH_CONTEXTS="$2" KVARN_BENCH_BATCHES=1,16 \
    KVARN_BENCH_TABLE="$OUT/grid_$1.md" timeout "$3" python3 -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "not scalar and not float" >/tmp/grid_$1.log 2>&1
  local rc=$?; echo "[$(el) s] grid $1 exit $rc"; tail -1 /tmp/grid_$1.log; { echo "== grid $1"; cat /tmp/grid_$1.log; } >>"$OUT/grids.log"
}
if [ "${ONLY:-}" = 32k ]; then grid 32k_run2 32768 170; grid 32k_run3 32768 170; exit; fi  # s85c: two more 32K runs
if [ "${ONLY:-}" = 1k4k ]; then grid 1k4k 1024,4096 300; exit; fi  # s85b: the 1K/4K grid again, longer
grid 32k 32768 170
grid 1k4k 1024,4096 110  # too short: s85's was cut at 110 s, rerun as s85b
grid 128k 131072 200
KVARN_BENCH_THREADS=16 KVARN_BENCH_TABLE="$OUT/quantize.md" timeout 40 python3 -m pytest -q -p no:cacheprovider \
  bench_quantize.py >/tmp/quantize.log 2>&1
echo "[$(el) s] quantize exit $?"; { echo "== quantize"; cat /tmp/quantize.log; } >>"$OUT/grids.log"
