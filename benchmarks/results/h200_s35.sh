#!/usr/bin/env bash
# Device call s35 (twelfth session): host cost of the stream tracking, in-process A/B; the previous
# cuda.py against the new stream tests (one line per failure); the Xeon's completing append, line-profiled.
set -uo pipefail
source benchmarks/results/device_build.sh
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/kv_old && mkdir -p /tmp/kv_old && cp -r "$site/kvarn" /tmp/kv_old/ && cp .s15/old_cuda.py /tmp/kv_old/kvarn/cuda.py
echo "== host cost A/B"; timeout 300 python3 .s15/host_ab.py 2>&1 | tee "$OUT/host_ab.log"; echo "[$(el) s]"
echo "== new stream tests on the previous cuda.py"
PYTHONPATH=/tmp/kv_old timeout 300 python3 -m pytest -q -p no:cacheprovider --tb=line tests/test_cuda.py -k streams 2>&1 | grep -E "^/|Error|FAILED|passed|failed" | cut -c1-400 | tee "$OUT/streams_tests_old.log"
echo "[$(el) s]"
python3 -m pip install -q --no-deps --no-index --target /tmp/lp .s15/wheels/line_profiler-*.whl
echo "== Xeon append line profile"; PYTHONPATH=/tmp/lp timeout 200 python3 .s15/xeon_append_lp.py 2>&1 | tee "$OUT/xeon_append_lp.log" | grep -E "^ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+|Function|Total|two np|check_kv of" | awk '$4 > 2 || /Function|Total|two np|check_kv of/'
echo "[$(el) s] end"
