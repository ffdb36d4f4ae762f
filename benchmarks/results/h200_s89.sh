#!/usr/bin/env bash
# Forty-ninth session, device call s89: the GPU tests as scripts/gpu_run.sh runs them (test_cuda.py and the
# state machine, whose review refactor and start-with-a-sequence change had run only against the CPU stand-in),
# a long state-machine run with hypothesis's statistics (how many draws are now given up), and the state machine
# under each compute-sanitizer tool. Timeouts keep the whole inside one 600 s call.
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
build_cuda || exit 1
OUT="$OUT/gpu_run" timeout 170 scripts/gpu_run.sh test > "$OUT/gpu_run_test.log" 2>&1
echo "rc $?" >> "$OUT/gpu_run_test.log"; tail -n 8 "$OUT/gpu_run_test.log"; echo "[$(el) s] gpu_run.sh test"
KVARN_CUDA_STATEFUL_EXAMPLES=1000 timeout 90 python3 -m pytest -q -p no:cacheprovider -rs --hypothesis-show-statistics \
  tests/test_cuda_stateful.py > "$OUT/stateful_1000.log" 2>&1; echo "rc $?" >> "$OUT/stateful_1000.log"
grep -E "passing|passed|failed|rc " "$OUT/stateful_1000.log"; echo "[$(el) s] 1000 examples"
for tool in memcheck synccheck initcheck racecheck; do
  extra=(); [ $tool = synccheck ] && extra=(--num-cuda-barriers 64)  # as scripts/gpu_run.sh (s65)
  KVARN_CUDA_STATEFUL_EXAMPLES=40 timeout 60 compute-sanitizer --tool $tool "${extra[@]}" --error-exitcode 9 \
    python3 -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py > "$OUT/$tool.log" 2>&1
  echo "rc $?" >> "$OUT/$tool.log"; echo "$tool: $(tail -n 3 "$OUT/$tool.log" | tr '\n' ' ')"; echo "[$(el) s] $tool"
done
