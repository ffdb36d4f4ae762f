"""Forty-second session, the numpy prototype behind the int8 centring (no kernel): on the shipped SmolLM2 sample, the
4-bit key codes' per-channel means and spread, and the rms score error of an int8 (qmax 127) or int16 (32767) query
rounding with no correction, with 7.5 sum(delta) added (the kernels' centring), and with each channel's own mean code.
    python centring_proto.py SITE_DIR > centring_proto.log"""
import sys; sys.path.insert(0, sys.argv[1])
import numpy as np, kvarn
from kvarn.demo import load_sample
d = load_sample()
K, Q = d['k'].astype(np.float32), d['q'].astype(np.float32)   # [layer, head, tok, D]
L, Hk, T, D = K.shape
Hq = Q.shape[1]; grp = Hq // Hk
res = {m: {c: [] for c in ('none', '7.5', 'mean')} for m in (127, 32767)}
code_stats = []
for l in range(L):
    for hk in range(Hk):
        for t0 in range(128, T - 127, 128):
            k = K[l, hk, t0:t0 + 128]
            tile = kvarn.quantize_tile(k, k, 'k4v2_g128')
            f = tile.fields()
            kc = tile.k_codes().reshape(D, 128).astype(np.float64)  # [D][G]
            ka = f['ka'].reshape(-1).astype(np.float64); kz = f['kz'].reshape(-1).astype(np.float64); kt = f['kt'].reshape(-1).astype(np.float64)
            cm = kc.mean(axis=1)
            code_stats.append((cm.mean(), cm.std(), kc.std(axis=1).mean()))
            for hq in range(hk * grp, hk * grp + grp):
                for qi in range(t0 + 128, T, 37):
                    q = kvarn.hadamard(Q[l, hq, qi][None])[0].astype(np.float64) / np.sqrt(D)
                    qa = q * ka
                    exact = kt * (qa @ kc + q @ kz)
                    for qmax in (127, 32767):
                        step = np.abs(qa).max() / qmax
                        qi_ = np.round(qa / step)
                        delta = qa - qi_ * step
                        approx = kt * (step * (qi_ @ kc) + q @ kz)
                        for name, c0 in (('none', 0.0), ('7.5', 7.5), ('mean', None)):
                            corr = (delta @ cm) if c0 is None else c0 * delta.sum()
                            err = approx + kt * corr - exact
                            res[qmax][name].append((np.sqrt(np.mean(err ** 2)), np.std(exact)))
cs = np.array(code_stats)
print('per-channel mean code: mean %.2f, spread across channels %.2f; within-channel code std %.2f' % tuple(cs.mean(0)))
for qmax, r in res.items():
    for name, v in r.items():
        v = np.array(v)
        print(f'qmax {qmax:5d} centring {name:4s}: rms score error / score std = {np.mean(v[:,0]/v[:,1]):.3e}')
