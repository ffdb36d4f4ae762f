# Where the tile-completing append's time goes beyond the native quantiser: pool wake-up vs Python.
import sys, time, numpy as np, kvarn
from kvarn import _ops, _native
rng = np.random.default_rng(0)
inner = []
orig = _native.quantize_tiles_f16
class Wrap:
    def __getattr__(self, n): return getattr(_native, n)
    def quantize_tiles_f16(self, *a):
        t = time.perf_counter(); r = orig(*a); inner.append(time.perf_counter() - t); return r
_ops._native = Wrap()
def mins(xs): return f"min {min(xs)*1e6:6.0f} med {np.median(xs)*1e6:6.0f}"
for H, D in ((8, 128), (3, 64)):
    G = 128
    tile = np.ascontiguousarray(rng.standard_normal((H, G, D)).astype(np.float16))
    first, last = np.ascontiguousarray(tile[:, :G - 1]), np.ascontiguousarray(tile[:, G - 1:])
    for threads in (1, 2, 4, 16):
        c = kvarn.KVCache(H, D); k = rng.standard_normal((H, 1024, D)).astype(np.float16); c.append(k, k)
        q = rng.standard_normal((4 * H if H == 8 else 9, D)).astype(np.float32)
        nat = lambda: _ops.quantize_tiles_native(tile, tile, c.preset, 8, threads)
        hot = []
        for _ in range(60):
            t = time.perf_counter(); nat(); hot.append(time.perf_counter() - t)
        cold = []
        for _ in range(30):
            time.sleep(0.003); t = time.perf_counter(); nat(); cold.append(time.perf_counter() - t)
        tt, warm, inn_cold, inn_warm = [], [], [], []
        for _ in range(40):
            c.append(first, first); time.sleep(0.003)
            t = time.perf_counter(); c.append(last, last); tt.append(time.perf_counter() - t); inn_cold.append(inner[-1])
            c.append(first, first); kvarn.attend(q, c, num_threads=threads)  # a decode step just ran: helpers spin
            t = time.perf_counter(); c.append(last, last); warm.append(time.perf_counter() - t); inn_warm.append(inner[-1])
        print(f"H{H} D{D} threads {threads:2d}: native hot {mins(hot)} | native after 3 ms idle {mins(cold)} | "
              f"append after idle {mins(tt)} (native inside {mins(inn_cold)}) | append after an attend {mins(warm)} "
              f"(native inside {mins(inn_warm)})", flush=True)
