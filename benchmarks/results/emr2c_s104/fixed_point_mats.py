"""The matrices fixed_point.cpp reads (mats.bin here): the shipped SmolLM2 sample's K (transposed: channels x
tokens) and V tiles after tile 0, rotated as the quantiser rotates them, and 20 synthetic K / V pairs of head_dim 128."""
import numpy as np, kvarn, sys
from kvarn.data import load_default_sample
s = load_default_sample()
mats = []
for L in range(3):
    for h in range(3):
        for t in range(1, 7):
            k = kvarn.hadamard(s['k'][L, h, t*128:(t+1)*128].astype(np.float16).astype(np.float32))
            v = kvarn.hadamard(s['v'][L, h, t*128:(t+1)*128].astype(np.float16).astype(np.float32))
            mats.append(np.ascontiguousarray(k.T)); mats.append(np.ascontiguousarray(v))
rng = np.random.default_rng(0)
for i in range(20):  # synthetic headline-like: D 128, outlier channels
    k = rng.standard_normal((128, 128)).astype(np.float32) * (1 + 10 * (rng.random(128) < 0.05))
    mats.append(np.ascontiguousarray(kvarn.hadamard(k.astype(np.float16).astype(np.float32)).T))
    v = rng.standard_normal((128, 128)).astype(np.float32)
    mats.append(np.ascontiguousarray(kvarn.hadamard(v.astype(np.float16).astype(np.float32))))
with open("mats.bin", "wb") as f:
    for m in mats:
        np.array(m.shape, np.int32).tofile(f); m.astype(np.float32).tofile(f)
print(len(mats))
