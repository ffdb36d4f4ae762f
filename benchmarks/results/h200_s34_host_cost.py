# Host cost per call of PagedKVCache.attend / append on one stream (what the stream tracking adds):
# small cache, so the GPU finishes each call before the host issues the next one.
import sys, time, numpy as np, torch
import kvarn.cuda as kc
rng = np.random.default_rng(0)
c = kc.PagedKVCache(8, 128, max_seqs=8, max_seq_len=4096)
ids = [c.add_sequence() for _ in range(8)]
c.append(ids, torch.randn(8, 1000, 8, 128, device="cuda", dtype=torch.float16),
         torch.randn(8, 1000, 8, 128, device="cuda", dtype=torch.float16))
q = torch.randn(8, 32, 128, device="cuda", dtype=torch.float16)
out = torch.empty_like(q)
plan = c.plan(ids)
k1 = torch.randn(8, 8, 128, device="cuda", dtype=torch.float16)
def per_call(fn, n=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6
res = {
    "attend(plan, validate=False)": per_call(lambda: c.attend(q, plan=plan, out=out, validate=False)),
    "attend(seq_ids, validate=False)": per_call(lambda: c.attend(q, ids, out=out, validate=False)),
    "attend(seq_ids)": per_call(lambda: c.attend(q, ids, out=out), 500),
}
def app():
    c.append(ids, k1, k1, validate=False)
    if c.length(ids[0]) > 3900:
        for s in ids: c.truncate(s, 1000)
res["append 1 token x 8 seqs, validate=False"] = per_call(app, 1000)
print(sys.argv[1], " | ".join(f"{k}: {v:.1f} us" for k, v in res.items()), flush=True)
