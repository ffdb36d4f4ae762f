# Does a q accepted by the old GPU limit (FLT_MAX / (D 2^17 log2 e)) give non-finite output over extreme keys?
import math, numpy as np, torch, kvarn, kvarn.cuda as kc
D, G = 128, 128
old = float(np.finfo(np.float32).max) / (D * 2.0**17 * math.log2(math.e))
scale = 1 / math.sqrt(D)
for amp in (5e3, 1e4, 2e4, 4e4, 6e4):
    for seed in range(3):
        rng = np.random.default_rng(seed)
        scales = rng.uniform(-amp, amp, G)
        tile_k = (scales[:, None] * np.ones((1, D)) + rng.standard_normal((G, D))).astype(np.float32)
        tile_k = np.clip(tile_k, -65504, 65504)
        sink_k, sink_v, tile_v = (rng.standard_normal((1, G, D)).astype(np.float16) for _ in range(3))
        try:
            tile = kvarn.quantize_tile(tile_k, tile_v[0].astype(np.float32), "k4v2_g128")
        except ValueError as e:
            print(amp, seed, "quantize refused"); continue
        empty = np.zeros((1, 0, D), np.float16)
        host = kvarn.KVCache.from_parts(sink_k, sink_v, tile.records[None], empty, empty, preset="k4v2_g128")
        cache = kc.PagedKVCache(1, D, "k4v2_g128", max_seqs=1, max_seq_len=512)
        sid = cache.add_sequence()
        try:
            cache.load_cpu(sid, host)
        except ValueError as e:
            print(amp, seed, "load_cpu refused:", str(e)[:60]); continue
        res = []
        for frac in (0.5, 0.9, 0.999):
            for sign in (1, -1):
                q = np.full((1, 1, D), sign * frac * old / scale, np.float32)
                out = cache.attend(torch.tensor(q, device="cuda"), [sid], validate=False).cpu().numpy()
                res.append(f"{sign*frac}:{'ok' if np.isfinite(out).all() else 'NONFINITE'}")
            qr = rng.standard_normal((1, 1, D)).astype(np.float32)
            qr *= frac * old / scale / np.abs(qr).max()
            out = cache.attend(torch.tensor(qr, device="cuda"), [sid], validate=False).cpu().numpy()
            res.append(f"rand{frac}:{'ok' if np.isfinite(out).all() else 'NONFINITE'}")
        print(amp, seed, " ".join(res), flush=True)
