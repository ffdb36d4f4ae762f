#!/usr/bin/env bash
# s5 device call 3 (same tree, machine still warm): same-run A/B of the attend paths, kvarn only,
# alternating processes, then the full grid (bench_cuda.py: kvarn, SDPA bf16, dequant+SDPA, eager).
#   v4 = KVARN_ATTEND_VARIANT=4: swapped tiles + merge kernel (HEAD's kernel, the baseline)
#   v6 = previous prologue + direct path; v5 = early prologue + direct path; v7 = the default (5 or 6)
set -uo pipefail
export PYTHONUNBUFFERED=1
AB_POINTS=4096x1,4096x8,32768x8,131072x8,4096x32 AB_VARIANTS="4 7 6 5 4 7 6 5" scripts/gpu_run.sh ab 2>&1 |
  grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
rm -rf "$OUT/ab"
python3 benchmarks/bench_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" | grep -E "^\||store|copy"
