"""Where the lent Xeon's 16-thread decode loses per-thread speed (fortieth session). At 32K b1, 16 threads, the
twenty-first session's run (s61b) took 0.634 ms for 2,048 (tile, KV head) records: 5.0 us per record and thread,
against ~1.6 us on one core of the 2-core Xeon. Either the pool's split + merge costs, or each core runs slower with
all sixteen busy (clock, L3). Two measurements tell them apart:
  threads SITE            kvarn and the fp16 kernel at 1 / 2 / 4 / 8 / 16 threads, 32K and 128K (headline) and 32K
                          (SmolLM2 shape), warm, the two implementations alternating in blocks; per record and thread
  proc SITE WHAT SECS     one single-thread process timing WHAT (kvarn or fp16) back to back for SECS seconds at the
                          headline 32K point, printing its median call: the script runs 1, 4, 8, 16 of them at once
                          (one per CPU), so a per-core slowdown under full load shows without any pool."""
import sys
import time

sys.path.insert(0, sys.argv[2])
import numpy as np  # noqa: E402

import kvarn  # noqa: E402
from kvarn.fp16cache import FP16Cache  # noqa: E402

SHAPES = {"headline": (32, 8, 128), "smollm2": (9, 3, 64)}


def data(shape, ctx, fp16=True):
    hq, hk, d = SHAPES[shape]
    rng = np.random.default_rng(ctx)
    k = rng.standard_normal((hk, ctx, d), dtype=np.float32)
    k[..., :4] *= 8.0
    k = k.astype(np.float16)
    v = rng.standard_normal((hk, ctx, d), dtype=np.float32).astype(np.float16)
    cache = kvarn.KVCache(hk, d)
    cache.append(k, v)
    f16 = None
    if fp16:
        f16 = FP16Cache(hk, d, capacity=ctx)
        f16.append(k, v)
    q = rng.standard_normal((hq, d), dtype=np.float32)
    return cache, f16, q, hk * (ctx // 128 - 1)  # records: the first tile is the fp16 sink


def threads():
    for shape, ctx in (("headline", 32768), ("smollm2", 32768), ("headline", 131072)):
        cache, f16, q, records = data(shape, ctx)
        for t in (1, 2, 4, 8, 16):
            kvarn.set_num_threads(t)
            calls = 10 if ctx <= 32768 else 4
            if t == 1:
                calls = max(2, calls // 4)
            times = {"kvarn": [], "fp16": []}
            for _ in range(3):
                cache.attend(q)
                f16.attend(q)
            for _ in range(8):  # alternating blocks
                for name, c in (("kvarn", cache), ("fp16", f16)):
                    for _ in range(calls):
                        t0 = time.perf_counter()
                        c.attend(q)
                        times[name].append(time.perf_counter() - t0)
            km, fm = min(times["kvarn"]) * 1e3, min(times["fp16"]) * 1e3
            kmed = sorted(times["kvarn"])[len(times["kvarn"]) // 2] * 1e3
            fmed = sorted(times["fp16"])[len(times["fp16"]) // 2] * 1e3
            print(f"{shape} ctx {ctx} threads {t:2d}: kvarn min {km:8.3f} med {kmed:8.3f} ms | fp16 min {fm:8.3f} "
                  f"med {fmed:8.3f} ms | x fp16 {fm / km:5.2f} | kvarn us per record and thread {km * 1e3 * t / records:6.2f}"
                  f" | fp16 GB/s {f16.nbytes / fm / 1e6:6.1f}", flush=True)
        del cache, f16


def proc(what, secs):
    kvarn.set_num_threads(1)
    cache, f16, q, records = data("headline", 32768, fp16=(what == "fp16"))
    c = cache if what == "kvarn" else f16
    for _ in range(3):
        c.attend(q)
    start = float(open("/tmp/s80_start").read())  # noqa: SIM115 (a barrier: every process starts timing at once)
    while time.time() < start:
        time.sleep(0.001)
    ts = []
    end = time.time() + secs
    while time.time() < end:
        t0 = time.perf_counter()
        c.attend(q)
        ts.append(time.perf_counter() - t0)
    med = sorted(ts)[len(ts) // 2] * 1e3
    print(f"{what} 1 thread: median {med:.3f} ms, min {min(ts) * 1e3:.3f} ms over {len(ts)} calls "
          f"({med * 1e3 / records:.2f} us per record)", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "threads":
        threads()
    else:
        proc(sys.argv[3], float(sys.argv[4]))
