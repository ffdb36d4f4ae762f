#!/usr/bin/env bash
# s13 device call 1: is VAR 23 (s12's rolled late sink/tail share, h200_s12_var22_23.patch) faster than the served
# VAR 16 when the L2 is cold at every call, as between a model's GEMMs? The tree carries the patch with 23 as the
# candidate default (md5s identical to .s12's sources); kernels prebuilt on the dev machine (nvcc 13.0.88, sm_90a +
# compute_90, -O3 -lineinfo) into .s13/. Steps: build; pytest tests/test_cuda.py (default 23); VAR 16 vs 23 outputs
# bit for bit (tests/test_cuda.py --dump, h200_s10_dump.py); alternating A/B 16 23 16 23 16 23, kvarn only, at
# 4096x1, 4096x8, 32768x8, 131072x8, 32768x1 (VAR 6 serves 32K x 1 for both: a null control): per point the
# default graph-replay median (code warm) and, with KVARN_AB_EVICT_MB=256, per-call medians after a 256 MB fill,
# after a 256 MB-weight bf16 GEMM, and after a spin kernel (no eviction); a second round if time is left.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.sm --format=csv,noheader
md5sum -c --quiet .s13/src.md5 && echo "sources match .s13's library" || { echo "SOURCE MISMATCH"; exit 1; }
cp .s13/CMakeLists.prebuilt.txt native/cuda/CMakeLists.txt
KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
  >/tmp/build.log 2>&1 || { tail -30 /tmp/build.log; exit 1; }
git checkout -- native/cuda/CMakeLists.txt 2>/dev/null || true
echo "[$(el) s] built"
timeout 100 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test.log"
echo "[$(el) s] tested"
for v in 16 23; do
  KVARN_ATTEND_VARIANT=$v timeout 40 python3 tests/test_cuda.py --dump /tmp/t_v$v.npz | tail -1
  KVARN_ATTEND_VARIANT=$v timeout 60 python3 benchmarks/results/h200_s10_dump.py /tmp/d_v$v.npz | tail -1
done
timeout 40 python3 tests/test_cuda.py --dump /tmp/t_def.npz | tail -1
python3 - <<'PY' 2>&1 | tee -a "$OUT/test.log"
import numpy as np
for x, y in [("t_v16", "t_v23"), ("d_v16", "d_v23"), ("t_v23", "t_def")]:
    a, b = np.load(f"/tmp/{x}.npz"), np.load(f"/tmp/{y}.npz")
    assert sorted(a.files) == sorted(b.files)
    diff = [k for k in a.files if not np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))]
    n = sum(a[k].size for k in a.files)
    print(f"{x} vs {y}: {len(a.files) - len(diff)} of {len(a.files)} arrays ({n} values) bit-identical", diff[:10])
PY
echo "[$(el) s] compared"
export KVARN_AB_EVICT_MB=256 KVARN_AB_EVICT_KIND=fill,gemm,none KVARN_AB_EVICT_REPS=300
P=4096x1,4096x8,32768x8,131072x8,32768x1
AB_POINTS=$P AB_VARIANTS="16 23 16 23 16 23" OUT=/tmp/ab1 timeout 150 scripts/gpu_run.sh ab 2>&1 |
  grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//' | tee "$OUT/ab1.log"
echo "[$(el) s] ab round 1"
if [ "$(el)" -lt 250 ]; then
  AB_POINTS=$P AB_VARIANTS="23 16 23 16 23 16" OUT=/tmp/ab2 timeout $((370 - $(el))) scripts/gpu_run.sh ab 2>&1 |
    grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//' | tee "$OUT/ab2.log"
  echo "[$(el) s] ab round 2"
fi
tar czf "$OUT/ab_json.tgz" -C /tmp ab1/ab $( [ -d /tmp/ab2/ab ] && echo ab2/ab ) 2>/dev/null
nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv,noheader
echo "[$(el) s] end"
