"""Inside SmolLM2 (torch on 2 threads): KVarNCache's step with kvarn's pool on 1 against 2 threads, rounds alternating.
Median step and median cache + attention time (KVarNLayer.update + attend_pending) over 32 greedy steps per run."""
import pathlib, statistics, sys, time
import torch, kvarn
from kvarn.integrations import assets
from kvarn.integrations.transformers import KVarNCache, KVarNLayer, cache_kwargs, restore_attention

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))
from bench_generate import Timers  # the wall time of the wrapped cache + attention calls

torch.set_num_threads(2)
model, tok = assets.load_model("smollm2-135m")
contexts = [int(c) for c in (sys.argv[1] if len(sys.argv) > 1 else "1024,4096").split(",")]
ids = assets.verne_token_ids(tok, max(contexts))
timers = Timers()
for name in ("update", "attend_pending"):
    timers.wrap(KVarNLayer, name)

def run(ctx, threads, steps=32):
    kvarn.set_num_threads(threads)
    cache = KVarNCache(model.config)
    kw = cache_kwargs(model, cache)
    with torch.inference_mode():
        nxt = model(torch.tensor([ids[:ctx]]), use_cache=True, **kw).logits[:, -1:].argmax(-1)
        st, ins = [], []
        for _ in range(steps):
            timers.seconds = 0.0
            t = time.perf_counter()
            logits = model(nxt, use_cache=True, **kw).logits
            st.append(time.perf_counter() - t); ins.append(timers.seconds)
            nxt = logits[:, -1:].argmax(-1)
    restore_attention(model)
    return statistics.median(st) * 1e3, statistics.median(ins) * 1e3

for ctx in contexts:
    for rnd in range(3):
        for threads in ((1, 2) if rnd % 2 == 0 else (2, 1)):
            s, i = run(ctx, threads)
            print(f"ctx {ctx} round {rnd} kvarn threads {threads}: step {s:.2f} ms, cache+attention {i:.2f} ms", flush=True)
