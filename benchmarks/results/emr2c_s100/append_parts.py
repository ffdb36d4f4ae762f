"""Where a completing append's time goes: the native quantiser of one tile per kv head (min of 200 calls) against
KVCache.append of the token that completes the tile (min of 100), and a plain one-token append, 1 and 2 threads."""
import time, numpy as np, kvarn
from kvarn import _ops
rng = np.random.default_rng(0)
def t(fn, n=200):
    best = 1e9
    for _ in range(n):
        a = time.perf_counter(); fn(); best = min(best, time.perf_counter() - a)
    return best * 1e6
for hk, d in [(3, 64), (8, 128)]:
    preset = kvarn.PRESETS[kvarn.DEFAULT_PRESET]; G = preset.group
    k = rng.standard_normal((hk, 1024, d)).astype(np.float16); v = rng.standard_normal((hk, 1024, d)).astype(np.float16)
    c = kvarn.KVCache(num_kv_heads=hk, head_dim=d)
    c.append(k, v)
    kt = np.ascontiguousarray(k[:, :G]); vt = np.ascontiguousarray(v[:, :G])
    for th in (1, 2):
        nat = t(lambda: _ops.quantize_tiles_native(kt, vt, preset, _ops.SINKHORN_ITERS, th))
        g = c.copy()
        def setup():
            g.append(kt[:, : G - 1 - g.tail_len], vt[:, : G - 1 - g.tail_len], num_threads=th)
        best = 1e9
        for _ in range(100):
            setup(); a = time.perf_counter(); g.append(kt[:, G-1:], vt[:, G-1:], num_threads=th); best = min(best, time.perf_counter() - a)
        # one-token non-completing append
        g2 = c.copy(); one_k = kt[:, :1]; one_v = vt[:, :1]
        best1 = 1e9
        for _ in range(100):
            if g2.tail_len >= G - 2: g2 = c.copy()
            a = time.perf_counter(); g2.append(one_k, one_v, num_threads=th); best1 = min(best1, time.perf_counter() - a)
        print(f"hk{hk} d{d} threads {th}: native {nat:.1f} us, completing append {best*1e6:.1f} us, plain append {best1*1e6:.1f} us, quantize_on={c.quantize_on}")
