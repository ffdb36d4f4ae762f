"""`kvarn demo`: what KVarN buys on a KV sample, in one screen.

For every layer of the sample: bytes of the kvarn cache vs fp16, decode
attention error against exact attention (float64 over the unquantised K/V),
the same for a KIVI-style cache at the same bits, and decode time of
kvarn.attend vs plain numpy fp32 attention over the uncompressed cache.
Errors are measured as decoding meets them: the query at position p attends
to tokens 0..p, through a cache that has been appended to up to p.
"""
from __future__ import annotations

import time

import numpy as np

from . import baselines
from ._ops import active_isa, check_positive_int, get_num_threads, get_preset
from .cache import KVCache, attend


def synthetic_sample(seed: int = 0, num_kv_heads: int = 8, group_size: int = 4, tokens: int = 4096, head_dim: int = 128):
    """A SYNTHETIC KV sample shaped like a Llama layer: keys with a per-channel offset, a few
    outlier channels and rotary-style slow/fast channel pairs; values near Gaussian with per-token
    scale; queries that point at some keys. Used only when no real sample ships with the package."""
    rng = np.random.default_rng(seed)
    hk, t, d = num_kv_heads, tokens, head_dim
    pos = np.arange(t)[:, None]
    freqs = 10000.0 ** (-np.arange(0, d, 2) / d)
    angle = pos * freqs[None, :]
    amp = np.exp(rng.normal(0.0, 0.8, (hk, 1, d // 2)))
    phase = rng.uniform(0, 2 * np.pi, (hk, 1, d // 2))
    k = np.concatenate([amp * np.cos(angle + phase), amp * np.sin(angle + phase)], axis=-1)
    k += rng.normal(0.0, 0.6, (hk, t, d)) + rng.normal(0.0, 1.0, (hk, 1, d))
    outliers = rng.choice(d, size=4, replace=False)
    k[:, :, outliers] *= 6.0
    v = rng.normal(0.0, 1.0, (hk, t, d)) * np.exp(rng.normal(0.0, 0.3, (hk, t, 1)))
    picks = rng.integers(0, t, size=(hk * group_size, 8))
    q = np.stack([k[h // group_size, picks[h]].mean(axis=0) for h in range(hk * group_size)])
    q = q / np.linalg.norm(q, axis=-1, keepdims=True) * np.sqrt(d) * 4.0
    return {
        "k": k[None].astype(np.float16),
        "v": v[None].astype(np.float16),
        "q": np.repeat(q[None, :, None, :], 1, axis=2).astype(np.float16),  # [L, Hq, n_q, D]
        "meta": {"source": "synthetic (kvarn.demo.synthetic_sample)", "synthetic": True},
    }


def load_sample(synthetic: bool = False):
    if not synthetic:
        try:
            from .data import load_default_sample  # ships a real model's KV (issue: real model)
        except ImportError:
            pass
        else:
            try:
                sample = load_default_sample()
                sample.setdefault("meta", {}).setdefault("synthetic", False)
                return sample
            except FileNotFoundError:
                pass
    return synthetic_sample()


def _rel_err(out, ref):
    return float(np.linalg.norm(out - ref) / np.linalg.norm(ref))


# Before each layer's kvarn timing: numpy's BLAS workers spin for ~0.1 s after a matrix product (the
# previous layer's numpy timing) and take the cores kvarn's threads would run on (benchmarks/ do the same).
SETTLE_S = 0.2


def _median_time(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def run_demo(preset: str = "k4v2_g128", synthetic: bool = False, max_queries: int = 8, repeats: int = 21, out=print):
    p = get_preset(preset)
    max_queries = check_positive_int(max_queries, "max_queries")
    repeats = check_positive_int(repeats, "repeats")
    sample = load_sample(synthetic)
    k_all, v_all, q_all = sample["k"], sample["v"], sample["q"]
    meta = sample.get("meta", {})
    n_layers, hk, n, d = k_all.shape
    hq = q_all.shape[1]
    sink = p.group
    out(f"kvarn demo — preset {p.name} ({p.bits_per_element(d):.3f} bits/element in tiles), ISA {active_isa()}, "
        f"{get_num_threads()} thread(s)")
    label = "SYNTHETIC" if meta.get("synthetic") else "real"
    source = meta.get("source") or "; ".join(str(meta[key]) for key in ("model", "text") if key in meta) or "?"
    layers = f" (model layers {meta['layers']})" if "layers" in meta else ""
    out(f"sample: {label} — {source}")
    out(f"        {n_layers} layer(s){layers}, {hk} kv heads, {hq} query heads, {n} tokens, head_dim {d}")
    out("")
    header = f"{'layer':>5} {'kvarn MB':>9} {'fp16 MB':>8} {'ratio':>6} {'kvarn err':>10} {'KIVI err':>9} {'KIVI ratio':>10} {'kvarn ms':>9} {'numpy ms':>9} {'speed-up':>8}"
    out(header)
    out("-" * len(header))
    totals = []
    # The sample's queries are per token position (the synthetic one's only look at the whole cache).
    causal = q_all.shape[2] == n
    for layer in range(n_layers):
        k = k_all[layer].astype(np.float32)
        v = v_all[layer].astype(np.float32)
        cache = KVCache(hk, d, p, sink_tokens=sink)  # the Preset: a custom one's name cannot be looked up
        kivi_ratio = n * hk * d * 4 / baselines.kivi_bytes(hk, n, d, p.kbits, p.vbits, p.group, sink)
        scale = 1.0 / np.sqrt(d)
        errs, kivi_errs = [], []
        queries = q_all[layer][:, -max_queries:].astype(np.float32)  # [Hq, n_q, D]
        for j in range(queries.shape[1]):
            # A decode step at position `end - 1`: its own token appended, nothing later visible.
            end = n - queries.shape[1] + j + 1 if causal else n
            cache.append(k[:, len(cache) : end], v[:, len(cache) : end])
            q = np.ascontiguousarray(queries[:, j])
            ref = baselines.attention_numpy(q, k[:, :end], v[:, :end], scale, dtype=np.float64)
            errs.append(_rel_err(attend(q, cache), ref))
            k_kivi, v_kivi = baselines.kivi_cache(k[:, :end], v[:, :end], p.kbits, p.vbits, p.group, sink)
            kivi_errs.append(_rel_err(baselines.attention_numpy(q, k_kivi, v_kivi, scale, np.float64), ref))
        cache.append(k[:, len(cache) :], v[:, len(cache) :])  # nothing left: the last query ends the sample
        q = np.ascontiguousarray(queries[:, -1])
        time.sleep(SETTLE_S)
        t_kvarn = _median_time(lambda: attend(q, cache), repeats)
        t_numpy = _median_time(lambda: baselines.attention_numpy(q, k, v, scale), repeats)
        row = (layer, cache.nbytes / 1e6, n * hk * d * 4 / 1e6, cache.compression_ratio, np.mean(errs),
               np.mean(kivi_errs), kivi_ratio, t_kvarn * 1e3, t_numpy * 1e3, t_numpy / t_kvarn)
        totals.append(row)
        out(f"{row[0]:>5} {row[1]:>9.3f} {row[2]:>8.3f} {row[3]:>5.2f}x {row[4]:>10.4f} {row[5]:>9.4f} {row[6]:>9.2f}x "
            f"{row[7]:>9.3f} {row[8]:>9.3f} {row[9]:>7.2f}x")
    mean = np.mean(np.array([r[1:] for r in totals]), axis=0)
    mean[8] = mean[7] / mean[6]  # the speed-up of the mean times (a mean of per-layer ratios overstates it)
    out("-" * len(header))
    out(f"{'mean':>5} {mean[0]:>9.3f} {mean[1]:>8.3f} {mean[2]:>5.2f}x {mean[3]:>10.4f} {mean[4]:>9.4f} {mean[5]:>9.2f}x "
        f"{mean[6]:>9.3f} {mean[7]:>9.3f} {mean[8]:>7.2f}x")
    out("")
    out("err: relative L2 error of decode attention output vs exact attention (float64, unquantised K/V),")
    if causal:
        out(f"     mean over the last {max_queries} positions, each over the tokens up to it (as decoding appends them).")
    else:
        m = queries.shape[1]
        out(f"     mean over the sample's {m} quer{'y' if m == 1 else 'ies'}, over the whole cache.")
    out(f"     Sink ({sink} tokens) and the unfinished tail tile stay fp16 in both caches.")
    out("ratio: fp16 bytes of the same tokens / cache bytes. Times: median of "
        f"{repeats} runs; numpy = fp32 attention over the uncompressed cache; mean speed-up = mean numpy ms / "
        "mean kvarn ms.")
    return {"rows": totals, "mean": mean.tolist(), "synthetic": bool(meta.get("synthetic"))}
