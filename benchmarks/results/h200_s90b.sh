#!/usr/bin/env bash
# Fiftieth session, device call s90b: scripts/gpu_run.sh's sanitize step after the review moved its runs into one
# function (sanitize_run): the same eight compute-sanitizer runs as s90, on a real GPU.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
mkdir -p "$OUT/sanitize"
OUT="$OUT/sanitize" timeout 300 scripts/gpu_run.sh sanitize > "$OUT/gpu_run_sanitize.log" 2>&1
echo "rc $?" >> "$OUT/gpu_run_sanitize.log"; cat "$OUT/gpu_run_sanitize.log"; echo "[$(el) s] gpu_run.sh sanitize"
