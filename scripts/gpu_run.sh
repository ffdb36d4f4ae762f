#!/usr/bin/env bash
# Builds kvarn with its CUDA module, tests it (pytest + compute-sanitizer) and
# benchmarks it, in one go, on a machine with an NVIDIA GPU and nvcc.
#   scripts/gpu_run.sh [all|build|test|sanitize|profile|bench|quick|sweep|ab|before] ...   (default: all;
#   profile, ncu, runs only when named)
#   sweep: tests/test_cuda.py --sweep 0 $SWEEP_SEEDS (15); ab: kvarn-only timings of the attend variants
#   $AB_VARIANTS (KVARN_ATTEND_VARIANT) at $AB_POINTS, alternating. With KVARN_AB_EVICT_MB=N (e.g. 256) each
#   point also gets per-call timings with the L2 made cold before every call (KVARN_AB_EVICT_KIND fill / gemm /
#   none, comma-separated; KVARN_AB_EVICT_REPS calls, default 200): lines "ctx ... evict KIND N MB: ...", after
#   the unchanged default line (graph replays, code warm). See benchmarks/bench_cuda.py, make_evictor.
#   Order: build, test, bench (or quick), sanitize, profile, before -- the timings before the
#   slow sanitizer runs, so a run cut short by a time limit still has them.
#   before: rebuild with the previous attend arithmetic (KVARN_OFFSET_CODES=0) in build/old and
#   run the quick benchmark into $OUT/before -- a same-run baseline; leaves that build installed.
# Logs go to $OUT (default ./gpu-logs). Needs: python3 with torch, numpy,
# cython, scikit-build-core, pytest, hypothesis; cmake, ninja, nvcc; no network.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-logs}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(all)
want() { for s in "${steps[@]}"; do [ "$s" = all ] || [ "$s" = "$1" ] && return 0; done; return 1; }
export PYTHONUNBUFFERED=1
status=0

{
  date -u
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
  nvcc --version | tail -2
  $PY -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, torch.cuda.get_device_name(0))'
} 2>&1 | tee "$OUT/env.log"

if want build; then
  echo "== build" | tee "$OUT/build.log"
  # Persistent build dir: a warm machine rebuilds only what changed.
  build() {
    KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PY -m pip install --no-build-isolation --no-deps -v \
      -C build-dir="$2" "$1" >>"$OUT/build.log" 2>&1
  }
  if ! build . build/gpu; then
    # The working tree may hold someone's half-done edit: fall back to the last commit
    # (needs .git: the lent device machine's copy of the tree has none, so there it fails too).
    echo "working-tree build failed; building HEAD instead" | tee -a "$OUT/build.log"
    rm -rf /tmp/kvarn-head && mkdir -p /tmp/kvarn-head && git archive HEAD | tar -x -C /tmp/kvarn-head &&
      build /tmp/kvarn-head /tmp/kvarn-head/build ||
      { echo "build FAILED (tail of $OUT/build.log):"; tail -40 "$OUT/build.log"; exit 1; }
  fi
  grep -E "CUDA module|registers|spill" "$OUT/build.log" | head -5
  $PY -c 'import kvarn, kvarn.cuda as kc; print("kvarn.cuda available:", kc.is_available(), kc.unavailable_reason() or "")'
fi

if want test || want quick; then
  echo "== pytest tests/test_cuda.py tests/test_cuda_steps.py tests/test_cuda_fork.py tests/test_cuda_stateful.py"
  $PY -m pytest -q -rs -x tests/test_cuda.py tests/test_cuda_steps.py tests/test_cuda_fork.py tests/test_cuda_stateful.py \
    2>&1 | tee "$OUT/test_cuda.log" | tail -25 || status=1
  grep -qE "[0-9]+ (failed|error)" "$OUT/test_cuda.log" && status=1
  # GPU records against the CPU quantiser's (the tests print how many bytes are identical)
  $PY -m pytest -q -s tests/test_cuda.py -k "store or records_match" 2>&1 | grep -E "vs cpu" >"$OUT/store_vs_cpu.log"
  echo "store vs cpu: $(grep -c '100.0000%' "$OUT/store_vs_cpu.log") of $(wc -l <"$OUT/store_vs_cpu.log") cases byte-identical"
fi

if want bench; then
  echo "== benchmarks/bench_cuda.py"
  $PY benchmarks/bench_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" || status=1
elif want quick; then
  $PY benchmarks/bench_cuda.py --quick --out "$OUT" 2>&1 | tee "$OUT/bench_cuda.log" || status=1
fi
if want sanitize; then
  # One compute-sanitizer run of TOOL over CMD..., logged to LOG; a failure marks the run failed.
  sanitize_run() {  # TOOL LOG CMD...
    local tool=$1 log=$2 rc extra=()
    shift 2
    # synccheck's default tracker overflows on the kernels' cuda::barrier objects and the instrumented run then
    # fails to launch (s65): give it room.
    [ "$tool" = synccheck ] && extra=(--num-cuda-barriers 64)
    compute-sanitizer --tool "$tool" "${extra[@]}" --error-exitcode 9 "$@" >"$log" 2>&1
    rc=$?
    tail -4 "$log"
    if [ $rc -ne 0 ]; then echo "compute-sanitizer $tool ($(basename "$log")): exit $rc"; status=1; fi
  }
  for tool in memcheck racecheck synccheck initcheck; do
    echo "== compute-sanitizer --tool $tool"
    sanitize_run $tool "$OUT/sanitize_$tool.log" $PY tests/test_cuda.py --sanitize
    # The state machine too (a few examples): it reaches what the fixed workload above does not -- to_cpu, frees,
    # refused appends -- which is where initcheck found whole-slot host copies of unwritten rows (s89).
    KVARN_CUDA_STATEFUL_EXAMPLES=10 sanitize_run $tool "$OUT/sanitize_stateful_$tool.log" \
      $PY -m pytest -q -p no:cacheprovider tests/test_cuda_stateful.py
  done
fi

if [[ " ${steps[*]} " == *" profile "* ]]; then
  echo "== ncu (attend kernel, ctx 32K, B 8) + SASS instruction mix"
  ncu --clock-control none --kernel-name regex:attend_kernel --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --section Occupancy --section SchedulerStats --section InstructionStats \
    $PY benchmarks/bench_cuda.py --profile >"$OUT/ncu.log" 2>&1 || echo "ncu failed"
  grep -E "Duration|Throughput|Warp Cycles|Stall|Issued|Occupancy|Registers|Eligible|No Eligible" "$OUT/ncu.log" | head -40
  obj=$(find build/gpu /tmp/kvarn-head/build -name 'attend_d128.cu.o' 2>/dev/null | head -1)
  [ -n "$obj" ] && cuobjdump -sass "$obj" >"$OUT/attend_d128.sass" 2>&1
fi

if [[ " ${steps[*]} " == *" sweep "* ]]; then
  echo "== precision sweep (tests/test_cuda.py --sweep 0 ${SWEEP_SEEDS:-15})"
  $PY tests/test_cuda.py --sweep 0 "${SWEEP_SEEDS:-15}" 2>&1 | tee "$OUT/sweep.log" | tail -8 || status=1
fi

if [[ " ${steps[*]} " == *" ab "* ]]; then
  # Same-run A/B of the k4v2_g128 D 128 attend variants (KVARN_ATTEND_VARIANT, attend_d128.cu),
  # kvarn only, alternating so that clock drift hits every variant alike.
  # An entry of $AB_VARIANTS is a variant number (KVARN_ATTEND_VARIANT) or a comma-separated list of
  # VAR=VALUE settings (e.g. KVARN_ATTEND_VARIANT=12,KVARN_ATTEND_DIRECT=0: the two the kernels read).
  # KVARN_AB_EVICT_MB / _KIND / _REPS (environment, passed through): the L2-eviction timings (header).
  echo "== A/B: variants ${AB_VARIANTS:-12 16 12 16} at ${AB_POINTS:-32768x8,4096x1}${KVARN_AB_EVICT_MB:+, L2 evicted (${KVARN_AB_EVICT_MB} MB ${KVARN_AB_EVICT_KIND:-fill}) and warm}"
  abn=0
  for v in ${AB_VARIANTS:-12 16 12 16}; do
    abn=$((abn + 1))
    if [[ "$v" == *=* ]]; then envs=(${v//,/ }); tag=$(echo "$v" | tr -c 'A-Za-z0-9=\n' '_' | tr '=' '-'); label=$v
    else envs=("KVARN_ATTEND_VARIANT=$v"); tag="v$v"; label="v$v"; fi
    env "${envs[@]}" $PY benchmarks/bench_cuda.py --kvarn-only --points "${AB_POINTS:-32768x8,4096x1}" \
      --out "$OUT/ab" --tag "_${tag}_$abn" 2>&1 | grep -E "^ctx|Error|error" | sed "s/^/$label /" | tee -a "$OUT/ab.log"
  done
fi

if [[ " ${steps[*]} " == *" before "* ]]; then
  echo "== before: KVARN_OFFSET_CODES=0 build + quick benchmark"
  mkdir -p "$OUT/before"
  CUDAFLAGS=-DKVARN_OFFSET_CODES=0 KVARN_CUDA=ON CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) $PY -m pip install \
    --no-build-isolation --no-deps -q -C build-dir=build/old . >"$OUT/before/build.log" 2>&1 &&
    $PY benchmarks/bench_cuda.py --quick --out "$OUT/before" 2>&1 | grep -E "^\||store share" || status=1
fi
exit $status
