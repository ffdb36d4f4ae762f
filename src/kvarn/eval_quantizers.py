"""Reference quantisers for the accuracy evaluation, in plain numpy (float64 maths).

Every function maps a batch of tiles ``k, v`` [N, G, D] to their dequantised values (float32),
so that `kvarn eval` can swap quantisers without touching anything else:

- ``kvarn_ref``: SPEC.md written out again in float64 numpy, with switches for the two
  ingredients. ``rotate=False, normalize=False`` is KIVI-style RTN, ``rotate=True,
  normalize=False`` is "rotation only", ``rotate=False, normalize=True`` is "normalisation only".
  With both on it is an independent implementation of the C++ quantiser (tests compare them).
- ``turboquant``: TurboQuant-style (MSE variant): per token vector, store its norm (fp16), rotate
  the unit vector by a fixed random orthogonal matrix, and quantise every coordinate with the
  Lloyd-Max codebook of the coordinate distribution of a uniformly random unit vector.
"""
from __future__ import annotations

import functools

import numpy as np

STD_CLAMP = (1e-3, 1e3)
LOG_CLAMP = (-0.3, 10.0)


def _check_tiles(k, v):
    k = np.asarray(k)
    v = np.asarray(v)
    if k.ndim != 3:
        raise ValueError(f"k: expected [N, G, D] tiles, got shape {k.shape}")
    if v.shape != k.shape:
        raise ValueError(f"v: shape {v.shape} does not match k's {k.shape}")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(v))):
        raise ValueError("k/v: contain NaN or infinity")
    return k.astype(np.float64), v.astype(np.float64)


def _check_bits(bits, name, allowed=(2, 3, 4, 8)):
    if isinstance(bits, bool) or not isinstance(bits, (int, np.integer)) or bits not in allowed:
        raise ValueError(f"{name}: expected one of {allowed}, got {bits!r}")
    return int(bits)


@functools.lru_cache(maxsize=None)
def hadamard_matrix(d: int) -> np.ndarray:
    """Orthonormal block-diagonal Sylvester Hadamard (block = largest power of two dividing d), float64."""
    if d < 1:
        raise ValueError(f"d: expected a positive head dim, got {d}")
    block = d & -d
    h = np.ones((1, 1))
    while h.shape[0] < block:
        h = np.block([[h, h], [h, -h]])
    h /= np.sqrt(block)
    return np.kron(np.eye(d // block), h)


def _f16(x):
    return np.asarray(x).astype(np.float16).astype(np.float64)


def balance(x: np.ndarray, iters: int = 8):
    """SPEC §3 on a batch of matrices x [N, R, C]: returns (r [N, R], c [N, C]) such that
    x / (r ⊗ c) has near-equal std along both axes (log-space, clamped, best-imbalance kept)."""
    n, rows, cols = x.shape
    lr = np.zeros((n, rows))
    lc = np.zeros((n, cols))

    def imbalance(cur):  # SPEC §3: of the stds themselves (unclamped; only the updates clamp them)
        cs = cur.std(axis=1, ddof=1)  # per column, over rows
        rs = cur.std(axis=2, ddof=1)  # per row, over columns
        return cs.max(1) / np.maximum(cs.min(1), 1e-8) + rs.max(1) / np.maximum(rs.min(1), 1e-8)

    best = imbalance(x)
    best_lr, best_lc = lr.copy(), lc.copy()
    for _ in range(iters):
        cur = x / np.exp(lc)[:, None, :] / np.exp(lr)[:, :, None]
        cs = np.clip(cur.std(axis=1, ddof=1), *STD_CLAMP)
        lc = np.clip(lc + np.log(cs), *LOG_CLAMP)
        cur = x / np.exp(lc)[:, None, :] / np.exp(lr)[:, :, None]
        rs = np.clip(cur.std(axis=2, ddof=1), *STD_CLAMP)
        lr = np.clip(lr + np.log(rs), *LOG_CLAMP)
        cur = x / np.exp(lc)[:, None, :] / np.exp(lr)[:, :, None]
        imb = imbalance(cur)
        better = imb <= best  # ties: the later one
        best = np.where(better, imb, best)
        best_lr[better], best_lc[better] = lr[better], lc[better]
    return np.exp(best_lr), np.exp(best_lc)


def _quantize_rows(x: np.ndarray, bits: int, normalize: bool, iters: int) -> np.ndarray:
    """x [N, R, C]: (optional SPEC §3 balance) + per-row asymmetric RTN with the scales absorbed and
    stored as fp16 (SPEC §4-5); returns the dequantised x."""
    if normalize:
        r, c = balance(x, iters)
    else:
        r, c = np.ones(x.shape[:2]), np.ones((x.shape[0], x.shape[2]))
    b = x / r[:, :, None] / c[:, None, :]
    lo = b.min(axis=2)
    hi = b.max(axis=2)
    qmax = 2**bits - 1
    scale = np.maximum((hi - lo) / qmax, 1e-10)
    codes = np.clip(np.rint((b - lo[:, :, None]) / scale[:, :, None]), 0, qmax)  # rint: half to even
    a, z, cc = _f16(r * scale), _f16(r * lo), _f16(c)
    return (codes * a[:, :, None] + z[:, :, None]) * cc[:, None, :]


def kvarn_ref(k, v, kbits: int, vbits: int, *, rotate: bool = True, normalize: bool = True, iters: int = 8):
    """Dequantised (k̂, v̂) float32 of tiles k, v [N, G, D] under SPEC.md, with the Hadamard
    rotation and the variance normalisation switchable."""
    k, v = _check_tiles(k, v)
    kbits, vbits = _check_bits(kbits, "kbits"), _check_bits(vbits, "vbits")
    h = hadamard_matrix(k.shape[2]) if rotate else None
    if rotate:
        k, v = k @ h, v @ h  # H is symmetric
    # Keys: rows = channels (quantised along tokens); values: rows = tokens.
    k_hat = np.swapaxes(_quantize_rows(np.swapaxes(k, 1, 2), kbits, normalize, iters), 1, 2)
    v_hat = _quantize_rows(v, vbits, normalize, iters)
    if rotate:
        k_hat, v_hat = k_hat @ h, v_hat @ h
    return k_hat.astype(np.float32), v_hat.astype(np.float32)


def kivi(k, v, kbits: int, vbits: int):
    """KIVI-style: per-channel K / per-token V asymmetric RTN, no rotation, no normalisation."""
    return kvarn_ref(k, v, kbits, vbits, rotate=False, normalize=False)


def rotation_only(k, v, kbits: int, vbits: int):
    """Hadamard rotation + KIVI-axis RTN, no normalisation."""
    return kvarn_ref(k, v, kbits, vbits, rotate=True, normalize=False)


def normalisation_only(k, v, kbits: int, vbits: int, iters: int = 8):
    """Dual-axis variance normalisation + RTN, no rotation."""
    return kvarn_ref(k, v, kbits, vbits, rotate=False, normalize=True, iters=iters)


# ---- TurboQuant-style ----------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def lloyd_max_codebook(bits: int, d: int, grid: int = 200001, tol: float = 1e-13, max_iters: int = 500000) -> np.ndarray:
    """Lloyd-Max centroids (sorted, float64) for one coordinate of a uniformly random unit vector
    in R^d: density ∝ (1 - x²)^((d-3)/2) on [-1, 1] (about N(0, 1/d) for large d)."""
    bits = _check_bits(bits, "bits", allowed=(1, 2, 3, 4, 5, 6, 8))
    if d < 3:
        raise ValueError(f"d: expected at least 3 dimensions, got {d}")
    lim = min(1.0, 12 / np.sqrt(d))
    x = np.linspace(-lim, lim, grid)
    w = np.clip(1 - x * x, 0, None) ** ((d - 3) / 2)
    # Mass and first moment up to x (trapezoid rule), read at the cell edges by interpolation: each
    # iteration then moves the centroids in the continuum. Sums over grid points instead stop early,
    # once no grid point changes cell (up to 1e-3/sqrt(d) short of the optimum at 4 bits).
    half = np.diff(x) / 2

    def cumulative(f):
        return np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) * half)])

    mass, moment = cumulative(w), cumulative(x * w)
    # Start at the quantiles of density^(1/3), the optimal point density of many levels (Panter-Dite):
    # Lloyd converges linearly, ever slower with more levels (8 bits: ~1e5 iterations, a few seconds).
    start = cumulative(w ** (1 / 3))
    n = 2**bits
    cent = np.interp((np.arange(n) + 0.5) / n * start[-1], start, x)
    for _ in range(max_iters):
        edges = np.concatenate([[-lim], (cent[1:] + cent[:-1]) / 2, [lim]])
        new = np.diff(np.interp(edges, x, moment)) / np.diff(np.interp(edges, x, mass))
        new = (new - new[::-1]) / 2  # the density is even: keep the codebook exactly symmetric
        if np.max(np.abs(new - cent)) < tol:
            return new
        cent = new
    raise RuntimeError(f"lloyd_max_codebook({bits}, {d}) did not converge in {max_iters} iterations")


@functools.lru_cache(maxsize=None)
def random_rotation(d: int, seed: int = 0) -> np.ndarray:
    """A fixed random orthogonal d×d matrix (QR of a Gaussian matrix, sign-corrected: Haar)."""
    rng = np.random.default_rng(seed)
    q, r = np.linalg.qr(rng.standard_normal((d, d)))
    return q * np.sign(np.diag(r))


def turboquant_rows(x, bits: int, seed: int = 0) -> np.ndarray:
    """TurboQuant-style quantise-dequantise of the rows of x [..., D]: fp16 norm + Lloyd-Max codes
    of the randomly rotated unit vector (bits per coordinate)."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    rot = random_rotation(d, seed)
    cent = lloyd_max_codebook(bits, d)
    norm = np.linalg.norm(x, axis=-1, keepdims=True)
    u = x / np.maximum(norm, 1e-30)
    y = u @ rot.T
    idx = np.searchsorted((cent[1:] + cent[:-1]) / 2, y)
    return ((cent[idx] @ rot) * _f16(norm)).astype(np.float32)


def turboquant(k, v, kbits: int, vbits: int, seed: int = 0):
    """TurboQuant-style on keys and values, each token vector on its own."""
    k, v = _check_tiles(k, v)
    return turboquant_rows(k, kbits, seed), turboquant_rows(v, vbits, seed + 1)


def rtn_bits_per_element(kbits: int, vbits: int, group: int, head_dim: int, extra_vectors: int = 0) -> float:
    """Bits per element of a tile with per-row fp16 scale and minimum on both K (per channel) and V
    (per token), plus ``extra_vectors`` more fp16 values (e.g. group + head_dim for KVarN's kt and vc)."""
    bits = group * head_dim * (kbits + vbits) + 16 * 2 * (head_dim + group) + 16 * extra_vectors
    return bits / (2 * group * head_dim)
