#!/usr/bin/env bash
# CPU-only build, SIMD tests and the CPU benchmarks on the lent Xeon (AVX-512 + VNNI + AMX,
# 300 MiB L3), in one go. Installs into a private folder so a CUDA build there is left alone.
#   scripts/xeon_cpu_run.sh            logs and tables to $OUT (default ./xeon-logs)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/xeon-logs}
mkdir -p "$OUT"
SITE=/tmp/kvarn-xeon-site
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3|Flags" | sed 's/Flags:.*/Flags: (avx512 vnni amx: '"$(grep -o -E 'avx512_vnni|amx_tile|avx512vbmi' /proc/cpuinfo | sort -u | tr '\n' ' ')"')/'; } | tee "$OUT/xeon_machine.txt"
rm -rf "$SITE"
KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) python3 -m pip install --no-build-isolation --no-deps -q --target "$SITE" \
  -C build-dir=build/xeon -C cmake.define.KVARN_CUDA=OFF . >"$OUT/xeon_build.log" 2>&1 || { tail -30 "$OUT/xeon_build.log"; exit 1; }
export PYTHONPATH=$SITE
python3 -c 'import kvarn; print(kvarn.__file__, kvarn.available_isas(), kvarn.active_isa())' | tee -a "$OUT/xeon_machine.txt"
python3 -m pytest -q -p no:cacheprovider tests/test_simd.py >"$OUT/xeon_tests.log" 2>&1; tail -2 "$OUT/xeon_tests.log"
cd benchmarks
KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=${BUDGET:-0.25} KVARN_BENCH_COLD_MB=1200 KVARN_BENCH_CONTEXTS=${CONTEXTS:-1024,32768} \
  KVARN_BENCH_BATCHES=1,16 KVARN_BENCH_TABLE="$OUT/xeon_16t_table.md" \
  timeout ${BENCH_TIMEOUT:-400} python3 -m pytest -q -p no:cacheprovider bench_attend.py bench_quantize.py \
  -k "${BENCH_K:-not scalar and not numpy and not avx2}" >"$OUT/xeon_16t_bench.log" 2>&1
tail -2 "$OUT/xeon_16t_bench.log"
