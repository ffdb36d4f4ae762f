#!/usr/bin/env bash
# s10 device call 1: attend.cuh refactor (merge_splits + merge_store shared by cluster_merge and push_merge,
# load_dense_round + dense_update shared by attend_early's and attend_kernel's sink/tail share) -- no change
# in behaviour. Kernels prebuilt on the dev machine (nvcc 13.0.88, sm_90a + compute_90, -O3 -lineinfo):
# .s8/ = HEAD's sources (old), .s10/ = the refactored attend.cuh (new; sm_90a SASS of all 24 kernels
# identical to .s8's there). The device copy of the tree holds the new attend.cuh; HEAD's travels as
# .s10/old/attend.cuh (no .git there) and is put back for the old build's md5 check.
# (a) old: pytest tests/test_cuda.py, --dump, wider dumps (h200_s10_dump.py, default variant + 5, 6, 1);
# (b) new: the same, every dump compared bit for bit (uint32 views), --sweep 0 15, memcheck + racecheck,
#     then A/B old vs new (kvarn only, alternating processes, PYTHONPATH picks the installed copy).
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
md5sum -c --quiet .s10/src.md5 && echo "new sources match .s10's library" || { echo "SOURCE MISMATCH (.s10)"; exit 1; }
cp native/cuda/attend.cuh /tmp/attend.new.cuh
cp .s10/old/attend.cuh native/cuda/attend.cuh
md5sum -c --quiet .s8/src.md5 && echo "old sources (HEAD) match .s8's library" || { echo "SOURCE MISMATCH (.s8)"; exit 1; }
cp native/cuda/CMakeLists.txt /tmp/CMakeLists.orig
build() {  # $1: .s8 or .s10
  cp "$1/CMakeLists.prebuilt.txt" native/cuda/CMakeLists.txt
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
    >"$OUT/build${1#.}.log" 2>&1 || { tail -30 "$OUT/build${1#.}.log"; exit 1; }
}
dumps() {  # $1: old or new
  timeout 40 python3 tests/test_cuda.py --dump /tmp/$1_test.npz | tail -1
  timeout 60 python3 benchmarks/results/h200_s10_dump.py /tmp/$1_full.npz --full | tail -1
  for v in 5 6 1; do KVARN_ATTEND_VARIANT=$v timeout 30 python3 benchmarks/results/h200_s10_dump.py /tmp/$1_v$v.npz | tail -1; done
}
pkgcopy() { mkdir -p /tmp/kv_$1 && cp -r "$(cd /tmp && python3 -c 'import kvarn, os; print(os.path.dirname(kvarn.__file__))')" /tmp/kv_$1/; }

# ---- (a) old = HEAD
build .s8; pkgcopy old
echo "[$(el) s] built old (.s8)"
timeout 90 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test_old.log"
echo "[$(el) s] tested old"
dumps old
echo "[$(el) s] dumped old"

# ---- (b) new = the refactored attend.cuh
cp /tmp/attend.new.cuh native/cuda/attend.cuh; cp /tmp/CMakeLists.orig native/cuda/CMakeLists.txt
md5sum -c --quiet .s10/src.md5 && echo "new sources match .s10's library" || { echo "SOURCE MISMATCH (.s10)"; exit 1; }
build .s10; pkgcopy new
echo "[$(el) s] built new (.s10)"
timeout 90 python3 -m pytest -q tests/test_cuda.py 2>&1 | tail -3 | tee "$OUT/test_new.log"
echo "[$(el) s] tested new"
dumps new
python3 - <<'PY' 2>&1 | tee "$OUT/bits.log"
import numpy as np
tot = same = 0
for name in ["test", "full", "v5", "v6", "v1"]:
    a, b = np.load(f"/tmp/old_{name}.npz"), np.load(f"/tmp/new_{name}.npz")
    assert sorted(a.files) == sorted(b.files), name
    diff = [k for k in a.files if not np.array_equal(a[k].view(np.uint32), b[k].view(np.uint32))]
    n = sum(a[k].size for k in a.files)
    print(f"{name}: {len(a.files) - len(diff)} of {len(a.files)} arrays ({n} values) bit-identical old vs new", diff[:10])
    tot += len(a.files); same += len(a.files) - len(diff)
print(f"ALL: {same} of {tot} arrays bit-identical")
PY
echo "[$(el) s] compared"
timeout 45 python3 tests/test_cuda.py --sweep 0 15 2>&1 | tee "$OUT/sweep.log" | tail -5
echo "[$(el) s] swept"
for tool in memcheck racecheck; do
  timeout 70 compute-sanitizer --tool $tool --error-exitcode 9 python3 tests/test_cuda.py --sanitize >"$OUT/sanitize_$tool.log" 2>&1
  echo "$tool: exit $? | $(tail -2 "$OUT/sanitize_$tool.log" | tr '\n' ' ')"
done
echo "[$(el) s] sanitized"
AB_POINTS=4096x1,32768x8 AB_VARIANTS="PYTHONPATH=/tmp/kv_old PYTHONPATH=/tmp/kv_new PYTHONPATH=/tmp/kv_old PYTHONPATH=/tmp/kv_new PYTHONPATH=/tmp/kv_old PYTHONPATH=/tmp/kv_new" \
  timeout 90 scripts/gpu_run.sh ab 2>&1 | grep "ctx" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
rm -rf "$OUT/ab"; rm -f "$OUT/env.log"
echo "[$(el) s] ab"
cp /tmp/CMakeLists.orig native/cuda/CMakeLists.txt
echo "[$(el) s] end"
