"""Which tensor does KVarN's Hadamard rotation help or hurt on a model? (docs/accuracy.md)

Pseudo-decode as `kvarn eval` (sink and own tile exact, KL from position 256) with the float64 SPEC
quantiser (`kvarn.eval_quantizers.kvarn_ref`), the rotation switched on or off for keys and values
separately; plus the per-channel spread of key/value standard deviations (max / median over the
channels of each KV head, tokens after the sink) before and after the rotation, per attention layer
that kvarn quantises.

    python scripts/rotation_split.py --model gemma3-270m --tokens 1024 --bits 2,2 4,4 4,2
    python scripts/rotation_split.py --model smollm2-135m --tokens 2048 --bits 4,2 2,2

Needs the eval extra and the model's wheels (see docs/accuracy.md). Off-SPEC by design: SPEC.md
rotates both tensors; this only measures what each rotation contributes.
"""
import argparse
import json
import time

import numpy as np


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--bits", nargs="+", default=["4,2", "2,2"], help="kbits,vbits pairs")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", help="JSON file for the results")
    args = ap.parse_args()

    import torch

    from kvarn import eval as ev
    from kvarn import eval_quantizers as eq
    from kvarn.integrations import assets

    if args.threads:
        torch.set_num_threads(args.threads)
    sink = group = 128
    model, tok = assets.load_model(args.model)
    ids = assets.verne_token_ids(tok, args.tokens)
    targets = torch.tensor(ids[257:])
    scored = slice(256, args.tokens - 1)

    captured = {}

    class Capture(ev.PseudoDecode):  # the fp32 reference, keeping each quantised layer's K/V
        def __call__(self, module, query, key, value, mask, scaling):
            if not getattr(module, "sliding_window", None):
                captured[module.layer_idx] = (key[0].float().numpy(), value[0].float().numpy())
            return super().__call__(module, query, key, value, mask, scaling)

    ref_logp = torch.log_softmax(ev.forward_logits(model, ids, Capture(None, sink, group))[scored].double(), -1)
    result = {"model": args.model, "tokens": args.tokens, "spread": {}, "kl": {}}
    for layer, (k, v) in sorted(captured.items()):
        h = eq.hadamard_matrix(k.shape[-1])
        for name, x in (("K", k), ("V", v)):
            pairs = []
            for head in x[:, sink:]:
                s0, s1 = head.std(0), (head @ h).std(0)
                pairs.append((float(s0.max() / np.median(s0)), float(s1.max() / np.median(s1))))
            result["spread"][f"{layer} {name}"] = pairs
            print(f"layer {layer} {name}: channel std max/median per head "
                  + ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in pairs), flush=True)

    for pair in args.bits:
        kbits, vbits = (int(b) for b in pair.split(","))
        for rot_k, rot_v in ((True, True), (False, True), (True, False), (False, False)):
            def quantize(k, v, kbits=kbits, vbits=vbits, rot_k=rot_k, rot_v=rot_v):
                k_hat = eq.kvarn_ref(k, v, kbits, vbits, rotate=rot_k)[0]
                v_hat = eq.kvarn_ref(k, v, kbits, vbits, rotate=rot_v)[1]
                return k_hat, v_hat

            name = f"k{kbits}v{vbits} rotate K {'yes' if rot_k else 'no'}, V {'yes' if rot_v else 'no'}"
            method = ev.Method(name, "rotation-split", kbits, vbits, group, 0.0, quantize)
            t0 = time.time()
            logits = ev.forward_logits(model, ids, ev.PseudoDecode(method, sink, group, own_tile_exact=True))
            r = ev.compare_logits(ref_logp.float(), logits[scored], targets)
            result["kl"][name] = r
            print(f"{name}: KL {r['kl']:.4f}, ppl {r['ppl']:.3f}, top-1 {100 * r['top1']:.1f} % "
                  f"({time.time() - t0:.0f} s)", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
