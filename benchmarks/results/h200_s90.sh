#!/usr/bin/env bash
# Fiftieth session, device call s90: s89b's fix applied to src/ (PagedKVCache.to_cpu copies only the rows in use of
# the sink / tail slots), and scripts/gpu_run.sh's sanitize step now also runs the state machine (10 examples) under
# each compute-sanitizer tool. The GPU tests as gpu_run.sh runs them, then its sanitize step. Timeouts keep the whole
# inside one 600 s call; partial logs come back.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
OUT="$OUT/gpu_run" timeout 150 scripts/gpu_run.sh test > "$OUT/gpu_run_test.log" 2>&1
echo "rc $?" >> "$OUT/gpu_run_test.log"; tail -n 6 "$OUT/gpu_run_test.log"; echo "[$(el) s] gpu_run.sh test"
mkdir -p "$OUT/sanitize"
OUT="$OUT/sanitize" timeout 380 scripts/gpu_run.sh sanitize > "$OUT/gpu_run_sanitize.log" 2>&1
echo "rc $?" >> "$OUT/gpu_run_sanitize.log"; cat "$OUT/gpu_run_sanitize.log"; echo "[$(el) s] gpu_run.sh sanitize"
