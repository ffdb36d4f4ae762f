#!/usr/bin/env bash
# Fifty-fifth session, device call s95c: the GPU transformers cache at the headline attention shape (Hq 32, Hk 8,
# head_dim 128, k4v2_g128) against the host cache (tests/test_integration_transformers_gpu.py, new test), and the
# host time per layer of a decode step against StaticCache's (h200_s95c_host.py).
set -uo pipefail
. benchmarks/results/device_prologue.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader > "$OUT/machine.txt"
# (its first run, s95c, checked only that transformers imports: the machine's own, older than 5.24, took the tests'
# cache= as an unused keyword and ran them without the cache; s95d checks the version, as h200_s95.sh does)
python3 - <<'PY' || python3 -m pip install -q --no-index --find-links .whl transformers==5.25.0 > /dev/null 2>&1
import sys
from importlib.metadata import version
sys.exit(0 if tuple(int(x) for x in version("transformers").split(".")[:2]) >= (5, 24) else 1)
PY
python3 -c "import transformers; print('transformers', transformers.__version__)" >> "$OUT/machine.txt"
build_cuda || exit 1
timeout 60 python3 benchmarks/results/h200_s95c_host.py > "$OUT/host.log" 2>&1; echo "host rc $?"; cat "$OUT/host.log"
timeout 90 python3 -m pytest -q -s -rs -p no:cacheprovider tests/test_integration_transformers_gpu.py -k "headline or refused" \
  > "$OUT/tests_gpu_cache.log" 2>&1; echo "GPU cache tests rc $?"; grep -E "head_dim|float|passed|failed|^E " "$OUT/tests_gpu_cache.log" | head
echo "[$(el) s] end"
