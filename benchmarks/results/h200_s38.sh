#!/usr/bin/env bash
# Device call s38 (twelfth session): the review fixes of kvarn.cuda on the H200: GPU tests, a mutant
# without the plan's cross-stream wait (the one-plan stream test must fail), memcheck.
set -uo pipefail
source benchmarks/results/device_build.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_docs.py 2>&1 | tail -4 | tee "$OUT/test_cuda.log"
echo "[$(el) s]"
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/kv_mut && mkdir -p /tmp/kv_mut && cp -r "$site/kvarn" /tmp/kv_mut/
python3 - <<'PY'
p = "/tmp/kv_mut/kvarn/cuda.py"; s = open(p).read()
old = '            _check_runtime(_cuda.stream_wait_event(stream, plan._done.handle), "attend")  # shared split states'
assert s.count(old) == 1
open(p, "w").write(s.replace(old, "            pass  # mutant: no wait"))
PY
echo "== mutant without the plan's cross-stream wait (expect 1 failed)"
PYTHONPATH=/tmp/kv_mut timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "two_streams_use_their_own" 2>&1 | tail -2 | tee "$OUT/mutant.log"
echo "[$(el) s]"
timeout 200 compute-sanitizer --tool memcheck --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_memcheck.log" 2>&1
echo "memcheck rc $?"; tail -2 "$OUT/sanitize_memcheck.log"
echo "[$(el) s] end"
