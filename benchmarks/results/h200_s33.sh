#!/usr/bin/env bash
# Device call s33 (eleventh session): where the Xeon's tile-completing append spends its time beyond the native
# quantiser (s32: 240 us against 82 us): numpy allocation of the fresh tail buffers (np.zeros_like) against
# np.empty_like, alternating, on 16 threads; plus the allocation calls alone.
set -uo pipefail
source benchmarks/results/device_build.sh
site=$(python3 -c "import kvarn, os; print(os.path.dirname(os.path.dirname(kvarn.__file__)))")
rm -rf /tmp/kv_empty && mkdir -p /tmp/kv_empty && cp -r "$site/kvarn" /tmp/kv_empty/
sed -i 's/new_tail_k, new_tail_v = np.zeros_like(tail_k), np.zeros_like(tail_v)/new_tail_k, new_tail_v = np.empty_like(tail_k), np.empty_like(tail_v)/' /tmp/kv_empty/kvarn/cache.py
grep -c "np.empty_like(tail_k)" /tmp/kv_empty/kvarn/cache.py
cat > /tmp/tc.py <<'PY'
import sys, time, numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
for H, D in ((8, 128), (3, 64)):
    G = 128
    c = kvarn.KVCache(H, D); k = rng.standard_normal((H, 1024, D)).astype(np.float16); c.append(k, k)
    tile = np.ascontiguousarray(rng.standard_normal((H, G, D)).astype(np.float16))
    first, last = np.ascontiguousarray(tile[:, :G - 1]), np.ascontiguousarray(tile[:, G - 1:])
    tt = []
    for _ in range(200):
        c.append(first, first)
        t = time.perf_counter(); c.append(last, last); tt.append(time.perf_counter() - t)
    nat = []
    for _ in range(100):
        t = time.perf_counter(); _ops.quantize_tiles_native(tile, tile, c.preset, 8, 0); nat.append(time.perf_counter() - t)
    z = []
    for _ in range(200):
        t = time.perf_counter(); a = np.zeros((H, G, D), np.float16); b = np.zeros((H, G, D), np.float16); a[:, :1] = 1; b[:, :1] = 1; z.append(time.perf_counter() - t); del a, b
    print(f"{sys.argv[1]:6s} H{H} D{D}: completing append min {min(tt)*1e6:.0f} median {np.median(tt)*1e6:.0f} us; "
          f"native min {min(nat)*1e6:.0f} us; two zeros tails min {min(z)*1e6:.1f} median {np.median(z)*1e6:.1f} us; numpy {np.__version__}")
PY
for round in 1 2 3; do
  python3 /tmp/tc.py zeros 2>&1 | tee -a "$OUT/tail_alloc_ab.log"
  PYTHONPATH=/tmp/kv_empty python3 /tmp/tc.py empty 2>&1 | tee -a "$OUT/tail_alloc_ab.log"
done
echo "[$(el) s] end"
