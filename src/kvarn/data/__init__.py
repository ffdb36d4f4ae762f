"""Real data shipped with kvarn (numpy only).

``smollm2_verne_sample.npz``: post-RoPE keys, values and queries of SmolLM2-135M-Instruct
(Apache-2.0) on the first tokens of Jules & Michel Verne's "In the Year 2889" (public domain),
written by ``scripts/capture_sample.py``.
"""
from __future__ import annotations

import json
import os

import numpy as np

DEFAULT_SAMPLE = "smollm2_verne_sample.npz"


def sample_path(name: str = DEFAULT_SAMPLE) -> str:
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), name)


def load_default_sample() -> dict:
    """The shipped real sample: {"k": [L, Hk, T, D] float16, "v": [L, Hk, T, D] float16,
    "q": [L, Hq, T, D] float16 (post-RoPE), "meta": dict} — meta names the model, text, layers,
    scale (1/sqrt(D)) and the token ids. Query head h reads KV head h // (Hq // Hk)."""
    path = sample_path()
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path} is missing: reinstall kvarn, or run scripts/capture_sample.py")
    with np.load(path, allow_pickle=False) as z:
        return {
            "k": z["k"],
            "v": z["v"],
            "q": z["q"],
            "meta": json.loads(str(z["meta"])),
        }
