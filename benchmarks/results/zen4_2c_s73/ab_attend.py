"""One process: kvarn (default ISA and score mode) and the fp16 kernel at 32K b1, headline and SmolLM2 shapes,
interleaved in blocks; prints minima in ms. Run under two builds in alternating processes (old / new kernels)."""
import sys, time
import numpy as np
import kvarn
from kvarn.fp16cache import FP16Cache

def build(hk, d, n, seed=0):
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((hk, n, d), dtype=np.float32)
    k[..., : d // 8] *= 4.0  # a few outlier channels, as real keys have
    v = rng.standard_normal((hk, n, d), dtype=np.float32)
    c = kvarn.KVCache(hk, d)
    f = FP16Cache(hk, d)
    for s in range(0, n, 4096):
        c.append(k[:, s:s + 4096], v[:, s:s + 4096])
        f.append(k[:, s:s + 4096], v[:, s:s + 4096])
    return c, f

def main():
    n = 32768
    for name, (hq, hk, d) in {"hq32-hk8-d128": (32, 8, 128), "smollm2-hq9-hk3-d64": (9, 3, 64)}.items():
        c, f = build(hk, d, n)
        q = np.random.default_rng(1).standard_normal((hq, d), dtype=np.float32)
        best = {"kvarn": 1e9, "fp16": 1e9}
        fns = {"kvarn": lambda: c.attend(q, num_threads=2), "fp16": lambda: f.attend(q, num_threads=2)}
        for fn in fns.values():
            fn()
        for _ in range(12):
            for key, fn in fns.items():
                for _ in range(10):
                    t0 = time.perf_counter(); fn(); best[key] = min(best[key], time.perf_counter() - t0)
        print(f"{name} kvarn {best['kvarn']*1e3:.3f} ms fp16 {best['fp16']*1e3:.3f} ms ratio {best['fp16']/best['kvarn']:.2f}x isa {kvarn.active_isa()}")

main()
