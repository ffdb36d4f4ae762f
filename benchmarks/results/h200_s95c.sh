#!/usr/bin/env bash
# Fifty-fifth session, device call s95c: the GPU transformers cache at the headline attention shape (Hq 32, Hk 8,
# head_dim 128, k4v2_g128) against the host cache (tests/test_integration_transformers_gpu.py, new test), and the
# host time per layer of a decode step against StaticCache's (h200_s95c_host.py).
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
python3 -c "import transformers" 2>/dev/null || python3 -m pip install -q --no-index --find-links .whl transformers==5.25.0 > /dev/null 2>&1
build_cuda || exit 1
timeout 150 python3 -m pytest -q -s -rs -p no:cacheprovider tests/test_integration_transformers_gpu.py \
  > "$OUT/tests_gpu_cache.log" 2>&1; echo "GPU cache tests rc $?"; grep -E "head_dim|float|passed|failed|^E " "$OUT/tests_gpu_cache.log" | head
timeout 120 python3 benchmarks/results/h200_s95c_host.py > "$OUT/host.log" 2>&1; echo "host rc $?"; cat "$OUT/host.log"
echo "[$(el) s] end"
