"""Forty-second session: which outputs of zen3_2c_s76/bitid.py are bit-identical between two builds, per score mode
(4-bit-key presets apart from k2v2, whose keys score in float). Each build's .npz from, on the Zen 4 box:
    KVARN_ISA=ISA PYTHONPATH=SITE python benchmarks/results/zen3_2c_s76/bitid.py /tmp/bitid_ISA_BUILD[_novnni].npz
(_novnni: with kvarn._native.set_vnni(False) first). Then: python bitid_compare.py"""
import numpy as np

for isa in ["avx512", "avx2"]:
    for suffix in ["", "_novnni"]:
        old, new = np.load(f"/tmp/bitid_{isa}_s42{suffix}.npz"), np.load(f"/tmp/bitid_{isa}_new{suffix}.npz")
        same = {}
        for key in old.files:
            mode, k2 = key.split("_")[-2], key.startswith("k2v2")
            row = same.setdefault(mode + (" k2v2" if k2 else ""), [0, 0])
            row[0] += np.array_equal(old[key], new[key])
            row[1] += 1
        print(isa, suffix[1:] or "vnni", "identical:", ", ".join(f"{m} {a}/{n}" for m, (a, n) in sorted(same.items())))
