#!/usr/bin/env bash
# Fifty-fifth session, device call s95: PagedKVCache.checkpoint / rollback and KVarNCache(config, device="cuda")
# (transformers layers whose cache lives on the GPU) on a GPU for the first time: their GPU tests, the CUDA test files
# again (cuda.py changed), compute-sanitizer's memcheck and initcheck over the rollback tests' GPU cases, and the
# end-to-end GPU decoding benchmark (benchmarks/bench_generate_cuda.py). transformers 5.25.0 and its dependencies
# travel in .whl/ (the machine has no network), installed only where the machine lacks transformers >= 5.24.
# Two calls (each at most 600 s): h200_s95.sh test (build, tests, memcheck), then h200_s95.sh bench (initcheck,
# the benchmark) on the same warm machine.
set -uo pipefail
PHASE=${1:-test}
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name|^CPU\(s\)"; } > "$OUT/machine.txt"
python3 - <<'PY' || python3 -m pip install -q --no-index --find-links .whl transformers==5.25.0 >> "$OUT/machine.txt" 2>&1
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("transformers").split(".")[:2]) >= (5, 24) else 1)
PY
python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)" >> "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
build_cuda || exit 1
if [ "$PHASE" = test ]; then
timeout 280 python3 -m pytest -q -rs -p no:cacheprovider -n 4 tests/test_cuda_checkpoint.py \
  tests/test_integration_transformers_gpu.py tests/test_cuda.py tests/test_cuda_steps.py tests/test_cuda_fork.py \
  tests/test_cuda_stateful.py > "$OUT/tests.log" 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20; tail -3 "$OUT/tests.log"; echo "[$(el) s] tested"
fi
for tool in memcheck initcheck; do
  [ "$PHASE" = test ] && [ $tool = initcheck ] && continue
  [ "$PHASE" = bench ] && [ $tool = memcheck ] && continue
  timeout 140 compute-sanitizer --tool $tool --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
    tests/test_cuda_checkpoint.py -k "(gives_back and k4v2 and float16) or through_a_copy" > "$OUT/$tool.log" 2>&1
  echo "$tool rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/$tool.log" | tail -3; echo "[$(el) s] $tool"
done
[ "$PHASE" = bench ] || exit 0
timeout 120 python3 -m pytest -q -s -rs -p no:cacheprovider tests/test_integration_transformers_gpu.py -k gpu_ \
  > "$OUT/tests_gpu_cache.log" 2>&1; echo "GPU cache tests rc $?"; grep -E "steps|passed|failed|^E " "$OUT/tests_gpu_cache.log" | head
timeout 90 python3 benchmarks/bench_generate_cuda.py --shape llama1b --points 1024x2 --steps 4 --rounds 1 \
  > "$OUT/generate_smoke.log" 2>&1; echo "smoke rc $?"; cat "$OUT/generate_smoke.log" | tail -12; echo "[$(el) s] smoke"
timeout 330 python3 benchmarks/bench_generate_cuda.py --out "$OUT/generate_cuda.json" > "$OUT/generate.log" 2>&1
echo "generate rc $?"; cat "$OUT/generate.log"; echo "[$(el) s] end"
