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
# build_ab_sites OLD PATH: CPU-only builds (pip --target) of the working tree into /tmp/site_new and of a copy of it
# with the file OLD in place of PATH into /tmp/site_old, side by side, for same-machine A/Bs of one changed file
# (from the thirty-sixth session on); build logs in $OUT.
build_site() {  # TREE SITE
  (cd "$1" && KVARN_CUDA=OFF CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q --target "$2" \
    -C build-dir=build/cpu -C cmake.define.KVARN_CUDA=OFF . >"$OUT/build_$(basename "$2").log" 2>&1) ||
    { tail -30 "$OUT/build_$(basename "$2").log"; return 1; }
}
build_ab_sites() {
  rm -rf /tmp/oldtree /tmp/site_new /tmp/site_old && mkdir /tmp/oldtree &&
    cp -r include native src pyproject.toml CMakeLists.txt README.md LICENSE /tmp/oldtree/ && cp "$1" "/tmp/oldtree/$2" || return 1
  build_site . /tmp/site_new & local new=$!
  build_site /tmp/oldtree /tmp/site_old; local old=$?
  wait $new && [ $old -eq 0 ] && echo "[$(el) s] built"
}
# need_transformers: transformers >= 5.24 (KVarNCache's cache= API), installed from .whl/ (carry it) where the
# machine's own is older (from the fifty-sixth session on; s95-s96 repeat it inline, as run)
need_transformers() {
  python3 - <<'PY' || python3 -m pip install -q --no-index --find-links .whl transformers==5.25.0 > /dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("transformers").split(".")[:2]) >= (5, 24) else 1)
PY
  python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
}
# record_machine: the GPU, driver and host CPU (and, with need_transformers, the library versions) into
# $OUT/machine.txt, shown in the log (from the fifty-seventh session's s97c on; earlier scripts repeat it inline).
record_machine() {
  { nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"
  need_transformers >> "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
}
