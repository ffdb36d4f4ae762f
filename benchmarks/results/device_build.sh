# Sourced by the device-call scripts from the tenth session on (the earlier ones repeat these lines).
# Builds and installs kvarn on the device host with the CUDA kernels prebuilt on the dev machine
# (.s15/, carried by `run`; saves ~60 s of device time), after checking that the kernel sources are
# the ones that library was built from. Needs $OUT. Defines el (seconds since sourcing).
export PYTHONUNBUFFERED=1
# License metadata (PEP 639) needs scikit-build-core >= 0.11; install the carried wheel where it is older.
python3 - <<'PY' || python3 -m pip install -q --no-deps --no-index .s15/wheels/scikit_build_core-*.whl
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("scikit-build-core").split(".")[:2]) >= (0, 11) else 1)
PY
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
grep -E '\.(cu|cuh|h|cpp)$' .s15/src.md5 > /tmp/src_kernels.md5
md5sum -c --quiet /tmp/src_kernels.md5 && echo "kernel sources match .s15's library ($(wc -l < /tmp/src_kernels.md5) files)" ||
  { echo "SOURCE MISMATCH"; exit 1; }
cp .s15/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; git checkout -- native/cuda/CMakeLists.txt 2>/dev/null; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
echo "[$(el) s] built"
