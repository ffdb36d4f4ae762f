"""Prompt-lookup (assisted) decoding with KVarNCache on SmolLM2 (fp32, 2 torch threads): wall time of generate(), 64
new tokens after a `ctx`-token Verne prompt, assisted (prompt_lookup_num_tokens=10, crop window 256) and plain greedy
in turn, three rounds after a warm-up; tokens compared. Fifty-second session: run against a build of ff5919b (the
integration attending a multi-token step token by token) and of this session's tree, alternating processes
(assisted_generate.log: the first three lines of each pair of runs are ff5919b's, site_old)."""
import sys, time, torch, kvarn
from kvarn.integrations import assets
from kvarn.integrations.transformers import KVarNCache
torch.manual_seed(0)
torch.set_num_threads(2)
model, tok = assets.load_model("smollm2-135m")
ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
ids = assets.verne_token_ids(tok, ctx)
prompt = torch.tensor([ids[:ctx]])
def gen(**kw):
    cache = KVarNCache(model.config, crop_window=256)
    with torch.no_grad():
        t = time.perf_counter()
        out = model.generate(prompt, max_new_tokens=64, min_new_tokens=64, do_sample=False, cache=cache,
                             pad_token_id=model.config.eos_token_id, **kw)
        return time.perf_counter() - t, out[0, ctx:].tolist()
gen(prompt_lookup_num_tokens=10)
for r in range(3):
    ta, a = gen(prompt_lookup_num_tokens=10)
    tp, p = gen()
    print(f"{kvarn.__file__.split('/')[2]} ctx {ctx}: assisted {ta:.2f} s, plain greedy {tp:.2f} s, same tokens {a == p}", flush=True)
