# native attend after a gap (the pool's helper asleep) vs back to back, one 8K SmolLM2-shaped cache (warm data).
# The wake rows need a build with variant_wake_threads.patch applied (kvarn._native.wake_threads).
import time, statistics as st, numpy as np, kvarn, os
from kvarn import _ops
th = int(os.environ.get("TH", "2")); kvarn.set_num_threads(th)
rng = np.random.default_rng(0)
k = rng.standard_normal((3, 8000, 64), dtype=np.float32).astype(np.float16); v = rng.standard_normal((3, 8000, 64), dtype=np.float32).astype(np.float16)
c = kvarn.KVCache(3, 64); c.append(k, v); p = [c._native_parts()]
q = rng.standard_normal((1, 9, 64), dtype=np.float32) * 0.125; out = np.empty_like(q)
def spin(s):
    t = time.perf_counter()
    while time.perf_counter() - t < s: pass
for gap, how in ((0, "back to back"), (0.002, "2 ms busy gap"), (0.002, "2 ms sleep gap")):
    ts = []
    for i in range(800):
        if gap: (spin if "busy" in how else time.sleep)(gap)
        t = time.perf_counter(); _ops._native.attend(p, q, 1.0, out, th); ts.append(time.perf_counter() - t)
    print(f"th {th} {how:15s}: median {1e6*st.median(ts):.1f} us min {1e6*min(ts):.1f}")
if hasattr(_ops._native, "wake_threads"):
    for lead in (10e-6, 20e-6, 40e-6, 80e-6):
        ts, tw = [], []
        for i in range(800):
            spin(0.002)
            t = time.perf_counter(); _ops._native.wake_threads(); tw.append(time.perf_counter() - t)
            spin(lead)
            t = time.perf_counter(); _ops._native.attend(p, q, 1.0, out, th); ts.append(time.perf_counter() - t)
        print(f"th {th} 2 ms busy gap, wake, {1e6*lead:.0f} us, attend: median {1e6*st.median(ts):.1f} us min {1e6*min(ts):.1f}; wake call median {1e6*st.median(tw):.1f} us")
