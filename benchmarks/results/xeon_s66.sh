#!/usr/bin/env bash
# Twenty-sixth session, device call s66 (the lent Xeon, CPU only): the current CPU kernels (int8 mode's 8-bit value
# weights, avx512 int16 loops on token quads) built with that machine's toolchain, test_simd, and the CPU benchmarks
# at 1K and 32K with 16 threads (scripts/xeon_cpu_run.sh).
set -uo pipefail
source benchmarks/results/device_prologue.sh
OUT=$OUT/xeon CONTEXTS=1024,32768 BENCH_TIMEOUT=360 bash scripts/xeon_cpu_run.sh
echo "[$(el) s] done"
