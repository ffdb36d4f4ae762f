"""Forty-second session, a numpy prototype (no kernel): the int8 query rounding's centred score error on the shipped
SmolLM2 sample with one scale per (tile, head) at head_dim 64 (block 64) against ggml-style scales per 32 or 16
channels.    python block_scales_proto.py SITE_DIR > block_scales_proto.log"""
import sys; sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn.demo import load_sample
d = load_sample()
K, Q = d['k'].astype(np.float32), d['q'].astype(np.float32)
L, Hk, T, D = K.shape; Hq = Q.shape[1]; grp = Hq // Hk
res = {b: [] for b in (64, 32, 16)}
for l in range(L):
    for hk in range(Hk):
        for t0 in range(128, T - 127, 128):
            tile = kvarn.quantize_tile(K[l, hk, t0:t0+128], K[l, hk, t0:t0+128], 'k4v2_g128'); f = tile.fields()
            kc = tile.k_codes().reshape(D, 128).astype(np.float64)
            ka = f['ka'].reshape(-1).astype(np.float64); kt = f['kt'].reshape(-1).astype(np.float64)
            for hq in range(hk*grp, hk*grp+grp):
                for qi in range(t0+128, T, 37):
                    q = kvarn.hadamard(Q[l, hq, qi][None])[0].astype(np.float64) / np.sqrt(D)
                    qa = q * ka; exact = kt * (qa @ kc)
                    for B in res:
                        qab = qa.reshape(-1, B); step = np.abs(qab).max(1, keepdims=True) / 127
                        delta = (qab - np.round(qab / step) * step).reshape(-1)
                        err = kt * (delta @ (kc - 7.5))
                        res[B].append(np.sqrt(np.mean(err**2)) / np.std(exact))
for B, v in res.items(): print(f'block {B}: rms centred score error / score std {np.mean(v):.3e}')
