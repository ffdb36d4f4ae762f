#!/usr/bin/env bash
# Forty-sixth session, device call s86b, right after s86 on the same warm machine (run inline as this one line):
# scripts/gpu_run.sh's incremental build and its compute-sanitizer workload (memcheck, racecheck, synccheck, initcheck).
# For a rerun: benchmarks/results/h200_s84b.sh does this and s86c's sanitizers (and asan_python.sh) in one call.
. benchmarks/results/device_prologue.sh; OUT=$OUT timeout 500 bash scripts/gpu_run.sh build sanitize 2>&1 | tail -30; echo "[$(el) s] end"
