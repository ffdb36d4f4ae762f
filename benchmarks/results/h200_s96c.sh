#!/usr/bin/env bash
# Fifty-sixth session, device call s96c (what s96b would have run first; the device budget left ~250 s): the fix of
# the fault s96 found (the store kernel writes a tile's block-table entry before it looks at the flags) on a GPU:
# the new regression test, the test that faulted, the step and checkpoint tests; memcheck over the new test.
set -uo pipefail
. benchmarks/results/device_prologue.sh
{ nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; lscpu | grep -E "Model name"; } > "$OUT/machine.txt"
python3 - <<'PY' || python3 -m pip install -q --no-index --find-links .whl transformers==5.25.0 > /dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("transformers").split(".")[:2]) >= (5, 24) else 1)
PY
python3 -c "import transformers; print('transformers', transformers.__version__)" >> "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
build_cuda || exit 1
timeout 70 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/test_cuda_checkpoint.py tests/test_cuda_steps.py \
  "tests/test_integration_transformers_gpu.py::test_gpu_beam_search_and_refused_step" > "$OUT/tests.log" 2>&1
echo "tests rc $?"; grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head; tail -1 "$OUT/tests.log"; echo "[$(el) s] tested"
timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 python3 -m pytest -q -x -p no:cacheprovider \
  tests/test_cuda_checkpoint.py -k "flagged_deferred" > "$OUT/memcheck.log" 2>&1
echo "memcheck rc $?"; grep -E "ERROR SUMMARY|passed|failed" "$OUT/memcheck.log" | tail -3; echo "[$(el) s] end"
