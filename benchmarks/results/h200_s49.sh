#!/usr/bin/env bash
# Device call s49 (fourteenth session): the whole suite on the Xeon + H200 with this session's code (a decode
# step that completes a tile hands its tail buffers on; the assisted-decoding test in float64), and the Xeon's
# quantise share (the completing append against a decode step, 16 threads) with the tail hand-on, two runs,
# beside its decode rows (kvarn int16 default vs the fp16 kernel, 1K / 4K / 32K, batch 1 / 16).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
{ date -u; lscpu | grep -E "Model name|^CPU\(s\)|L3"; } | tee "$OUT/machine.txt"
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
echo "== whole suite"
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s]"
cd benchmarks
for r in 1 2; do
  echo "== Xeon CPU decode + quantise share, 16 threads, run $r"
  KVARN_BENCH_THREADS=16 KVARN_BENCH_BUDGET=0.25 KVARN_BENCH_CONTEXTS=1024,4096,32768 KVARN_BENCH_BATCHES=1,16 \
    KVARN_BENCH_TABLE="$OUT/xeon_16t_table_run$r.md" timeout 200 python3 -m pytest -q -p no:cacheprovider bench_attend.py \
    -k "copy_bandwidth or quantize_share or (test_attend and (avx512-int16 or fp16-avx512) and not novnni)" \
    >"$OUT/xeon_16t_bench_run$r.log" 2>&1; echo "bench exit $?"
  grep "quantise per" "$OUT/xeon_16t_bench_run$r.log"
  echo "[$(el) s]"
done
echo "[$(el) s] end"
