#!/usr/bin/env bash
# Device call s55 (eighteenth session): the corrected benchmarks on the Xeon + H200 -- bench_cuda.py's quick grid
# (its graph-replayed output now checked bit for bit against an eager call, dequant+SDPA walking every layer), the
# CPU bench smoke test on avx512, and the whole suite with this session's Python changes (no native change).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo "[$(el) s] built"
python3 -c "import kvarn; print(kvarn.available_isas(), kvarn.active_isa(), kvarn.score_mode())" | tee "$OUT/machine.txt"
timeout 300 python3 benchmarks/bench_cuda.py --quick --out "$OUT" >"$OUT/bench_cuda_quick.log" 2>&1
echo "bench_cuda --quick rc $?" | tee -a "$OUT/bench_cuda_quick.log"
grep -E "^ctx|check|FAILED|differs|rc " "$OUT/bench_cuda_quick.log" | tail -20
echo "[$(el) s]"
KVARN_REQUIRE_ISAS=avx2,avx512 timeout 300 python3 -m pytest -q -p no:cacheprovider -rs tests 2>&1 | tail -8 | tee "$OUT/suite.log"
echo "[$(el) s] end"
