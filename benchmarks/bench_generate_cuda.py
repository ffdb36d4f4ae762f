"""End-to-end decoding on a GPU: transformers with KVarNCache(device="cuda") against its bf16 caches.

    python benchmarks/bench_generate_cuda.py [--shape llama8b] [--points 16384x1,32768x1,8192x8,32768x4] [--check-host 4096x1]
                                             [--steps 32] [--rounds 2] [--general-path] [--out results/generate_cuda.json]

The model has a real model's shape and random bf16 weights (no weights can be downloaded on the lent machine):
``llama8b`` is Llama-3.1-8B's (32 layers, hidden 4096, Hq 32 / Hk 8, head_dim 128, MLP 14336, vocab 128256),
``llama1b`` Llama-3.2-1B's (16 layers, hidden 2048, Hq 32 / Hk 8, head_dim 64). Per point (context x batch): a
random prompt of ``context`` tokens per row is prefilled, then ``steps`` tokens (each row's argmax) are decoded one
forward at a time, each forward timed to a synchronised end. Caches, alternating round by round in one process:
- ``dynamic``: transformers' DynamicCache (bf16, grown by torch.cat every step) + SDPA;
- ``static``: StaticCache (bf16, preallocated to context + steps tokens; SDPA over all of them, the unfilled ones
  masked) + SDPA;
- ``kvarn``: KVarNCache(device="cuda") (k4v2_g128): each step appends to each layer's PagedKVCache and runs kvarn's
  CUDA decode attention (one append_attend per layer; its checks run on the GPU and are read once per forward);
- ``kvarn-general`` (with --general-path): the same with append_attend's one-token decode path off
  (kvarn.cuda._DECODE_ROWS = 0), every step through its general path: what the decode path saves end to end.
Every cache is fed the same tokens (the dynamic cache's greedy ones, teacher-forced). Reported per point and cache:
the median and minimum forward time per step, the cache's bytes (kvarn: the tokens' bytes, KVarNCache.nbytes; bf16:
the K/V tensors), and its logits against the dynamic cache's for the same inputs (median relative L2 over steps
and rows; how often the argmax agrees). Random weights make the network chaotic: bf16 rounding alone moves
StaticCache's logits by a few per cent, and a quantised cache's by far more, so these columns measure no model's
quality; --check-host compares the GPU cache with the host cache (the same records, attention on the CPU) instead.
The rest of a forward (projections, MLP, lm_head, and transformers' own per-layer Python) is the same for every
cache.
"""
import argparse
import json
import statistics
import time

import torch

SHAPES = {
    "llama8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=128, vocab_size=128256),
    "llama1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                    num_key_value_heads=8, head_dim=64, vocab_size=128256),
}


def build_model(shape):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(**SHAPES[shape], max_position_embeddings=131072, rope_theta=500000.0, torch_dtype="bfloat16")
    torch.manual_seed(0)
    torch.set_default_dtype(torch.bfloat16)  # built in bf16: an 8B model's fp32 weights would take 32 GB first
    try:
        with torch.device("cuda"):
            model = LlamaForCausalLM(cfg).eval()
    finally:
        torch.set_default_dtype(torch.float32)
    model.config._attn_implementation = "sdpa"
    return model


def make_cache(kind, model, context, batch, steps):
    from transformers import DynamicCache, StaticCache

    if kind == "kvarn-host":  # the packed cache in host memory, attention on the CPU: the GPU cache's reference
        from kvarn.integrations.transformers import KVarNCache, restore_attention

        restore_attention(model)
        return KVarNCache(model.config)
    if kind == "dynamic":
        return DynamicCache(config=model.config)
    if kind == "static":
        return StaticCache(config=model.config, max_cache_len=context + steps)
    from kvarn.integrations.transformers import KVarNCache, restore_attention

    restore_attention(model)  # a previous kvarn round's switch; KVarNCache switches it again
    return KVarNCache(model.config, device="cuda", max_batch_size=batch, max_cache_len=context + steps)


def cache_bytes(kind, cache):
    if kind.startswith("kvarn"):
        return cache.nbytes
    total = 0
    for layer in cache.layers:
        for t in (getattr(layer, "keys", None), getattr(layer, "values", None)):
            if isinstance(t, torch.Tensor):
                total += t.numel() * t.element_size()
    return total


def run(model, kind, prompt, steps, fed=None, layer_outputs=None):
    """Prefill, then `steps` timed one-token forwards. Each step feeds the previous step's argmax, or with `fed`
    (the dynamic cache's tokens) fed[i], so that every cache's logits answer the same inputs. With `layer_outputs`
    (a list), each layer's attention output at the first one-token step is appended to it."""
    import kvarn.cuda

    decode_rows = kvarn.cuda._DECODE_ROWS
    if kind == "kvarn-general":
        kvarn.cuda._DECODE_ROWS = 0
    try:
        return _run(model, kind, prompt, steps, fed, layer_outputs)
    finally:
        kvarn.cuda._DECODE_ROWS = decode_rows


def _run(model, kind, prompt, steps, fed, layer_outputs):
    from kvarn.integrations.transformers import cache_kwargs, restore_attention

    batch, context = prompt.shape
    cache = make_cache(kind, model, context, batch, steps)
    times, tokens, logits = [], [], []
    hooks = []
    if layer_outputs is not None:
        def keep(module, args, output):
            if output[0].shape[1] == 1 and len(layer_outputs) < len(model.model.layers):
                layer_outputs.append(output[0].float().clone())
        hooks = [layer.self_attn.register_forward_hook(keep) for layer in model.model.layers]
    with torch.inference_mode():
        out = model(prompt, **cache_kwargs(model, cache), logits_to_keep=1)
        nxt = out.logits[:, -1].argmax(-1, keepdim=True) if fed is None else fed[0]
        torch.cuda.synchronize()
        for i in range(steps):
            tokens.append(nxt)
            t0 = time.perf_counter()
            out = model(nxt, **cache_kwargs(model, cache), logits_to_keep=1)
            nxt = out.logits[:, -1].argmax(-1, keepdim=True)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            logits.append(out.logits[:, -1].float())
            if fed is not None and i + 1 < steps:
                nxt = fed[i + 1]
    for h in hooks:
        h.remove()
    nbytes = cache_bytes(kind, cache)
    del cache, out
    if kind.startswith("kvarn"):
        restore_attention(model)
    torch.cuda.empty_cache()
    return times, tokens, torch.stack(logits), nbytes


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--shape", default="llama8b", choices=sorted(SHAPES))
    ap.add_argument("--points", default="16384x1,32768x1,8192x8,32768x4")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default=None)
    ap.add_argument("--general-path", action="store_true",
                    help="also time kvarn-general: KVarNCache with append_attend's one-token decode path off")
    ap.add_argument("--check-host", default=None, metavar="CONTEXTxBATCH",
                    help="first, at this point: the GPU cache's logits against the host cache's (KVarNCache(config), "
                         "the same records, attention on the CPU) and both against DynamicCache's, over 8 steps "
                         "teacher-forced with DynamicCache's tokens")
    args = ap.parse_args()
    model = build_model(args.shape)
    print(f"{torch.cuda.get_device_name()}, shape {args.shape}, {args.steps} steps, {args.rounds} rounds")
    if args.check_host:
        context, batch = (int(x) for x in args.check_host.split("x"))
        g = torch.Generator().manual_seed(context + batch)
        prompt = torch.randint(10, SHAPES[args.shape]["vocab_size"], (batch, context), generator=g).cuda()
        outs = {k: [] for k in ("dynamic", "kvarn-host", "kvarn")}
        _, fed, dyn, _ = run(model, "dynamic", prompt, 8, layer_outputs=outs["dynamic"])
        _, _, host, _ = run(model, "kvarn-host", prompt, 8, fed, layer_outputs=outs["kvarn-host"])
        _, _, gpu, _ = run(model, "kvarn", prompt, 8, fed, layer_outputs=outs["kvarn"])
        # layer 0's attention output answers the same inputs in every cache (later layers' inputs drift apart)
        for name, a, b in (("GPU cache against host cache", "kvarn", "kvarn-host"),
                           ("host cache against dynamic", "kvarn-host", "dynamic")):
            rel = [float((x - y).norm() / y.norm()) for x, y in zip(outs[a], outs[b])]
            print(f"{context} x {batch}: {name}: first step's attention output, relative L2 per layer "
                  + " ".join(f"{e:.1e}" for e in rel), flush=True)
        for name, a, b in (("GPU cache against host cache", gpu, host), ("host cache against dynamic", host, dyn),
                           ("GPU cache against dynamic", gpu, dyn)):
            err = (a - b).norm(dim=-1) / b.norm(dim=-1)  # [steps, batch]
            agree = float((a.argmax(-1) == b.argmax(-1)).float().mean())
            print(f"{context} x {batch}: {name}: logits relative L2 median {float(err.median()):.2e} max "
                  f"{float(err.max()):.2e}, argmax agrees {100 * agree:.0f} %; per step "
                  + " ".join(f"{float(e):.1e}" for e in err.median(dim=1).values), flush=True)
    results = []
    for point in filter(None, args.points.split(",")):
        context, batch = (int(x) for x in point.split("x"))
        g = torch.Generator().manual_seed(context + batch)
        prompt = torch.randint(10, SHAPES[args.shape]["vocab_size"], (batch, context), generator=g).cuda()
        kinds = ("dynamic", "static", "kvarn") + (("kvarn-general",) if args.general_path else ())
        per = {k: dict(times=[], nbytes=0) for k in kinds}
        for r in range(args.rounds):
            fed = ref_logits = None
            # dynamic first (its tokens feed the others); the kvarn pair swaps places round by round
            for kind in kinds if r % 2 == 0 else kinds[:2] + kinds[2:][::-1]:
                times, tokens, logits, nbytes = run(model, kind, prompt, args.steps, fed)
                if kind == "dynamic":
                    fed, ref_logits = tokens, logits
                per[kind]["times"] += times[1:]  # the first step warms up
                per[kind]["nbytes"] = nbytes
                # against the dynamic cache's logits for the same inputs: relative L2 per step and row, and how often
                # the argmax agrees (random weights make near-ties common: a bf16 rounding flips some)
                err = ((logits - ref_logits).norm(dim=-1) / ref_logits.norm(dim=-1)).flatten()
                per[kind]["error"] = float(err.median())
                per[kind]["argmax"] = float((logits.argmax(-1) == ref_logits.argmax(-1)).float().mean())
        for kind, r in per.items():
            row = dict(context=context, batch=batch, cache=kind, median_ms=1e3 * statistics.median(r["times"]),
                       min_ms=1e3 * min(r["times"]), cache_mb=r["nbytes"] / 1e6, logits_error=r["error"],
                       argmax_agrees=r["argmax"])
            results.append(row)
            print(f"{context:6d} x {batch:2d} {kind:13s} median {row['median_ms']:8.2f} ms  min {row['min_ms']:8.2f} ms"
                  f"  cache {row['cache_mb']:9.1f} MB  logits vs dynamic's {row['logits_error']:.2e}, argmax agrees "
                  f"{100 * row['argmax_agrees']:.0f} %", flush=True)
        for kind in ("dynamic", "static") + (("kvarn-general",) if args.general_path else ()):
            a = [r for r in results if (r["context"], r["batch"]) == (context, batch)]
            base = next(r for r in a if r["cache"] == kind)["median_ms"]
            kv = next(r for r in a if r["cache"] == "kvarn")["median_ms"]
            print(f"{'':12s}kvarn / {kind}: {kv / base:.3f} of the time per step")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), shape=args.shape, steps=args.steps,
                           rounds=args.rounds, results=results), f, indent=1)


if __name__ == "__main__":
    main()
