#!/usr/bin/env bash
# Device call s29 (tenth session, final code): the whole suite on the Xeon + H200 after the rollback freeze and its capacity fix, bfloat16 widening,
# PagedKVCache.load_cpu's key-norm check, the compute-capability check and the lazy kvarn.cuda.
set -uo pipefail
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
source benchmarks/results/device_build.sh
timeout 400 python3 -m pytest -q -rs -p no:cacheprovider tests/ >"$OUT/tests_all.log" 2>&1; echo "pytest exit $?"
grep -E "^(FAILED|ERROR)" "$OUT/tests_all.log" | head -20; tail -2 "$OUT/tests_all.log"
echo "[$(el) s] end"
