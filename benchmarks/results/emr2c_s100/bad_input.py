"""Bad input on the session's build: appends (NaN, Inf, beyond fp16, wrong heads / head_dim / dtype / v shape; 200 tokens
onto 300, so across a tile) and attends (NaN q, wrong heads, wrong dim) refused with a named error, the cache unchanged."""
import numpy as np, kvarn
rng = np.random.default_rng(1)
c = kvarn.KVCache(3, 64)
c.append(rng.standard_normal((3, 300, 64)).astype(np.float16), rng.standard_normal((3, 300, 64)).astype(np.float16))
q = rng.standard_normal((9, 64)).astype(np.float32)
before = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in c.to_parts().items()}
out0 = kvarn.attend(q, c)
k = rng.standard_normal((3, 200, 64)).astype(np.float32); v = k.copy()
bad = {"nan k": (np.where(np.arange(64) == 5, np.nan, k), v), "inf v": (k, np.where(np.arange(64) == 3, np.inf, v)),
       "beyond fp16": (k * 1e6, v), "wrong heads": (k[:2], v[:2]), "wrong head_dim": (k[..., :32], v[..., :32]),
       "int dtype": (k.astype(np.int32), v.astype(np.int32)), "mismatched v": (k, v[:, :10])}
for name, (kk, vv) in bad.items():
    try:
        c.append(kk, vv); print(name, "ACCEPTED")
    except (ValueError, TypeError) as e:
        print(f"{name}: {type(e).__name__}: {str(e)[:90]}")
for name, qq in {"nan q": np.full((9, 64), np.nan, np.float32), "q heads 8": q[:8], "q dim 32": q[:, :32]}.items():
    try:
        kvarn.attend(qq, c); print(name, "ACCEPTED")
    except (ValueError, TypeError) as e:
        print(f"{name}: {type(e).__name__}: {str(e)[:90]}")
after = c.to_parts()
same = all((np.array_equal(before[k], after[k]) if isinstance(before[k], np.ndarray) else before[k] == after[k]) for k in before)
print("parts unchanged:", same, "| output unchanged:", np.array_equal(out0, kvarn.attend(q, c)), "| len", len(c))
