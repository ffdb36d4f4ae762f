#!/usr/bin/env bash
# Thirty-seventh session, device call s77d (H200): the CUDA module at HEAD, whose Python side (KVCache's append
# paths, store_tokens, the scans) changed on 2026-12-02 after the last full GPU run (s71): scripts/gpu_run.sh's
# build, test (tests/test_cuda.py, GPU records against the CPU's) and sanitize (compute-sanitizer) steps.
set -uo pipefail
. benchmarks/results/device_prologue.sh
OUT=$OUT timeout 560 bash scripts/gpu_run.sh build test sanitize 2>&1 | tail -40
echo "[$(el) s] end"
