#!/usr/bin/env bash
# Device call s34 (twelfth session): kvarn.cuda stream ordering (per-stream buffers, stream events,
# plan-owned split states): the review's reproductions on the previous cuda.py and on the new one,
# the GPU tests, host cost per call old/new; the Xeon's tile-completing append, located.
set -uo pipefail
source benchmarks/results/device_build.sh
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/kv_old && mkdir -p /tmp/kv_old && cp -r "$site/kvarn" /tmp/kv_old/ && cp .s15/old_cuda.py /tmp/kv_old/kvarn/cuda.py
echo "== review reproductions, previous cuda.py"; PYTHONPATH=/tmp/kv_old timeout 300 python3 .s15/repro_streams.py 2>&1 | tee "$OUT/repro_old.log"
echo "[$(el) s]"
echo "== new stream tests on the previous cuda.py (expected to fail)"
PYTHONPATH=/tmp/kv_old timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k streams 2>&1 | tail -15 | tee "$OUT/streams_tests_old.log"
echo "[$(el) s]"
echo "== GPU tests, new code"
timeout 900 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_docs.py 2>&1 | tail -15 | tee "$OUT/test_cuda_new.log"
echo "[$(el) s]"
echo "== host cost per call, old/new alternating"
for r in 1 2 3; do
  PYTHONPATH=/tmp/kv_old python3 .s15/host_cost.py old 2>&1 | tee -a "$OUT/host_cost.log"
  python3 .s15/host_cost.py new 2>&1 | tee -a "$OUT/host_cost.log"
done
echo "[$(el) s]"
echo "== Xeon: tile-completing append located"
timeout 240 python3 .s15/locate.py 2>&1 | tee "$OUT/locate_xeon.log"
echo "[$(el) s] end"
