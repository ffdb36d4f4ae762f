#!/usr/bin/env bash
# Fifty-fourth session, device call s94d: the two failures of the whole suite on the lent machine (s94c2, a rerun of
# h200_s88.sh), mended: the docs/cuda.md example's test (it lacked the step's q_n, k_n, v_n, since the fifty-third
# session) and the CPU benchmarks' quick run (bench_attend's clone() asserted distinct memory, which KVCache.copy() no
# longer gives: it rebuilds a KVCache from its parts now), here with any failure's traceback kept.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)|Flags" | cut -c1-200; } > "$OUT/machine.txt"
build_cuda || exit 1
timeout 60 python3 -m pytest -q -p no:cacheprovider -rs tests/test_docs.py > "$OUT/docs.log" 2>&1; echo "docs rc $?" >> "$OUT/docs.log"
tail -3 "$OUT/docs.log"
(cd benchmarks && KVARN_BENCH_QUICK=1 KVARN_BENCH_CONTEXTS=1024 KVARN_BENCH_BUDGET=0.01 KVARN_BENCH_THREADS=1 \
  KVARN_BENCH_TABLE=/tmp/t.md KVARN_BENCH_SETTLE_S=0.01 timeout 200 python3 -m pytest -q -p no:cacheprovider \
  bench_attend.py bench_quantize.py --benchmark-min-rounds=1 --benchmark-max-time=0.01 -rfs --tb=short > "$OUT/bench.log" 2>&1; echo "bench rc $?" >> "$OUT/bench.log")
grep -E "^FAILED|^E  |rc [0-9]|passed|failed" "$OUT/bench.log" | head -40
echo "[$(el) s] end"
