"""`kvarn eval`: accuracy of KVarN and baselines on a real model and real text.

Pseudo-decode: one teacher-forced forward over the text in which every attention layer lets each
query position p see exactly what a decode-time kvarn cache holds when token p is decoded:
the sink (exact, fp16), every tile completed before its own in quantised form, and its own tile
exact (fp16) — ``--quantize-on next``, the default; with ``fill`` a tile is quantised the moment it
fills, so its last token sees its own tile quantised (KVCache's default, SPEC §7). Keys are
quantised after RoPE, as the cache stores them. Errors compound through the layers as they do in
decoding. KVarN presets use kvarn's C++ quantiser
(``kvarn.quantize_tile``/``dequantize_tile``); baselines come from ``kvarn.eval_quantizers``.

Metrics, from position ``--eval-from`` (default 256: before it no token sees a quantised 128-token tile
with the default 128-token sink; 64-token tiles are quantised for queries from 193 on) on:
perplexity, KL(fp32 ‖ method) of the next-token distribution, and top-1 agreement with fp32.
Also: greedy generation from real prompts (token-identical prefix vs an fp32 cache), and a check
that the real decode path (``KVarNCache`` + ``kvarn.attend``) agrees with pseudo-decode.

Needs the ``eval`` extra and the model/text packages (see ``kvarn.integrations.assets``).
"""
from __future__ import annotations

import json
import math
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .cli import MAX_THREADS, int_at_least

PAPER_PRESETS = ("k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128")
BASELINE_BITS = ((4, 2), (4, 4), (2, 2))
TURBOQUANT_BITS = (3, 4)
# Method.family values (build_methods), as --gen-methods names them; the baselines are off with --no-baselines.
BASELINE_FAMILIES = ("kivi", "rotation-only", "normalisation-only", "turboquant")
METHOD_FAMILIES = ("fp16", "kvarn", "kvarn-ref") + BASELINE_FAMILIES
DEFAULT_GEN_FAMILIES = ("kvarn", "kivi")  # those of them in the run


@dataclass
class Method:
    name: str
    family: str  # kvarn | kivi | rotation-only | normalisation-only | turboquant | fp16
    kbits: int
    vbits: int
    group: int
    bits_per_element: float
    quantize: Callable | None  # (k [N, G, D], v [N, G, D]) -> dequantised (k̂, v̂) float32
    preset: object = None  # kvarn.Preset of a KVarN method (a custom one too), else None
    results: dict = field(default_factory=dict)


def build_methods(head_dim: int, presets=PAPER_PRESETS, baselines: bool = True, group: int = 128,
                  reference: bool = False) -> list:
    import kvarn

    from . import eval_quantizers as eq
    from ._ops import get_preset

    methods = [Method("fp16 cache", "fp16", 16, 16, group, 16.0, None)]
    chosen = []
    for preset in presets:  # names or kvarn.Preset objects (custom ones too)
        try:
            chosen.append(get_preset(preset))
        except (TypeError, ValueError) as e:
            raise ValueError(f"presets: {e}") from None
    for p in chosen:
        name = p.name

        def q(k, v, _p=p):
            return kvarn.dequantize_tile(kvarn.quantize_tile(k, v, _p))

        methods.append(Method(f"KVarN {name}", "kvarn", p.kbits, p.vbits, p.group, p.bits_per_element(head_dim), q, p))
        if reference:  # the same algorithm in float64 numpy, to check the native quantiser end to end
            methods.append(Method(f"KVarN float64 ref {name}", "kvarn-ref", p.kbits, p.vbits, p.group,
                                  p.bits_per_element(head_dim),
                                  lambda k, v, a=p.kbits, b=p.vbits: eq.kvarn_ref(k, v, a, b)))
    if baselines:
        rtn = eq.rtn_bits_per_element
        # Baselines at every preset's own bits and tile size, so each preset meets KIVI there (k8v8_g128 or a
        # custom preset too), besides all BASELINE_BITS at `group` (the comparison the published table makes).
        pairs = [(kb, vb, group) for kb, vb in BASELINE_BITS]
        for p in chosen:
            if (p.kbits, p.vbits, p.group) not in pairs:
                pairs.append((p.kbits, p.vbits, p.group))
        for kb, vb, g in pairs:
            tag = f"k{kb}v{vb}_g{g}"
            norm_bits = rtn(kb, vb, g, head_dim, extra_vectors=g + head_dim)  # + kt, vc
            methods += [
                Method(f"KIVI {tag}", "kivi", kb, vb, g, rtn(kb, vb, g, head_dim),
                       lambda k, v, a=kb, b=vb: eq.kivi(k, v, a, b)),
                Method(f"rotation-only {tag}", "rotation-only", kb, vb, g, rtn(kb, vb, g, head_dim),
                       lambda k, v, a=kb, b=vb: eq.rotation_only(k, v, a, b)),
                Method(f"normalisation-only {tag}", "normalisation-only", kb, vb, g, norm_bits,
                       lambda k, v, a=kb, b=vb: eq.normalisation_only(k, v, a, b)),
            ]
        for b in TURBOQUANT_BITS:
            methods.append(Method(f"TurboQuant-style {b}-bit", "turboquant", b, b, group, b + 16.0 / head_dim,
                                  lambda k, v, a=b: eq.turboquant(k, v, a, a)))
    return methods


# ---- pseudo-decode attention -------------------------------------------------------------
def pseudo_decode_mask(T: int, sink: int, group: int, exact_prefix: int = 0, three_copies: bool = False,
                       own_tile_exact: bool = False):
    """Boolean [T, nT] mask over concatenated key copies [quantised | exact fp16 | (exact fp32)] that
    gives query p what the cache holds at p (see the module doc). Queries p < exact_prefix (a
    prefill) see all earlier keys exactly, in full precision when ``three_copies``."""
    import torch

    p = torch.arange(T)[:, None]
    t = torch.arange(T)[None, :]
    n_tiles = max(0, T - sink) // group
    in_tile = (t >= sink) & (t < sink + n_tiles * group)
    tile_end = sink + ((t - sink) // group + 1) * group - 1  # last position of t's tile
    causal = t <= p
    decoding = p >= exact_prefix
    # The cache quantises a tile the moment it fills, so its last token already reads it quantised;
    # own_tile_exact keeps a token's whole own tile exact instead (the looser textbook rule).
    quantised = decoding & in_tile & ((tile_end < p) if own_tile_exact else (tile_end <= p))
    exact = causal & decoding & ~quantised
    prefill = causal & ~decoding
    if three_copies:
        return torch.cat([quantised, exact, prefill], dim=1)
    return torch.cat([quantised, exact | prefill], dim=1)


class PseudoDecode:
    """An attention override (see ``kvarn.integrations.transformers.attention_override``)."""

    def __init__(self, method: Method | None, sink: int, group: int, exact_prefix: int = 0, own_tile_exact=False):
        self.method, self.sink, self.group, self.exact_prefix = method, sink, group, exact_prefix
        self.own_tile_exact = own_tile_exact
        self._mask = {}
        self.seconds_quantising = 0.0

    def __call__(self, module, query, key, value, mask, scaling):
        import torch
        import torch.nn.functional as F

        B, Hq, T, D = query.shape
        if B != 1:
            raise ValueError("query: pseudo-decode runs one sequence at a time")
        if getattr(module, "sliding_window", None):
            # Sliding-window layers (Gemma 3) stay full precision in KVarNCache: exact, with the model's mask.
            from transformers.integrations.sdpa_attention import sdpa_attention_forward

            return sdpa_attention_forward(module, query, key, value, mask, scaling=scaling)[0]
        if self.method is None:  # fp32 reference: plain causal attention
            out = F.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling, enable_gqa=True)
            return out.transpose(1, 2).contiguous()
        k32, v32 = key[0].float(), value[0].float()
        k16, v16 = k32.half().float(), v32.half().float()  # the cache keeps exact tokens in fp16
        G, S = self.group, self.sink
        n = max(0, T - S) // G
        kq, vq = k16.clone(), v16.clone()
        if n and self.method.quantize is not None:
            Hk = k16.shape[0]

            def tiles(x):
                return x[:, S : S + n * G].reshape(Hk, n, G, D).transpose(0, 1).reshape(n * Hk, G, D).numpy()

            t0 = time.perf_counter()
            kh, vh = self.method.quantize(tiles(k16), tiles(v16))
            self.seconds_quantising += time.perf_counter() - t0

            def untiles(x):
                return torch.from_numpy(np.ascontiguousarray(x, np.float32)).reshape(n, Hk, G, D).transpose(0, 1).reshape(Hk, n * G, D)

            kq[:, S : S + n * G], vq[:, S : S + n * G] = untiles(kh), untiles(vh)
        three = self.exact_prefix > 0
        keys = [kq, k16] + ([k32] if three else [])
        vals = [vq, v16] + ([v32] if three else [])
        m = self._mask.get(T)
        if m is None:
            m = self._mask[T] = pseudo_decode_mask(T, S, G, self.exact_prefix, three, self.own_tile_exact)
        out = F.scaled_dot_product_attention(
            query, torch.cat(keys, 1)[None].to(query.dtype), torch.cat(vals, 1)[None].to(query.dtype),
            attn_mask=m, scale=scaling, enable_gqa=True,
        )
        return out.transpose(1, 2).contiguous()


def forward_logits(model, ids, attention):
    """Logits [T, V] float32 of one teacher-forced forward with the given attention override."""
    import torch

    from .integrations.transformers import attention_override, use_kvarn_attention

    use_kvarn_attention(model)
    with torch.no_grad(), attention_override(attention):
        return model(torch.tensor([ids])).logits[0].float()


def scored_rows(text_ids, eval_from: int):
    """The logits rows a run scores and their targets: row p predicts token p + 1, for p from ``eval_from`` to the
    window's second-to-last position."""
    import torch

    return slice(eval_from, len(text_ids) - 1), torch.tensor(text_ids[eval_from + 1 :])


def pseudo_decode_for(method, args, exact_prefix: int = 0):
    """The pseudo-decode attention of ``method`` under the run's --sink and --quantize-on."""
    return PseudoDecode(method, args.sink, method.group, exact_prefix=exact_prefix,
                        own_tile_exact=args.quantize_on == "next")


def decode_path_comparison(ref_rows, dec, pseudo, targets) -> dict:
    """The real decode path against pseudo-decode: ref_rows [S - 1, V] fp32 log-probs of positions P .. P + S - 2;
    dec, pseudo [S, V] logits of positions P .. P + S - 1 (the last predicts past the window: not scored);
    targets [S - 1] the tokens at P + 1 .. P + S - 1."""
    return {
        "kl_cache": compare_logits(ref_rows, dec[:-1], targets)["kl"],
        "kl_pseudo": compare_logits(ref_rows, pseudo[:-1], targets)["kl"],
        "max_abs_logit_diff": float((dec - pseudo).abs().max()),
        "top1_cache_vs_pseudo": float((dec.argmax(-1) == pseudo.argmax(-1)).double().mean()),
    }


def compare_logits(ref_logp, logits, targets):
    """ref_logp, logits [P, V] (positions to score), targets [P]: ppl, KL(ref ‖ method), top-1 agreement."""
    import torch

    logp = torch.log_softmax(logits.double(), -1)
    ref = ref_logp.double()
    kl = (ref.exp() * (ref - logp)).sum(-1)
    nll = -logp.gather(1, targets[:, None])[:, 0]
    return {
        "ppl": float(nll.mean().exp()),
        "kl": float(kl.mean()),
        "kl_max": float(kl.max()),
        "top1": float((logp.argmax(-1) == ref.argmax(-1)).double().mean()),
    }


# ---- generation ---------------------------------------------------------------------------
def _sim_cache_class():
    """A transformers cache that stores dequantised tiles of any Method (baselines in generation)."""
    import torch
    from transformers.cache_utils import Cache, DynamicLayer, DynamicSlidingWindowLayer

    class SimQuantLayer(DynamicLayer):
        def __init__(self, method, sink, quantize_on):
            super().__init__()
            self.method, self.sink = method, sink
            # KVCache's rule: under "next" a full tail stays exact until the next token arrives
            self.full_tail_waits = 1 if quantize_on == "next" else 0

        def update(self, key_states, value_states, *args, **kwargs):
            first = not self.is_initialized or self.keys.numel() == 0
            raw_k = key_states.half().float()
            raw_v = value_states.half().float()
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
                self.raw_k, self.raw_v = raw_k, raw_v
                self.done = 0  # quantised tiles so far
                self.qk = self.qv = key_states.new_zeros((key_states.shape[0], key_states.shape[1], 0, key_states.shape[3]))
            else:
                self.raw_k = torch.cat([self.raw_k, raw_k], -2)
                self.raw_v = torch.cat([self.raw_v, raw_v], -2)
            G, S, T = self.method.group, self.sink, self.raw_k.shape[-2]
            # quantised tiles by now (none for the fp16 cache)
            n = 0 if self.method.quantize is None else max(0, T - S - self.full_tail_waits) // G
            if n > self.done:
                B, H, _, D = self.raw_k.shape
                sl = slice(S + self.done * G, S + n * G)
                m = n - self.done
                kt = self.raw_k[:, :, sl].reshape(B, H, m, G, D).permute(0, 2, 1, 3, 4).reshape(-1, G, D).numpy()
                vt = self.raw_v[:, :, sl].reshape(B, H, m, G, D).permute(0, 2, 1, 3, 4).reshape(-1, G, D).numpy()
                kh, vh = self.method.quantize(kt, vt)

                def back(x):
                    return torch.from_numpy(np.ascontiguousarray(x, np.float32)).reshape(B, m, H, G, D).permute(0, 2, 1, 3, 4).reshape(B, H, m * G, D)

                self.qk = torch.cat([self.qk, back(kh)], -2)
                self.qv = torch.cat([self.qv, back(vh)], -2)
                self.done = n
            end = S + self.done * G
            self.keys = torch.cat([self.raw_k[:, :, :S], self.qk, self.raw_k[:, :, end:]], -2).to(key_states.dtype)
            self.values = torch.cat([self.raw_v[:, :, :S], self.qv, self.raw_v[:, :, end:]], -2).to(key_states.dtype)
            if first:  # prefill attends over its own full-precision K/V, as KVarNCache does
                return key_states, value_states
            return self.keys, self.values

    class SimQuantCache(Cache):
        def __init__(self, config, method, sink, quantize_on):
            types = getattr(config, "layer_types", None) or ["full_attention"] * config.num_hidden_layers
            super().__init__(layers=[
                SimQuantLayer(method, sink, quantize_on) if t == "full_attention"
                else DynamicSlidingWindowLayer(config.sliding_window)
                for t in types
            ])

    return SimQuantCache


def greedy(model, prompt_ids, n_new, cache=None):
    import torch

    with torch.no_grad():
        # generate's cache argument is `cache` in the transformers versions the eval extra pins
        # (>= 5.24); `past_key_values` still works there until 6.0, with a FutureWarning.
        out = model.generate(
            torch.tensor([prompt_ids]), max_new_tokens=n_new, min_new_tokens=n_new, do_sample=False,
            cache=cache, pad_token_id=model.config.eos_token_id,
        )
    return out[0, len(prompt_ids):].tolist()


def identical_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


# ---- real decode path vs pseudo-decode ----------------------------------------------------
def decode_path_logits(model, ids, prefix, steps, preset, sink, quantize_on="fill"):
    """Prefill ``prefix`` tokens into a KVarNCache, then teacher-force ``steps`` tokens one at a time
    through kvarn.attend. Returns (logits [steps, V] for positions prefix .. prefix+steps-1, the cache)."""
    from .integrations.transformers import KVarNCache

    cache = KVarNCache(model.config, preset=preset, sink_tokens=sink, quantize_on=quantize_on)
    return stepwise_logits(model, ids, prefix, steps, cache), cache


def stepwise_logits(model, ids, prefix, steps, cache):
    """Logits [steps, V] of positions prefix .. prefix+steps-1: ``prefix`` tokens prefilled into
    ``cache`` (any transformers cache), then one token per forward (teacher-forced)."""
    import torch

    from .integrations.transformers import cache_kwargs

    kw = cache_kwargs(model, cache)
    rows = []
    with torch.no_grad():
        model(torch.tensor([ids[:prefix]]), use_cache=True, **kw)
        for i in range(prefix, prefix + steps):
            out = model(torch.tensor([[ids[i]]]), use_cache=True, **kw)
            rows.append(out.logits[0, -1].float())
    return torch.stack(rows)


# ---- the command --------------------------------------------------------------------------
def story_ids(tok, text: str, tokens: int, offset: int, n_prompts: int, prompt_tokens: int, gen_tokens: int):
    """(window, prompts) for `kvarn eval`, tokenising the story ``text`` once.

    window: ``assets.verne_token_ids(tok, tokens, offset)``.
    prompts: up to ``n_prompts`` (as many as fit), each BOS where the tokenizer adds one and then
    ``prompt_tokens`` story tokens; the first starts right after the window, each next one
    ``prompt_tokens + gen_tokens`` tokens later."""
    from .integrations import assets  # needs no torch or transformers

    ids = tok(text, add_special_tokens=False)["input_ids"]
    text_ids = assets.verne_token_ids(tok, tokens, offset, story_ids=ids)
    all_ids = assets.verne_token_ids(tok, len(ids), story_ids=ids)  # positions count the BOS
    bos = assets.bos_ids(tok)
    prompts = []
    for i in range(n_prompts):  # prompts from the text after the scored window
        start = offset + tokens + i * (prompt_tokens + gen_tokens)
        if start + prompt_tokens > len(all_ids):
            break
        prompts.append(bos + all_ids[start : start + prompt_tokens])
    return text_ids, prompts


def add_eval_parser(subparsers):
    p = subparsers.add_parser(
        "eval",
        help="accuracy on a real model and real text (needs the eval extra)",
        description="Pseudo-decode perplexity / KL / top-1 vs fp32 for KVarN presets and baselines, "
        "greedy generation vs an fp32 cache, and a real-decode-path check. Writes a table, JSON and a PNG plot.",
    )
    p.add_argument("--model", default="smollm2-135m", help="smollm2-135m (default) or gemma3-270m")
    p.add_argument("--tokens", type=int, default=2048, help="tokens of the Verne text (default 2048)")
    p.add_argument("--offset", type=int, default=0,
                   help="first story token of the window (default 0, the story's start); the greedy prompts "
                   "come from the text after the window")
    p.add_argument("--eval-from", type=int, default=256, help="first scored position (default 256)")
    p.add_argument("--sink", type=int, default=128, help="sink tokens kept exact (default 128)")
    p.add_argument("--presets", default=",".join(PAPER_PRESETS),
                   help="comma-separated kvarn presets; the baselines (KIVI, rotation only, normalisation only) "
                        "run at k4v2, k4v4 and k2v2 with 128-token tiles whichever presets are named (the "
                        "published table), and at each named preset's own bits and tile size "
                        "(--no-baselines to skip them)")
    p.add_argument("--no-baselines", action="store_true", help="KVarN presets only")
    p.add_argument("--reference", action="store_true",
                   help="also run each preset through the float64 numpy implementation of SPEC.md")
    p.add_argument("--quantize-on", choices=("next", "fill"), default="next",
                   help="next (default, the issue's rule): every token reads its whole own tile exact, a tile is "
                   "quantised when the next token arrives (KVCache quantize_on='next'); fill: a tile is "
                   "quantised the moment it fills, so its last token reads it quantised (KVCache default, SPEC §7)")
    p.add_argument("--gen-prompts", type=int, default=3, help="greedy-generation prompts (0: skip)")
    p.add_argument("--gen-prompt-tokens", type=int, default=384, help="tokens per prompt (default 384)")
    p.add_argument("--gen-tokens", type=int, default=48, help="new tokens per prompt (default 48)")
    p.add_argument("--gen-methods", default=None,
                   help="families to generate with: " + ",".join(METHOD_FAMILIES)
                   + " (kvarn-ref with --reference) or all; default " + ",".join(DEFAULT_GEN_FAMILIES)
                   + " (those evaluated)")
    p.add_argument("--decode-steps", type=int, default=192,
                   help="real decode steps (KVarNCache) compared with pseudo-decode per preset (0: skip)")
    p.add_argument("--decode-prefix", type=int, default=None,
                   help="prefill length before those steps (default: 1024, or what --tokens leaves)")
    p.add_argument("--out", default="kvarn_eval", help="output folder for results.json and kl_vs_bits.png")
    p.add_argument("--threads", type=int_at_least(1, MAX_THREADS), default=None, help="torch and kvarn threads")
    p.set_defaults(func=run_eval)
    return p


def _check_args(args):
    if args.decode_prefix is None:  # 1024, or what the window leaves after the steps (a short --tokens)
        args.decode_prefix = max(1, min(1024, args.tokens - args.decode_steps))
    for name in ("tokens", "eval_from", "gen_prompt_tokens", "gen_tokens", "decode_prefix"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be positive, got {getattr(args, name)}")
    for name in ("offset", "sink", "gen_prompts", "decode_steps"):
        if getattr(args, name) < 0:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 0, got {getattr(args, name)}")
    if args.eval_from >= args.tokens - 1:
        raise ValueError(f"--eval-from: {args.eval_from} leaves nothing to score in {args.tokens} tokens")
    import kvarn

    from .integrations.assets import MODELS

    bad = [p for p in args.presets.split(",") if p and p not in kvarn.PRESETS]
    if bad or not args.presets.strip(","):
        raise ValueError(f"--presets: unknown {bad or 'empty list'}; choose from {sorted(kvarn.PRESETS)}")
    if args.model not in MODELS:
        raise ValueError(f"--model: unknown model {args.model!r}; choose one of {sorted(MODELS)}")
    if args.gen_methods not in (None, "all"):  # named explicitly: each must be evaluated in this run
        families = [f for f in args.gen_methods.split(",") if f]
        bad = [f for f in families if f not in METHOD_FAMILIES]
        if bad or not families:
            raise ValueError(f"--gen-methods: unknown {bad or 'empty list'}; "
                             f"choose from {list(METHOD_FAMILIES)} or 'all'")
        absent = [f for f in families if (f == "kvarn-ref" and not args.reference)
                  or (args.no_baselines and f in BASELINE_FAMILIES)]
        if absent:
            raise ValueError(f"--gen-methods: {absent} not evaluated in this run "
                             "(kvarn-ref needs --reference; baselines are off with --no-baselines)")
    if args.decode_steps == 1:
        raise ValueError("--decode-steps: use 0 (skip) or at least 2 (one scored position needs a next token)")
    if args.decode_steps and args.decode_prefix + args.decode_steps > args.tokens:
        raise ValueError(f"--decode-prefix + --decode-steps: {args.decode_prefix} + {args.decode_steps} must not exceed "
                         f"--tokens ({args.tokens}); --decode-steps 0 skips the decode-path check")
    # A run in which nothing is ever quantised reports fp16-level KL for every method, which reads as a pass.
    group = max(kvarn.PRESETS[p].group for p in args.presets.split(",") if p)
    if not args.no_baselines:
        group = max(group, 128)  # the baselines' tile
    if args.tokens - 2 < args.sink + group:
        raise ValueError(f"--tokens, --sink: no scored position sees a quantised tile ({args.sink} sink tokens and a "
                         f"{group}-token tile need --tokens >= {args.sink + group + 2}); every method would equal "
                         "the fp16 cache")
    if args.gen_prompts and args.gen_prompt_tokens + args.gen_tokens < args.sink + group + 2:
        raise ValueError(f"--gen-prompt-tokens, --gen-tokens: {args.gen_prompt_tokens} + {args.gen_tokens} tokens never "
                         f"reach a quantised tile after {args.sink} sink tokens (need >= {args.sink + group + 2}); "
                         "--gen-prompts 0 skips generation")
    _check_out_folder(args.out)


def _check_out_folder(path: str) -> None:
    """The results are written after the whole run: a folder that cannot be made or written must fail
    now. Creates nothing: the nearest existing entry on the path, walked up as written (``..`` after a
    file is not a folder; a dangling or looping symlink exists but is not one), must be a writable folder."""
    if not path:
        raise ValueError("--out: empty path")
    full = probe = os.path.join(os.getcwd(), path)
    while not os.path.lexists(probe) and os.path.dirname(probe) != probe:
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe):
        raise ValueError(f"--out: cannot make the folder {path!r}: {probe!r} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as e:
        # The errno alone misleads: /proc exists, yet creating a file there gives "No such file or directory".
        raise ValueError(f"--out: cannot write the results into {path!r}: {probe!r} is not writable (creating a "
                         f"file there fails: {e.strerror or e})") from None
    # The folders still to be made: a name longer than the file system takes fails only in os.makedirs, at the end.
    try:
        name_max = os.pathconf(probe, "PC_NAME_MAX")
    except (OSError, ValueError, AttributeError):  # not known here (or no pathconf): os.makedirs will say
        return
    for name in os.path.relpath(full, probe).split(os.sep):
        if name not in (os.curdir, os.pardir) and len(os.fsencode(name)) > name_max:
            raise ValueError(f"--out: cannot make the folder {path!r}: its part {name[:40]!r}... is "
                             f"{len(os.fsencode(name))} bytes long, more than the {name_max} a name may have in {probe!r}")


def run_eval(args) -> int:
    _check_args(args)
    try:
        import torch
        from tqdm.auto import tqdm
    except ImportError as e:
        raise RuntimeError(f"kvarn eval needs the eval extra ({e}): pip install 'kvarn[eval]'") from e
    import kvarn

    from .integrations import assets

    if args.threads:
        torch.set_num_threads(args.threads)
        kvarn.set_num_threads(args.threads)
    presets = [p for p in args.presets.split(",") if p]
    t_start = time.time()
    model, tok = assets.load_model(args.model)
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    methods = build_methods(head_dim, presets, baselines=not args.no_baselines, reference=args.reference)
    gen_families = (set(m.family for m in methods) if args.gen_methods == "all"
                    else set(DEFAULT_GEN_FAMILIES) if args.gen_methods is None else set(args.gen_methods.split(",")))
    try:
        text_ids, prompts = story_ids(tok, assets.verne_text(), args.tokens, args.offset, args.gen_prompts,
                                      args.gen_prompt_tokens, args.gen_tokens)
    except ValueError as e:
        raise ValueError(f"--tokens, --offset: {e}") from None
    if len(prompts) < args.gen_prompts:
        print(f"kvarn eval: only {len(prompts)} of --gen-prompts {args.gen_prompts} prompts fit in the story after the "
              f"window", file=sys.stderr)

    gen_methods = [m for m in methods if m.family in gen_families]
    dec_presets = [m for m in methods if m.family == "kvarn"] if args.decode_steps else []
    bar = tqdm(total=1 + len(methods) + (1 + len(gen_methods)) * bool(prompts) + len(dec_presets), desc="kvarn eval")

    # 1. fp32 reference and every method, pseudo-decode.
    sl, targets = scored_rows(text_ids, args.eval_from)
    bar.set_postfix_str("fp32")
    ref_logits = forward_logits(model, text_ids, PseudoDecode(None, args.sink, 128))
    ref_logp = torch.log_softmax(ref_logits[sl].double(), -1).float()
    fp32 = compare_logits(ref_logp, ref_logits[sl], targets)
    del ref_logits
    bar.update()
    for m in methods:
        bar.set_postfix_str(m.name)
        t0 = time.time()
        att = pseudo_decode_for(m, args)
        logits = forward_logits(model, text_ids, att)
        m.results["pseudo_decode"] = compare_logits(ref_logp, logits[sl], targets)
        m.results["pseudo_decode"]["seconds"] = round(time.time() - t0, 1)
        del logits
        bar.update()

    # 2. Greedy generation vs an fp32 cache.
    gen = {}
    if prompts:
        bar.set_postfix_str("generate fp32")
        ref_gen = [greedy(model, p, args.gen_tokens) for p in prompts]
        bar.update()
        SimQuantCache = _sim_cache_class()
        from .integrations.transformers import KVarNCache

        for m in gen_methods:
            bar.set_postfix_str(f"generate {m.name}")
            outs = []
            for p in prompts:
                if m.family == "kvarn":
                    cache = KVarNCache(model.config, preset=m.preset, sink_tokens=args.sink,
                                       quantize_on=args.quantize_on)
                else:
                    cache = SimQuantCache(cfg, m, args.sink, args.quantize_on)
                outs.append(greedy(model, p, args.gen_tokens, cache))
            m.results["generation"] = {
                "identical_prefix": [identical_prefix(a, b) for a, b in zip(outs, ref_gen)],
                "cache": ("KVarNCache (kvarn.attend)" if m.family == "kvarn" else "fp16 (nothing quantised)"
                          if m.quantize is None else "simulated (dequantised tiles)"),
            }
            bar.update()
        gen = {"prompts": len(prompts), "prompts_asked": args.gen_prompts, "prompt_tokens": args.gen_prompt_tokens,
               "new_tokens": args.gen_tokens,
               "fp32_texts": [tok.decode(g) for g in ref_gen]}

    # 3. Real decode path vs pseudo-decode (same prefill, same positions).
    if dec_presets:
        P, S = args.decode_prefix, args.decode_steps
        ids = text_ids[: P + S]
        # Row j of every block below is position P + j, predicting token P + j + 1 (scored for j < S - 1).
        ref_rows = torch.log_softmax(forward_logits(model, ids, PseudoDecode(None, args.sink, 128))[P:].double(), -1)
        ref_rows = ref_rows.float()[:-1]
        tg = torch.tensor(ids[P + 1 :])
        for m in dec_presets:
            bar.set_postfix_str(f"decode path {m.preset.name}")
            t0 = time.time()
            dec, cache = decode_path_logits(model, ids, P, S, m.preset, args.sink, args.quantize_on)
            dec_seconds = time.time() - t0
            pseudo = forward_logits(model, ids, pseudo_decode_for(m, args, exact_prefix=P))[P:]
            m.results["decode_path"] = {
                "prefix": P,
                "steps": S,
                **decode_path_comparison(ref_rows, dec, pseudo, tg),
                "compression_ratio": cache.compression_ratio,
                "seconds_per_step": dec_seconds / S,
            }
            bar.update()
    bar.close()

    result = {
        "model": args.model,
        "head_dim": head_dim,
        "tokens": args.tokens,
        "offset": args.offset,
        "eval_from": args.eval_from,
        "sink": args.sink,
        "quantize_on": args.quantize_on,
        "text": "Jules & Michel Verne, In the Year 2889 (reasoning-gym wheel)",
        "fp32": fp32,
        "generation": gen,
        "methods": [
            {"name": m.name, "family": m.family, "kbits": m.kbits, "vbits": m.vbits, "group": m.group,
             "bits_per_element": m.bits_per_element, "preset": m.preset and m.preset.name, **m.results}
            for m in methods
        ],
        "torch": torch.__version__,
        "kvarn_isa": kvarn.active_isa(),
        "seconds": round(time.time() - t_start, 1),
    }
    os.makedirs(args.out, exist_ok=True)
    json_path = os.path.join(args.out, "results.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1)
    print(format_table(result))
    png = os.path.join(args.out, "kl_vs_bits.png")
    plot_kl_vs_bits(result, png)
    print(f"\nwrote {json_path} and {png} ({result['seconds']:.0f} s)")
    return 0


def format_table(result) -> str:
    fp = result["fp32"]
    lines = [
        f"{result['model']}, {result['tokens']} tokens of the Verne text"
        f"{' from story token %d' % result['offset'] if result.get('offset') else ''}, scored from position "
        f"{result['eval_from']}, sink {result['sink']}; fp32 perplexity {fp['ppl']:.3f}",
        "",
        "| method | bits/elem | ppl | Δppl | KL(fp32‖m) | top-1 | gen. identical prefix | decode path KL (cache / pseudo) |",
        "|---|---:|---:|---:|---:|---:|---|---|",
    ]
    for m in result["methods"]:
        r = m.get("pseudo_decode", {})
        g = m.get("generation")
        d = m.get("decode_path")
        gen = f"{np.mean(g['identical_prefix']):.1f} {g['identical_prefix']}" if g else ""
        dec = f"{d['kl_cache']:.4f} / {d['kl_pseudo']:.4f}" if d else ""
        lines.append(
            f"| {m['name']} | {m['bits_per_element']:.3f} | {r['ppl']:.3f} | {100 * (r['ppl'] / fp['ppl'] - 1):+.2f} % "
            f"| {r['kl']:.4f} | {100 * r['top1']:.1f} % | {gen} | {dec} |"
        )
    return "\n".join(lines)


def _place_labels(ax, points, labels, first, marker_size):
    """Writes each label next to its point where its box overlaps no other label, no marker, not
    the legend and not the axes' edge: the first free spot on rings of growing radius around the
    point (a thin line back to the point from the outer rings), the least-overlapping one where none
    is free. Points in data coordinates; labels whose first[i] is true choose their spots first.
    Returns the labels' boxes in display coordinates, in the points' order."""
    from matplotlib.text import Text
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()  # the transforms and text sizes, as they will be saved
    renderer = fig.canvas.get_renderer()
    frame = ax.get_window_extent(renderer)
    radius = (marker_size ** 0.5) / 2 * fig.dpi / 72  # a scatter marker's half-width, display units
    markers = [Bbox.from_extents(x - radius, y - radius, x + radius, y + radius)
               for x, y in ax.transData.transform(points)]
    if ax.get_legend() is not None:
        markers.append(ax.get_legend().get_window_extent(renderer))

    def overlap(a, b):
        w = min(a.x1, b.x1) - max(a.x0, b.x0)
        h = min(a.y1, b.y1) - max(a.y0, b.y0)
        return w * h if w > 0 and h > 0 else 0.0

    spots = []  # (dx, dy) in points; ring by ring, right before left, above before below
    for r in (5, 10, 16, 24, 34, 46):
        for dx, dy in ((1, 0.6), (1, -0.6), (-1, 0.6), (-1, -0.6), (0, 1), (0, -1), (1, 0), (-1, 0),
                       (0.5, 1), (0.5, -1), (-0.5, 1), (-0.5, -1)):
            spots.append((r * dx, r * dy))

    def gap(box, x, y):  # distance from a point to a box, display units
        return math.hypot(max(box.x0 - x, 0.0, x - box.x1), max(box.y0 - y, 0.0, y - box.y1))

    centres = ax.transData.transform(points)
    placed, boxes = [], [None] * len(points)
    for i in sorted(range(len(points)), key=lambda i: not first[i]):
        (px, py), text = points[i], labels[i]
        best = None
        for dx, dy in spots:
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            far = max(abs(dx), abs(dy)) > 9
            ann = ax.annotate(text, (px, py), xytext=(dx, dy), textcoords="offset points", fontsize=7, ha=ha, va=va,
                              arrowprops=dict(arrowstyle="-", lw=0.6, color="0.35", shrinkA=0, shrinkB=4) if far else None)
            ann.update_positions(renderer)
            box = Text.get_window_extent(ann, renderer)  # the text alone, not its line back to the point
            outside = box.width * box.height - overlap(box, frame)
            cost = outside + sum(overlap(box, b) for b in placed + markers)
            # a label nearer another point than its own reads as that point's (a line is drawn only when far)
            own = gap(box, *centres[i])
            if not far and any(gap(box, x, y) < own + 2 * radius for j, (x, y) in enumerate(centres) if j != i):
                cost += box.width * box.height / 4
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, ann, box)
            else:
                ann.remove()
            if cost == 0:
                break
        placed.append(best[2])
        boxes[i] = best[2]
    return boxes


def plot_kl_vs_bits(result, path):
    """Writes the KL-vs-bits scatter plot (one point per method) to path; returns the label boxes
    (display coordinates; see _place_labels)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    style = {"kvarn": ("o", "C0"), "kvarn-ref": ("x", "C9"), "kivi": ("s", "C3"), "rotation-only": ("^", "C2"),
             "normalisation-only": ("v", "C4"), "turboquant": ("D", "C1"), "fp16": ("*", "k")}
    marker_size = 55
    fig, ax = plt.subplots(figsize=(9, 6), dpi=110)
    seen = set()
    points, labels, families = [], [], []
    for m in result["methods"]:
        if m["family"] == "fp16":
            continue
        marker, color = style[m["family"]]
        kl = max(m["pseudo_decode"]["kl"], 1e-6)
        ax.scatter(m["bits_per_element"], kl, marker=marker, color=color, s=marker_size,
                   label=None if m["family"] in seen else m["family"])
        seen.add(m["family"])
        label = m["name"].replace("KVarN ", "").replace("rotation-only ", "rot ").replace("normalisation-only ", "norm ")
        points.append((m["bits_per_element"], kl))
        families.append(m["family"])
        labels.append(label.replace("TurboQuant-style ", "TQ "))
    ax.set_yscale("log")
    ax.margins(x=0.15, y=0.15)  # room for the labels of the outermost points
    ax.set_xlabel("bits per element (codes + scales, per tile)")
    ax.set_ylabel("KL(fp32 ‖ method), nats/token")
    ax.set_title(f"{result['model']}: pseudo-decode on {result['tokens']} tokens (Verne), from pos {result['eval_from']}")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()  # before the labels: it would move the axes under them
    boxes = _place_labels(ax, points, labels, [f == "kvarn" for f in families], marker_size)
    fig.savefig(path, dpi=fig.dpi)
    plt.close(fig)
    return boxes


def main(argv=None) -> int:
    """``python -m kvarn.eval`` (the same as ``kvarn eval``, errors included)."""
    from .cli import main as cli_main

    return cli_main(["eval", *(argv if argv is not None else sys.argv[1:])])


if __name__ == "__main__":
    raise SystemExit(main())
