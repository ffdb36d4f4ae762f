"""from_parts with each array corrupted (NaN, Inf, fp16 max, wrong dtype, shape, memory order) and each setting
wrong: every call either attends to a finite output or raises ValueError / TypeError naming the part."""
import numpy as np, kvarn
rng = np.random.default_rng(3)
H, D = 2, 64
c = kvarn.KVCache(H, D)
c.append(rng.standard_normal((H, 300, D)).astype(np.float16), rng.standard_normal((H, 300, D)).astype(np.float16))
q = rng.standard_normal((4, D)).astype(np.float32)
p = c.to_parts(); print({k: (v.shape, v.dtype) if isinstance(v, np.ndarray) else v for k, v in p.items()})
def attempt(label, fn):
    try: r = fn(); res = "ok" + (f" finite={np.isfinite(r).all()}" if isinstance(r, np.ndarray) else "")
    except (ValueError, TypeError) as e: res = f"{type(e).__name__}: {str(e)[:110]}"
    except Exception as e: res = f"!!! {type(e).__name__}: {e}"
    print(f"{label:45s} {res}")
for key in p:
    if isinstance(p[key], np.ndarray) and p[key].size:
        for val in ("nan", "inf", "big", "wrongdtype", "shape", "noncontig"):
            bp = dict(p); a = p[key].copy()
            if val in ("nan", "inf", "big"):
                if a.dtype == np.uint8:
                    a = a.view(np.uint16) if a.shape[-1] % 2 == 0 else a
                    a[..., -1] = {"nan": 0x7e00, "inf": 0x7c00, "big": 0x7bff}[val] if a.dtype == np.uint16 else 255
                    a = a.view(np.uint8)
                else:
                    a.flat[0] = {"nan": np.nan, "inf": np.inf, "big": 6e4}[val]
            elif val == "wrongdtype": a = a.astype(np.float32) if a.dtype != np.uint8 else a.astype(np.int16)
            elif val == "shape": a = a[..., :-1] if a.ndim else a
            else: a = np.asfortranarray(a) if a.ndim > 1 else a[::1]
            bp[key] = a
            attempt(f"from_parts {key} {val}", lambda: kvarn.attend(q, kvarn.KVCache.from_parts(**bp)))
for key in p:
    if not isinstance(p[key], np.ndarray):
        for val in (-1, 10**9, 1.5, None, "x"):
            bp = dict(p); bp[key] = val
            attempt(f"from_parts {key}={val!r}", lambda: kvarn.attend(q, kvarn.KVCache.from_parts(**bp)))
