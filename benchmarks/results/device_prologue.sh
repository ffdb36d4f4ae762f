# Sourced by the device scripts from the twenty-third session on (the earlier h200_s*.sh repeat it inline, as run):
# a scikit-build-core new enough for the build (the device machine has no network: the wheel travels in .s15/),
# a timer, and the working tree's CUDA build (incremental in build/gpu) with its log in $OUT/build.log.
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
build_cuda() {
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
    >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; return 1; }
  echo "[$(el) s] built"
}
