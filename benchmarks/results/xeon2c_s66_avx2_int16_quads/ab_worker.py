"""One A/B round for the build on PYTHONPATH: min over CALLS attend calls (one thread, avx2, int16) per
shape and VNNI setting; prints one JSON line."""
import json, sys, time, zlib
import numpy as np
import kvarn
from kvarn import _native

CALLS = int(sys.argv[1]) if len(sys.argv) > 1 else 20
SHAPES = [(32, 8, 128), (9, 3, 64)]  # Hq, Hk, D
N = int(sys.argv[2]) if len(sys.argv) > 2 else 32768
kvarn.set_num_threads(1)
kvarn.set_isa("avx2")
_native.set_score_mode("int16")
out = {}
for hq, hk, D in SHAPES:
    rng = np.random.default_rng(zlib.crc32(repr((hq, hk, D, N)).encode()))
    c = kvarn.KVCache(hk, D, preset="k4v2_g128")
    c.append(rng.standard_normal((hk, N, D)).astype(np.float32), rng.standard_normal((hk, N, D)).astype(np.float32))
    q = rng.standard_normal((hq, D)).astype(np.float32)
    for vnni in (False, True):
        _native.set_vnni(vnni)
        kvarn.attend(q, c)
        ts = []
        for _ in range(CALLS):
            t = time.perf_counter()
            kvarn.attend(q, c)
            ts.append(time.perf_counter() - t)
        out[f"{hq}/{hk}/D{D} vnni={'on' if vnni else 'off'}"] = min(ts) * 1e3
print(json.dumps(out))
