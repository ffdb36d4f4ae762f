"""A decode's appends from 1K to 32K tokens, one token at a time (Hk 8, D 128, k4v2, 2 threads), with and without
KVCache.reserve(32768) first, alternating in one process: all appends' time per generated token, the slowest
append, and the resident memory the cache's buffers add (ru_maxrss is a high-water mark, so each run is a child)."""
import os, sys, time, resource, subprocess
import numpy as np

ROUNDS = int(os.environ.get("ROUNDS", 3))
END = int(os.environ.get("END", 32768))


def run(reserve: bool) -> str:
    import kvarn
    rng = np.random.default_rng(0)
    hk, d = 8, 128
    k = rng.standard_normal((hk, 1024, d)).astype(np.float16)
    v = rng.standard_normal((hk, 1024, d)).astype(np.float16)
    c = kvarn.KVCache(num_kv_heads=hk, head_dim=d)
    c.append(k, v)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t = time.perf_counter()
    if reserve:
        c.reserve(END)
    reserve_s = time.perf_counter() - t
    times = []
    j = 0
    while len(c) < END:
        a = time.perf_counter()
        c.append(k[:, j:j + 1], v[:, j:j + 1], num_threads=2)
        times.append(time.perf_counter() - a)
        j = (j + 1) % 1024
    times = np.array(times)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0
    return (f"reserve={int(reserve)} tokens {len(c) - 1024}: {times.sum() / len(times) * 1e6:.2f} us/token "
            f"(reserve call {reserve_s * 1e3:.2f} ms), slowest {times.max() * 1e3:.2f} ms, "
            f"10 slowest mean {np.sort(times)[-10:].mean() * 1e3:.2f} ms, maxrss +{rss / 1024:.1f} MiB, "
            f"allocated {c.allocated_nbytes / 2**20:.1f} MiB, nbytes {c.nbytes / 2**20:.1f} MiB")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        print(run(sys.argv[1] == "1"), flush=True)
    else:
        for r in range(ROUNDS):
            for mode in ("0", "1"):
                subprocess.run([sys.executable, __file__, mode], check=True)
