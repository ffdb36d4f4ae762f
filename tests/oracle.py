"""Float64 numpy oracle of SPEC.md, written from the spec, independent of the C++.

Dense matrices and whole-array numpy here on purpose: it is slow and plain,
and shares no code (and so no bugs) with the native kernels.
"""
import numpy as np

ITERS = 8


def sylvester(n: int) -> np.ndarray:
    """Unnormalised Sylvester Hadamard matrix of order n (a power of two)."""
    h = np.ones((1, 1))
    while h.shape[0] < n:
        h = np.block([[h, h], [h, -h]])
    return h


def hadamard_matrix(d: int) -> np.ndarray:
    """Orthonormal block-diagonal Hadamard: block = largest power of two dividing d."""
    block = d & -d
    hb = sylvester(block) / np.sqrt(block)
    out = np.zeros((d, d))
    for i in range(0, d, block):
        out[i : i + block, i : i + block] = hb
    return out


def rotate(x: np.ndarray) -> np.ndarray:
    """Rows of x times H (H symmetric, its own inverse)."""
    return np.asarray(x, np.float64) @ hadamard_matrix(x.shape[-1])


def _imbalance(cur):
    cs = cur.std(axis=0, ddof=1)
    rs = cur.std(axis=1, ddof=1)
    return cs.max() / max(cs.min(), 1e-8) + rs.max() / max(rs.min(), 1e-8)


def balance(x: np.ndarray, iters: int = ITERS):
    """SPEC §3: returns (r, c, imbalance of the chosen candidate, imbalance of the identity)."""
    candidates = balance_candidates(x, iters)
    best = candidates[0]
    for cand in candidates[1:]:
        if cand[2] <= best[2]:  # ties: the later candidate
            best = cand
    return best[0], best[1], best[2], candidates[0][2]


def balance_candidates(x: np.ndarray, iters: int = ITERS) -> list:
    """SPEC §3's candidates in order, (r, c, imbalance) each: the identity, then one per round."""
    x = np.asarray(x, np.float64)
    lr = np.zeros(x.shape[0])
    lc = np.zeros(x.shape[1])
    candidates = [(np.ones_like(lr), np.ones_like(lc), _imbalance(x))]
    for _ in range(iters):
        cur = x / np.exp(lc)[None, :] / np.exp(lr)[:, None]
        cs = np.clip(cur.std(axis=0, ddof=1), 1e-3, 1e3)
        lc = np.clip(lc + np.log(cs), -0.3, 10.0)
        cur = x / np.exp(lc)[None, :] / np.exp(lr)[:, None]
        rs = np.clip(cur.std(axis=1, ddof=1), 1e-3, 1e3)
        lr = np.clip(lr + np.log(rs), -0.3, 10.0)
        cur = x / np.exp(lc)[None, :] / np.exp(lr)[:, None]
        candidates.append((np.exp(lr), np.exp(lc), _imbalance(cur)))
    return candidates


def rtn(b: np.ndarray, bits: int):
    """Per-row asymmetric round-to-nearest (half to even). Returns codes, scale, lo and the
    unrounded quotient (for spotting rounding ties)."""
    lo = b.min(axis=1)
    hi = b.max(axis=1)
    qmax = 2**bits - 1
    scale = np.maximum((hi - lo) / qmax, 1e-10)
    quotient = (b - lo[:, None]) / scale[:, None]
    codes = np.clip(np.rint(quotient), 0, qmax).astype(np.int64)
    return codes, scale, lo, quotient


def quantize_matrix(x: np.ndarray, bits: int, iters: int = ITERS) -> dict:
    """Balance + RTN of a rows x cols matrix; a[row] = r*scale, z[row] = r*lo, col[col] = c."""
    candidates = balance_candidates(x, iters)
    r, c, imb, imb_identity = balance(x, iters)
    b = x / c[None, :] / r[:, None]
    codes, scale, lo, quotient = rtn(b, bits)
    return dict(
        codes=codes, a=r * scale, z=r * lo, col=c, r=r, c=c, scale=scale, lo=lo,
        quotient=quotient, balanced=b, imbalance=imb, imbalance_identity=imb_identity, candidates=candidates,
    )


def quantize_tile(k: np.ndarray, v: np.ndarray, kbits: int, vbits: int, iters: int = ITERS) -> dict:
    """One head's tile, k and v [G, D] in the original frame. K: rows = channels, V: rows = tokens."""
    kq = quantize_matrix(rotate(k).T, kbits, iters)
    vq = quantize_matrix(rotate(v), vbits, iters)
    return dict(k=kq, v=vq)


def round_trip(k: np.ndarray, v: np.ndarray, kbits: int, vbits: int, iters: int = ITERS) -> tuple:
    """(K̂, V̂) [G, D] float64 of one head's tile as SPEC §3-5 reconstruct it, with the folded vectors unrounded
    (the records store them as fp16)."""
    q = quantize_tile(k, v, kbits, vbits, iters)
    kq, vq = q["k"], q["v"]
    k_rot = ((kq["codes"] * kq["a"][:, None] + kq["z"][:, None]) * kq["col"][None, :]).T
    v_rot = (vq["codes"] * vq["a"][:, None] + vq["z"][:, None]) * vq["col"][None, :]
    return rotate(k_rot), rotate(v_rot)


def record_fields(tile_record: np.ndarray, kbits: int, vbits: int, group: int, head_dim: int) -> dict:
    """Parses one SPEC §6 record (uint8 bytes) into codes and float64 scale vectors."""
    G, D = group, head_dim
    rec = np.asarray(tile_record, np.uint8)
    pos = 0

    def take(nbytes):
        nonlocal pos
        out = rec[pos : pos + nbytes]
        pos += nbytes
        return out

    def f16(n):
        return take(2 * n).view(np.float16).astype(np.float64)

    def unpack(packed, bits, rows, cols):
        per = 8 // bits
        packed = packed.reshape(rows, cols // per)
        codes = np.zeros((rows, cols), np.int64)
        for i in range(cols):
            codes[:, i] = (packed[:, i // per] >> ((i % per) * bits)) & (2**bits - 1)
        return codes

    k_codes = unpack(take(D * G * kbits // 8), kbits, D, G)
    ka, kz, kt = f16(D), f16(D), f16(G)
    v_codes = unpack(take(G * D * vbits // 8), vbits, G, D)
    vc, va, vz = f16(D), f16(G), f16(G)
    assert pos == rec.size, "record length does not match the layout"
    return dict(k_codes=k_codes, ka=ka, kz=kz, kt=kt, v_codes=v_codes, vc=vc, va=va, vz=vz)


def dequantize_record(tile_record, kbits, vbits, group, head_dim):
    """(K̂, V̂) [G, D] float64 in the original frame from one record."""
    f = record_fields(tile_record, kbits, vbits, group, head_dim)
    k_rot = ((f["k_codes"] * f["ka"][:, None] + f["kz"][:, None]) * f["kt"][None, :]).T
    v_rot = (f["v_codes"] * f["va"][:, None] + f["vz"][:, None]) * f["vc"][None, :]
    return rotate(k_rot), rotate(v_rot)


def attention_with_value_norm(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> tuple:
    """Exact softmax attention in float64 (q [Hq, D]; k, v [Hk, n, D]; GQA by consecutive heads) and the
    p-weighted norm of the values it sums, sqrt(sum_h sum_t p_ht ||v_t||^2): the scale of an error that
    cancels with the output (a flat softmax over random values gives an output far below the values)."""
    hq, hk = q.shape[0], k.shape[0]
    k, v = np.asarray(k, np.float64), np.asarray(v, np.float64)
    s = np.einsum("hgd,htd->hgt", np.asarray(q, np.float64).reshape(hk, hq // hk, -1), k) * scale
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("hgt,htd->hgd", p, v).reshape(hq, -1), float(np.sqrt(np.einsum("hgt,ht->", p, (v ** 2).sum(-1))))


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float) -> np.ndarray:
    """Exact softmax attention in float64. q [Hq, D]; k, v [Hk, n, D]; GQA by consecutive heads."""
    return attention_with_value_norm(q, k, v, scale)[0]


def dequantize_cache(cache, k, v, decode=None) -> tuple:
    """Float64 (K̂, V̂) [Hk, n, D] of a kvarn.KVCache that was given the tokens k, v [Hk, n, D].

    Quantised tiles come from the cache's records through the oracle decoder (decode: a function
    with dequantize_record's arguments, e.g. a memoised one; default dequantize_record); the sink and tail
    positions come from the *inputs* rounded to fp16 (what SPEC §7 keeps there), not from the
    cache's own fp16 buffers, so a wrong stored sink or tail value cannot cancel out."""
    p = cache.preset
    H, D = cache.num_kv_heads, cache.head_dim
    k = np.asarray(k).astype(np.float16).astype(np.float64)
    v = np.asarray(v).astype(np.float16).astype(np.float64)
    n, sink, tail = k.shape[1], cache.sink_len, cache.tail_len
    recs = cache.records
    decode = decode or dequantize_record
    assert k.shape == v.shape == (H, len(cache), D), "k, v must be every token the cache was given"
    assert sink + recs.shape[0] * p.group + tail == n, "sink + tiles + tail does not add up to the tokens"
    tk = np.zeros((H, recs.shape[0] * p.group, D))
    tv = np.zeros_like(tk)
    for t in range(recs.shape[0]):
        for h in range(H):
            kk, vv = decode(recs[t, h], p.kbits, p.vbits, p.group, D)
            tk[h, t * p.group : (t + 1) * p.group] = kk
            tv[h, t * p.group : (t + 1) * p.group] = vv
    ks = [k[:, :sink], tk, k[:, n - tail :]]
    vs = [v[:, :sink], tv, v[:, n - tail :]]
    return np.concatenate(ks, axis=1), np.concatenate(vs, axis=1)


# Checks of a kvarn record against the oracle (tests/test_quantize.py, benchmarks/bench_quantize.py).
def assert_codes_match(native_codes, oracle_part):
    """Codes equal the oracle's except at rounding near-ties, where they may differ by one."""
    diff = native_codes != oracle_part["codes"]
    if diff.any():
        frac = np.abs(oracle_part["quotient"] - np.floor(oracle_part["quotient"]) - 0.5)
        assert (frac[diff] < 2e-3).all(), f"{diff.sum()} codes differ away from a rounding tie"
        assert (np.abs(native_codes - oracle_part["codes"])[diff] == 1).all()
    assert diff.mean() < 0.01


# Imbalances this close (relative) are ties for the native quantiser: its statistics are float32
# sums finished in double, within 8n ulp of the variance where they are used (sinkhorn.h), 8 * 128 *
# 2^-24 = 6e-5 at a 128-token tile, so it may order such candidates either way.
IMBALANCE_TIE = 1e-4


def assert_fields_match_oracle(f, ref):
    """One head's parsed record fields against oracle.quantize_tile's."""
    assert_codes_match(f["k_codes"], ref["k"])
    assert_codes_match(f["v_codes"], ref["v"])
    for part, (a, z, col) in [("k", ("ka", "kz", "kt")), ("v", ("va", "vz", "vc"))]:
        # (r * alpha, c / alpha) is the same balancing for any alpha; converged rounds' candidates
        # reach imbalances that differ below the float32 statistics' resolution (e.g. 2.0000022
        # vs 2.0000000), while each round moves the gauge by up to ~1 %, not r ⊗ c. So the native
        # quantiser may keep any candidate tied with the oracle's best: alpha must be the gauge of
        # one of those (fp16 rounding aside), and the fields match with alpha removed.
        alpha = np.median(f[col] / ref[part]["col"])
        best = ref[part]["imbalance"]
        tied = [np.median(c / ref[part]["col"]) for _, c, imb in ref[part]["candidates"]
                if imb <= best * (1 + IMBALANCE_TIE)]
        assert min(tied) * (1 - 2e-3) <= alpha <= max(tied) * (1 + 2e-3), \
            f"{col}: gauge factor {alpha}, tied candidates' {tied}"
        for name, got, ref_vec in [(a, f[a] * alpha, ref[part]["a"]), (z, f[z] * alpha, ref[part]["z"]),
                                   (col, f[col] / alpha, ref[part]["col"])]:
            scale = np.abs(ref_vec).max()
            np.testing.assert_allclose(got, ref_vec, rtol=2e-3, atol=2e-3 * scale, err_msg=name)
