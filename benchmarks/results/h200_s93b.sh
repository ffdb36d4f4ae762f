#!/usr/bin/env bash
# Fifty-third session, device call s93b: one-token decode priced by query rows per kv head (h200_s93b_gqa.py).
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
timeout 300 python3 benchmarks/results/h200_s93b_gqa.py > "$OUT/gqa.log" 2>&1; echo "rc $?" >> "$OUT/gqa.log"
cat "$OUT/gqa.log"; echo "[$(el) s] end"
