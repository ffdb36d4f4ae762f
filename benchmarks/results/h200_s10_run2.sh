#!/usr/bin/env bash
# s10 device call 2: only the A/B timing of call 1, which printed nothing there (script bug: the A/B labels
# "PYTHONPATH=/tmp/kv_old" broke gpu_run.sh's `sed "s/^/$label /"`, so every timing line was lost).
# Same builds as call 1 (.s8 = HEAD's kernels = old, .s10 = the refactored attend.cuh = new, md5s checked);
# each installed package copied to kv_old/ or kv_new/ in the tree's root, picked per process by a relative
# PYTHONPATH (no '/' in the label); kvarn only, alternating processes, medians of CUDA-graph replays.
set -uo pipefail
export PYTHONUNBUFFERED=1
T0=$(date +%s); el() { echo $(( $(date +%s) - T0 )); }
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
md5sum -c --quiet .s10/src.md5 && echo "new sources match .s10's library" || { echo "SOURCE MISMATCH (.s10)"; exit 1; }
cp native/cuda/attend.cuh /tmp/attend.new.cuh; cp native/cuda/CMakeLists.txt /tmp/CMakeLists.orig
cp .s10/old/attend.cuh native/cuda/attend.cuh
md5sum -c --quiet .s8/src.md5 && echo "old sources (HEAD) match .s8's library" || { echo "SOURCE MISMATCH (.s8)"; exit 1; }
cp /tmp/attend.new.cuh native/cuda/attend.cuh
build() {  # $1: .s8 or .s10; $2: old or new
  cp "$1/CMakeLists.prebuilt.txt" native/cuda/CMakeLists.txt
  KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=16 python3 -m pip install --no-build-isolation --no-deps -q -C build-dir=build/gpu . \
    >"$OUT/build_$2.log" 2>&1 || { tail -30 "$OUT/build_$2.log"; exit 1; }
  mkdir -p kv_$2 && cp -r "$(cd /tmp && python3 -c 'import kvarn, os; print(os.path.dirname(kvarn.__file__))')" kv_$2/
  ls kv_$2/kvarn/_cuda*.so
}
build .s8 old; build .s10 new
cp /tmp/CMakeLists.orig native/cuda/CMakeLists.txt
echo "[$(el) s] built old and new"
AB_POINTS=4096x1,32768x8 AB_VARIANTS="PYTHONPATH=kv_old PYTHONPATH=kv_new PYTHONPATH=kv_old PYTHONPATH=kv_new PYTHONPATH=kv_old PYTHONPATH=kv_new" \
  timeout 100 scripts/gpu_run.sh ab 2>&1 | grep -E "ctx|rror" | sed -E 's/\(eager.*floor +[0-9.]+, +//; s/ of copy bw\).*//'
rm -rf "$OUT/ab" kv_old kv_new; rm -f "$OUT/env.log"
echo "[$(el) s] end"
