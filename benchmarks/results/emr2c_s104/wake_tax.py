"""What the pool's wake choice costs in its exploring calls: kvarn.attend after a 1.5 ms sleep (the helpers
asleep, as between a model's layers), N calls per context. After each call the choice's counters
(kvarn._native.testing_pool_wake_runs, every power-of-two size class) say which way it ran: alone or with
the helpers woken. Reports, after the warm-up, each way's calls and median time, and the exploring calls'
share of the total time beyond what the faster way would have taken (the tax)."""
import statistics, sys, time
import numpy as np
import kvarn
from kvarn import _native

shape = sys.argv[1] if len(sys.argv) > 1 else "s"
hq, hk, d = (32, 8, 128) if shape == "h" else (9, 3, 64)
contexts = [int(c) for c in (sys.argv[2] if len(sys.argv) > 2 else "4096,32768").split(",")]
n_calls = int(sys.argv[3]) if len(sys.argv) > 3 else 400
CLASSES = [1 << k for k in range(8, 44)]


def counters():
    return [_native.testing_pool_wake_runs(s)[1:] for s in CLASSES]


rng = np.random.default_rng(0)
for ctx in contexts:
    cache = kvarn.KVCache(hk, d)
    for s in range(0, ctx, 8192):
        m = min(8192, ctx - s)
        cache.append(rng.standard_normal((hk, m, d), dtype=np.float32), rng.standard_normal((hk, m, d), dtype=np.float32))
    q = rng.standard_normal((hq, d)).astype(np.float32)
    calls = []  # (seconds, way): way 0 alone, 1 woken, None not a choice call (helpers awake, say)
    before = counters()
    for _ in range(n_calls):
        time.sleep(0.0015)
        t = time.perf_counter()
        kvarn.attend(q, cache)
        dt = time.perf_counter() - t
        after = counters()
        way = None
        for b, a in zip(before, after):
            if a != b:
                way = 0 if a[0] != b[0] else 1
        calls.append((dt, way))
        before = after
    body = calls[8:]  # past the warm-up (three each way)
    by_way = {w: [t for t, x in body if x == w] for w in (0, 1, None)}
    med = {w: statistics.median(v) if v else float("nan") for w, v in by_way.items()}
    fast = 0 if med[0] < med[1] or not by_way[1] else 1
    slow = 1 - fast
    total = sum(t for t, _ in body)
    tax = sum(t - med[fast] for t in by_way[slow]) / total if by_way[slow] else 0.0
    print(f"shape {shape} ctx {ctx} threads {kvarn.get_num_threads()}: alone {len(by_way[0])} calls median "
          f"{med[0] * 1e6:.0f} us, woken {len(by_way[1])} calls median {med[1] * 1e6:.0f} us, other {len(by_way[None])}; "
          f"slower way / faster {med[slow] / med[fast]:.2f}, exploring calls' extra time {100 * tax:.1f} % of the total",
          flush=True)
