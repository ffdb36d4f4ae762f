"""Reference baselines in plain numpy, for comparisons in `kvarn demo` and the evals.

KIVI-style: asymmetric round-to-nearest, keys per channel across the tile's
tokens, values per token across channels, fp16 scale and minimum, no rotation,
no normalisation. Same tile size, sink and tail policy as the kvarn cache, so
the two differ only in the quantiser.
"""
from __future__ import annotations

import numpy as np


def rtn_rows(x: np.ndarray, bits: int) -> np.ndarray:
    """Asymmetric RTN of each row of x (last axis), fp16 scale and minimum; returns the dequantised rows."""
    x = np.asarray(x, np.float32)
    lo = x.min(axis=-1, keepdims=True)
    hi = x.max(axis=-1, keepdims=True)
    qmax = 2**bits - 1
    scale = np.maximum((hi - lo) / qmax, 1e-10)
    codes = np.clip(np.rint((x - lo) / scale), 0, qmax)
    return codes * scale.astype(np.float16).astype(np.float32) + lo.astype(np.float16).astype(np.float32)


def kivi_tile(k: np.ndarray, v: np.ndarray, kbits: int, vbits: int):
    """k, v [..., G, D] -> dequantised (k̂, v̂): keys per channel (over tokens), values per token."""
    k_hat = np.swapaxes(rtn_rows(np.swapaxes(k, -1, -2), kbits), -1, -2)
    v_hat = rtn_rows(v, vbits)
    return k_hat, v_hat


def kivi_cache(k: np.ndarray, v: np.ndarray, kbits: int, vbits: int, group: int, sink: int):
    """k, v [H, n, D]: what a KIVI cache with kvarn's sink/tile/tail policy holds, dequantised."""
    k_hat = np.array(k, np.float32)
    v_hat = np.array(v, np.float32)
    n = k.shape[1]
    n_tiles = max(0, n - sink) // group
    for t in range(n_tiles):
        s = slice(sink + t * group, sink + (t + 1) * group)
        k_hat[:, s], v_hat[:, s] = kivi_tile(k_hat[:, s], v_hat[:, s], kbits, vbits)
    # Full-precision parts are fp16, as in KVCache.
    full = np.ones(n, bool)
    full[sink : sink + n_tiles * group] = False
    k_hat[:, full] = k_hat[:, full].astype(np.float16)
    v_hat[:, full] = v_hat[:, full].astype(np.float16)
    return k_hat, v_hat


def kivi_bytes(num_heads: int, n: int, head_dim: int, kbits: int, vbits: int, group: int, sink: int) -> int:
    """Bytes of that KIVI cache: codes plus fp16 scale and minimum per key channel-tile and per value token."""
    n_tiles = max(0, n - sink) // group
    full = n - n_tiles * group
    per_tile = head_dim * group * (kbits + vbits) // 8 + 2 * 2 * head_dim + 2 * 2 * group
    return num_heads * (n_tiles * per_tile + full * head_dim * 2 * 2)


def attention_numpy(q: np.ndarray, k: np.ndarray, v: np.ndarray, scale: float, dtype=np.float32) -> np.ndarray:
    """Plain softmax attention, GQA by consecutive query heads: q [Hq, D], k, v [Hk, n, D]."""
    hq, hk = q.shape[0], k.shape[0]
    g = hq // hk
    qg = q.astype(dtype).reshape(hk, g, -1)
    s = np.matmul(qg, np.swapaxes(k.astype(dtype, copy=False), -1, -2)) * dtype(scale)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    return np.matmul(p, v.astype(dtype, copy=False)).reshape(hq, -1)
