"""Which tensor does KVarN's Hadamard rotation help or hurt on a model? (docs/accuracy.md)

Pseudo-decode as `kvarn eval` (sink and own tile exact, KL from position 256) with the float64 SPEC
quantiser (`kvarn.eval_quantizers.kvarn_ref`), the rotation switched on or off for keys and values
separately; plus, per attention layer that kvarn quantises: the spread of the channels' key/value
standard deviations (max / median over the channels of each KV head, tokens after the sink) before
and after the rotation, how the queries' energy falls on the key channels, and the rms error of the
attention scores q.k that 2-bit keys cause with and without the rotation.

    python scripts/rotation_split.py --model gemma3-270m --tokens 1024 --bits 2,2 4,4 4,2
    python scripts/rotation_split.py --model smollm2-135m --tokens 2048 --bits 4,2 2,2
    python scripts/rotation_split.py --model smollm2-135m --bits --per-layer 2,2   # one layer's keys at a time

Needs the eval extra and the model's wheels (see docs/accuracy.md). Off-SPEC by design: SPEC.md
rotates both tensors; this only measures what each rotation contributes.
"""
import argparse
import json
import time

import numpy as np


def score_error_stats(q, k, sink, group, eq, scaling):
    """q [Hq, T, D], k [Hk, T, D]: where the queries' energy falls relative to the key channels' std
    (all heads pooled, tokens after the sink), and the rms error of q.k that 2-bit keys (SPEC
    quantiser, rotated or not) cause: the last 256 queries against every key of the tiles after the
    sink -- an error-size proxy that ignores causality and the exact own tile -- and the same errors
    weighted by the exact attention of each query over those keys (softmax of q.k * scaling): the
    error where the attention actually looks."""
    Hq, Hk, D = q.shape[0], k.shape[0], k.shape[-1]
    n = (k.shape[1] - sink) // group
    key_std = k[:, sink:].std(1).mean(0)
    q_rms = np.sqrt((q[:, sink:] ** 2).mean((0, 1)))
    big = key_std > 4 * np.median(key_std)
    live = (key_std > 0) & (q_rms > 0)
    out = {
        "big_key_var_pct": float(100 * (key_std[big] ** 2).sum() / (key_std ** 2).sum()),
        "big_q_energy_pct": float(100 * (q_rms[big] ** 2).sum() / (q_rms ** 2).sum()),
        "corr_log_kstd_log_qrms": float(np.corrcoef(np.log(key_std[live]), np.log(q_rms[live]))[0, 1]),
    }
    tiles = k[:, sink : sink + n * group].reshape(Hk, n, group, D).transpose(1, 0, 2, 3).reshape(n * Hk, group, D)
    kv = [hq // (Hq // Hk) for hq in range(Hq)]  # GQA: consecutive query heads share a KV head
    logits = np.concatenate([q[hq, -256:] @ k[kv[hq], sink : sink + n * group].T for hq in range(Hq)]) * scaling
    p = np.exp(logits - logits.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    for rotate in (False, True):
        k_err = eq.kvarn_ref(tiles, tiles, 2, 2, rotate=rotate)[0] - tiles
        k_err = k_err.reshape(n, Hk, group, D).transpose(1, 0, 2, 3).reshape(Hk, n * group, D)
        err = np.concatenate([q[hq, -256:] @ k_err[kv[hq]].T for hq in range(Hq)])
        suffix = "_rotated" if rotate else ""
        out["key_err_2bit" + suffix] = float(np.sqrt((k_err ** 2).mean()))
        out["score_err_2bit" + suffix] = float(np.sqrt((err ** 2).mean()))
        out["attn_weighted_score_err_2bit" + suffix] = float(np.sqrt((p * err ** 2).sum(1).mean()))
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=2048)
    ap.add_argument("--bits", nargs="*", default=["4,2", "2,2"], help="kbits,vbits pairs (none: statistics only)")
    ap.add_argument("--per-layer", metavar="KBITS,VBITS",
                    help="also: values rotated everywhere, keys rotated in one layer only, each layer in turn")
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
                captured[module.layer_idx] = tuple(x[0].float().numpy() for x in (query, key, value)) + (scaling,)
            return super().__call__(module, query, key, value, mask, scaling)

    ref_logp = torch.log_softmax(ev.forward_logits(model, ids, Capture(None, sink, group))[scored].double(), -1)
    result = {"model": args.model, "tokens": args.tokens, "spread": {}, "scores": {}, "kl": {}}
    for layer, (q, k, v, scaling) in sorted(captured.items()):
        h = eq.hadamard_matrix(k.shape[-1])
        for name, x in (("K", k), ("V", v)):
            pairs = []
            for head in x[:, sink:]:
                s0, s1 = head.std(0), (head @ h).std(0)
                pairs.append((float(s0.max() / np.median(s0)), float(s1.max() / np.median(s1))))
            result["spread"][f"{layer} {name}"] = pairs
            print(f"layer {layer} {name}: channel std max/median per head "
                  + ", ".join(f"{a:.1f} -> {b:.1f}" for a, b in pairs), flush=True)
        result["scores"][str(layer)] = stats = score_error_stats(q, k, sink, group, eq, scaling)
        print(f"layer {layer} q.k: key channels over 4x the median std hold {stats['big_key_var_pct']:.1f} % of the "
              f"key variance and {stats['big_q_energy_pct']:.1f} % of the query energy; corr(log key std, log q rms) "
              f"{stats['corr_log_kstd_log_qrms']:.2f}; 2-bit keys: key error rms {stats['key_err_2bit']:.3f} (rotated "
              f"{stats['key_err_2bit_rotated']:.3f}), score error rms {stats['score_err_2bit']:.3f} (rotated "
              f"{stats['score_err_2bit_rotated']:.3f}), attention-weighted {stats['attn_weighted_score_err_2bit']:.3f} "
              f"(rotated {stats['attn_weighted_score_err_2bit_rotated']:.3f})", flush=True)

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
    if args.per_layer:
        kbits, vbits = (int(b) for b in args.per_layer.split(","))

        def split_method(rot_k, kbits=kbits, vbits=vbits):
            def quantize(k, v):
                return eq.kvarn_ref(k, v, kbits, vbits, rotate=rot_k)[0], eq.kvarn_ref(k, v, kbits, vbits)[1]

            return ev.Method(f"k{kbits}v{vbits} keys rotated: {rot_k}", "rotation-split", kbits, vbits, group, 0.0,
                             quantize)

        unrotated, rotated = split_method(False), split_method(True)

        class KeysRotatedIn(ev.PseudoDecode):  # the rotated-keys method in the given layers only
            def __init__(self, layers):
                super().__init__(unrotated, sink, group, own_tile_exact=True)
                self.layers = layers

            def __call__(self, module, query, key, value, mask, scaling):
                self.method = rotated if module.layer_idx in self.layers else unrotated
                return super().__call__(module, query, key, value, mask, scaling)

        def kl_of(layers):
            logits = ev.forward_logits(model, ids, KeysRotatedIn(layers))
            return ev.compare_logits(ref_logp.float(), logits[scored], targets)["kl"]

        base = kl_of(set())
        result["per_layer"] = {"bits": args.per_layer, "no_key_rotation": base, "keys_rotated_in_layer": {}}
        print(f"k{kbits}v{vbits}, values rotated, no key rotated: KL {base:.4f}", flush=True)
        for layer in sorted(captured):
            kl = kl_of({layer})
            result["per_layer"]["keys_rotated_in_layer"][str(layer)] = kl
            print(f"  keys rotated in layer {layer} only: KL {kl:.4f} ({kl - base:+.4f})", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
