"""Twenty-second session: how many records of the shipped SmolLM2 sample (3 layers x 3 kv heads, presets k4v2 /
k4v4 / k2v2 at G 128 and k4v2 at G 64) change when SPEC §3's candidates tie within a relative band of 1e-5
(s62_tie_band.patch, considered and not landed). Usage: s62_tie_band_records.py SITE_WITHOUT SITE_WITH"""
import os, subprocess, sys, tempfile
import numpy as np

DUMP = r"""
import sys, numpy as np, kvarn, importlib.resources as ir
d = np.load(str(ir.files("kvarn") / "data" / "smollm2_verne_sample.npz"))
out = {}
for L in range(d["k"].shape[0]):
    k, v = d["k"][L].astype(np.float32), d["v"][L].astype(np.float32)
    for preset in ("k4v2_g128", "k4v4_g128", "k2v2_g128", "k4v2_g64"):
        G = kvarn.PRESETS[preset].group
        for t in range(k.shape[1] // G):
            out[f"{L}_{preset}_{t}"] = kvarn.quantize_tile(k[:, t*G:(t+1)*G], v[:, t*G:(t+1)*G], preset).records
np.savez(sys.argv[1], **out)
"""
with tempfile.TemporaryDirectory() as tmp:
    files = []
    for i, site in enumerate(sys.argv[1:3]):
        files.append(os.path.join(tmp, f"{i}.npz"))
        subprocess.run([sys.executable, "-c", DUMP, files[-1]], env=dict(os.environ, PYTHONPATH=site), check=True)
    a, b = np.load(files[0]), np.load(files[1])
    changed = sum(not np.array_equal(a[key][h], b[key][h]) for key in a for h in range(a[key].shape[0]))
    total = sum(a[key].shape[0] for key in a)
    print(f"records that differ: {changed} of {total}")
