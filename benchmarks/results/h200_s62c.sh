set -uo pipefail
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
echo built
timeout 300 python3 -m pytest -q -p no:cacheprovider -rfs tests/test_cuda.py --tb=short 2>&1 \
  | grep -E "^(FAILED|SKIPPED|E |tests/test_cuda.py:[0-9]+:|[0-9]+ (passed|failed))" | tail -20 | tee "$OUT/test_cuda.log"
SITE=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/site_prev && mkdir -p /tmp/site_prev && cp -r "$SITE/kvarn" /tmp/site_prev/ && cp .s15/old22/cuda_5d68.py /tmp/site_prev/kvarn/cuda.py
echo "== the CAI stream test with 5d68a02's cuda.py (plain-interface producers only)"
PYTHONPATH=/tmp/site_prev timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py -k "another_stream_is_waited" 2>&1 \
  | grep -E "^(E  .*torch v|FAILED|[0-9]+ (passed|failed))" | head -5 | tee "$OUT/prev_cai.log"
