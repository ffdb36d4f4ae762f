#!/usr/bin/env bash
# Fifty-sixth session, device call s96. (1) The CUDA test files (cuda.py's step path and the fused check kernel
# changed this session) and the GPU transformers cache's test file (its headline-shape and crop-window GPU tests
# have not run; nor have the commits after 521267a). (2) A GPU cache layer's host time per decode step: an A/B of
# this tree's cuda.py against the session's starting one (3a26d01, carried in .whl/), then a profile
# (h200_s96_profile.py). (3) The open question: at Llama-3.1-8B's shape (random bf16 weights) s95b measured the GPU
# cache's logits 1.2 (relative L2) from DynamicCache's; bench_generate_cuda.py --check-host puts the GPU cache
# beside the host cache (the same records, attention on the CPU) and both beside DynamicCache, with each layer's
# attention output at the first one-token step.
set -uo pipefail
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
timeout 230 python3 -m pytest -q -rs -p no:cacheprovider -n 8 tests/test_cuda.py tests/test_cuda_steps.py \
  tests/test_cuda_checkpoint.py tests/test_cuda_fork.py tests/test_cuda_stateful.py \
  tests/test_integration_transformers_gpu.py > "$OUT/tests.log" 2>&1; echo "tests rc $?"
grep -E "^FAILED|^ERROR|^SKIPPED" "$OUT/tests.log" | head -20; tail -2 "$OUT/tests.log"; echo "[$(el) s] tested"
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/old_site && mkdir -p /tmp/old_site && cp -r "$site/kvarn" /tmp/old_site/ && cp .whl/old_cuda.py /tmp/old_site/kvarn/cuda.py
# (the old cuda.py queues three check launches where this tree's check_many queues one: the module has both)
for r in 1 2 3; do
  echo "old: $(PYTHONPATH=/tmp/old_site timeout 40 python3 benchmarks/results/h200_s96_profile.py --step-only 2>&1 | tail -1)"
  echo "new: $(timeout 40 python3 benchmarks/results/h200_s96_profile.py --step-only 2>&1 | tail -1)"
done 2>&1 | tee "$OUT/ab_step.log"; echo "[$(el) s] A/B"
timeout 60 python3 benchmarks/results/h200_s96_profile.py > "$OUT/profile.log" 2>&1; echo "profile rc $?"
grep -E "us$|step" "$OUT/profile.log" | head -20; echo "[$(el) s] profiled"
timeout 150 python3 benchmarks/bench_generate_cuda.py --shape llama8b --points "" --check-host 4096x1 \
  > "$OUT/check_host_llama8b.log" 2>&1; echo "check llama8b rc $?"; cat "$OUT/check_host_llama8b.log"; echo "[$(el) s] llama8b"
timeout 80 python3 benchmarks/bench_generate_cuda.py --shape llama1b --points "" --check-host 4096x2 \
  > "$OUT/check_host_llama1b.log" 2>&1; echo "check llama1b rc $?"; cat "$OUT/check_host_llama1b.log"; echo "[$(el) s] end"
