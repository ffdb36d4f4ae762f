"""Hash of records and attention outputs from one kvarn build, per ISA and score mode, for
comparing builds made by different compilers (run with PYTHONPATH set to each build)."""
import hashlib
import zlib
import numpy as np
import kvarn

out = {}
for isa in kvarn.available_isas():
    kvarn.set_isa(isa)
    for preset in ("k4v2_g128", "k4v4_g64", "k2v2_g128", "k8v8_g128"):
        for hk, hq, d in ((8, 32, 128), (3, 9, 64), (1, 4, 256), (2, 2, 80)):
            r = np.random.default_rng(zlib.crc32(f"{preset}{d}".encode()))
            n = 128 * 5 + 37
            k = (r.standard_normal((hk, n, d)) * r.uniform(0.1, 4, d)).astype(np.float16)
            v = r.standard_normal((hk, n, d)).astype(np.float16)
            q = r.standard_normal((hq, d)).astype(np.float32)
            c = kvarn.KVCache(hk, d, preset=preset)
            c.append(k, v)
            rec = hashlib.sha256(np.ascontiguousarray(c.records).tobytes()).hexdigest()[:16]
            for mode in ("float", "int16", "int8"):
                if isa == "scalar" and mode != "float":
                    continue
                kvarn.set_score_mode(mode)
                for threads in (1, 2):
                    o = kvarn.attend(q, c, num_threads=threads)
                    out[(isa, preset, d, mode, threads)] = (rec, hashlib.sha256(o.tobytes()).hexdigest()[:16])
            kvarn.set_score_mode("int16")
for key in sorted(out):
    print(*key, *out[key])
