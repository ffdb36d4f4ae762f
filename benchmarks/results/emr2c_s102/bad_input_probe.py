"""Adversarial probe of the public API: every call either works or raises ValueError/TypeError (named);
the cache is unchanged after a refusal; nothing crashes (run in a subprocess by the caller)."""
import numpy as np, kvarn
rng = np.random.default_rng(3)
H, D = 2, 64
def mk():
    c = kvarn.KVCache(H, D)
    c.append(rng.standard_normal((H, 300, D)).astype(np.float16), rng.standard_normal((H, 300, D)).astype(np.float16))
    return c
c = mk()
snap = lambda c: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in c.to_parts().items()}
def same(a, b): return all((np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k]) for k in a)
base = rng.standard_normal((H, 5, D)).astype(np.float32)
weird = {
    "list": base.tolist(), "0d": np.float32(1.0), "1d": base[0, 0], "4d": base[None], "bool": base > 0,
    "complex": base.astype(np.complex64), "object": base.astype(object), "str": "abc", "None": None,
    "int8": base.astype(np.int8), "float64": base.astype(np.float64), "bigendian": base.astype(">f4"),
    "noncontig": np.asfortranarray(base), "neg stride": base[:, ::-1], "strided": np.repeat(base, 2, axis=2)[..., ::2],
    "empty tokens": base[:, :0], "zero heads": base[:0], "huge": np.full((H, 5, D), 1e30, np.float32),
    "bf16-like uint16": base.astype(np.float16).view(np.uint16), "readonly": np.broadcast_to(base[:, :1], (H, 5, D)),
    "subnormal": np.full((H, 5, D), 1e-40, np.float32), "minus zero": -np.zeros((H, 5, D), np.float32),
    "f16 max": np.full((H, 5, D), 65504, np.float16), "f16 inf": np.full((H, 5, D), np.inf, np.float16),
    "misaligned": np.frombuffer(b"\0" + base.tobytes(), np.uint8)[1:].view(np.float32).reshape(base.shape),
}
bad = 0
def attempt(label, fn, cache=None):
    global bad
    before = snap(cache) if cache is not None else None
    try:
        fn(); res = "ok"
    except (ValueError, TypeError) as e:
        res = f"{type(e).__name__}: {str(e)[:100]}"
    except Exception as e:
        res = f"!!! {type(e).__name__}: {str(e)[:200]}"; bad += 1
    if cache is not None and res != "ok" and not same(before, snap(cache)):
        res += "  !!! CACHE CHANGED"; bad += 1
    print(f"{label:40s} {res}")
for name, x in weird.items():
    attempt(f"append k={name}", lambda: c.append(x, base), c)
    attempt(f"append v={name}", lambda: c.append(base, x), c)
q = rng.standard_normal((4, D)).astype(np.float32)
for name, x in {**weird, "q ok f16": q.astype(np.float16), "q 3 heads": q[:3], "q big": q * 1e30}.items():
    xq = x if not isinstance(x, np.ndarray) or x.ndim != 3 else x[0, :4] if x.shape[0] else x
    attempt(f"attend q={name}", lambda: kvarn.attend(xq, c), c)
for s in (0.0, -1.0, np.nan, np.inf, "1", None, True, 1e-45, 1e38, np.float16(0.5)):
    attempt(f"attend scale={s!r}", lambda: kvarn.attend(q, c, scale=s), c)
for t in (0, -1, -5, 1.5, True, "2", None, 10**6, 2**31, np.int64(2)):
    attempt(f"attend num_threads={t!r}", lambda: kvarn.attend(q, c, num_threads=t), c)
    attempt(f"append num_threads={t!r}", lambda: c.append(base, base, num_threads=t), c)
for args in [(0, 64), (2, 0), (2, 63), (2, 7), (-1, 64), (2, 100000), (2.5, 64), ("2", 64), (True, 64), (2, 1024), (2, 520)]:
    attempt(f"KVCache{args}", lambda: kvarn.KVCache(*args))
for kw in [dict(preset="nope"), dict(preset="k4v2_g64"), dict(sink_tokens=-1), dict(sink_tokens=1.5), dict(sink_tokens=10**12)]:
    attempt(f"KVCache(2,64,{kw})", lambda: kvarn.KVCache(2, 64, **kw))
c2 = kvarn.KVCache(H, 128)
c2.append(rng.standard_normal((H, 200, 128)).astype(np.float16), rng.standard_normal((H, 200, 128)).astype(np.float16))
attempt("attend_batch mixed head_dim", lambda: kvarn.attend_batch(np.zeros((2, 4, 64), np.float32), [c, c2]), c)
attempt("attend_batch empty", lambda: kvarn.attend_batch(np.zeros((0, 4, 64), np.float32), []))
attempt("attend_batch len mismatch", lambda: kvarn.attend_batch(np.zeros((3, 4, 64), np.float32), [c, c]), c)
attempt("attend_batch same cache twice", lambda: kvarn.attend_batch(np.zeros((2, 4, 64), np.float32), [c, c]), c)
attempt("attend_batch not a cache", lambda: kvarn.attend_batch(np.zeros((1, 4, 64), np.float32), [object()]))
attempt("append_attend nan k", lambda: kvarn.append_attend(np.zeros((1, 4, 64), np.float32), c, np.full((H, 1, D), np.nan), base[:, :1]), c)
attempt("append_attend q mismatch n", lambda: kvarn.append_attend(np.zeros((2, 4, 64), np.float32), c, base[:, :1], base[:, :1]), c)
attempt("append_attend_batch dup", lambda: kvarn.append_attend_batch(np.zeros((2, 1, 4, 64), np.float32), [c, c], np.stack([base[:, :1]] * 2), np.stack([base[:, :1]] * 2)), c)
for name, x in weird.items():
    if isinstance(x, np.ndarray) and x.ndim == 3 and x.shape[0]:
        attempt(f"quantize_tile k={name}", lambda: kvarn.quantize_tile(x[0], base[0]))
attempt("quantize_tile 128 tokens f32", lambda: kvarn.quantize_tile(rng.standard_normal((128, 64)).astype(np.float32), rng.standard_normal((128, 64)).astype(np.float32)))
attempt("quantize_tile 127 tokens", lambda: kvarn.quantize_tile(rng.standard_normal((127, 64)), rng.standard_normal((127, 64))))
attempt("hadamard bad dim", lambda: kvarn.hadamard(np.zeros((3, 63), np.float32)))
attempt("hadamard list", lambda: kvarn.hadamard([[1.0] * 64]))
attempt("set_isa nope", lambda: kvarn.set_isa("nope"))
attempt("set_isa avx512 (absent)", lambda: kvarn.set_isa("avx512"))
attempt("set_score_mode nope", lambda: kvarn.set_score_mode("nope"))
attempt("set_num_threads -3", lambda: kvarn.set_num_threads(-3))
attempt("set_num_threads 'x'", lambda: kvarn.set_num_threads("x"))
attempt("truncate beyond", lambda: c.truncate(10**6), c)
attempt("truncate negative", lambda: c.truncate(-1), c)
attempt("from_parts garbage", lambda: kvarn.KVCache.from_parts({"a": 1}))
attempt("append_attend one token, NaN q", lambda: kvarn.append_attend(np.full((1, 4, 64), np.nan, np.float32), c, base[:, :1], base[:, :1]), c)
attempt("append_attend one token, 3 q heads", lambda: kvarn.append_attend(np.zeros((1, 3, 64), np.float32), c, base[:, :1], base[:, :1]), c)
attempt("append_attend_batch one row, NaN v", lambda: kvarn.append_attend_batch(np.zeros((1, 1, 4, 64), np.float32), [c], base[None, :, :1], np.full((1, H, 1, D), np.nan)), c)
attempt("append_attend_fp16_batch one row, q None", lambda: kvarn.append_attend_fp16_batch(None, [kvarn.FP16Cache(H, D)], base[None, :, :1], base[None, :, :1]))
print("len", len(c), "BAD", bad)
