#!/usr/bin/env bash
# Device call s39 (twelfth session): append(validate=False) with a flagged tile; the mutant that passes the
# store's flag to write_tokens (the previous behaviour) must fail the new test.
set -uo pipefail
source benchmarks/results/device_build.sh
timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests/test_cuda.py tests/test_docs.py 2>&1 | tail -3 | tee "$OUT/test_cuda.log"
echo "[$(el) s]"
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/kv_mut && mkdir -p /tmp/kv_mut && cp -r "$site/kvarn" /tmp/kv_mut/
python3 - <<'PY'
p = "/tmp/kv_mut/kvarn/cuda.py"; s = open(p).read()
old = "flag.ptr if validate else self._never_set.ptr"
assert s.count(old) == 1
open(p, "w").write(s.replace(old, "flag.ptr"))
PY
echo "== mutant: write_tokens reads the store's flag (expect 1 failed)"
PYTHONPATH=/tmp/kv_mut timeout 120 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "unvalidated" 2>&1 | tail -2 | tee "$OUT/mutant.log"
echo "[$(el) s] end"
