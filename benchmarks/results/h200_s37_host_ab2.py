# Host time to issue PagedKVCache calls, the previous cuda.py (f88d397, loaded as kvarn.cuda_old, same
# .s15/old_cuda.py = git show f88d397:src/kvarn/cuda.py; run from the repository root.
# _cuda) against the current one, alternating 10 rounds: 100 calls issued without a sync in between
# (the GPU queue does not fill), timed to the last return; B 8, Hk 8, D 128, Hq 32, fp16.
import importlib.util, sys, time, numpy as np, torch
import kvarn.cuda as new
spec = importlib.util.spec_from_file_location("kvarn.cuda_old", ".s15/old_cuda.py")
old = importlib.util.module_from_spec(spec); sys.modules["kvarn.cuda_old"] = old; spec.loader.exec_module(old)
q = torch.randn(8, 32, 128, device="cuda", dtype=torch.float16); out = torch.empty_like(q)
k1 = torch.randn(8, 8, 128, device="cuda", dtype=torch.float16)
def setup(m, n):
    c = m.PagedKVCache(8, 128, max_seqs=8, max_seq_len=n + 64)
    ids = [c.add_sequence() for _ in range(8)]
    for s in ids:
        kv = torch.randn(1, n, 8, 128, device="cuda", dtype=torch.float16)
        c.append([s], kv, kv)
    torch.cuda.synchronize()
    return c, ids
def issue(fn, n=100):
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    dt = time.perf_counter() - t; torch.cuda.synchronize(); return dt / n * 1e6
for ctx in (1000, 32000):
    caches = {v: setup(m, ctx) for v, m in (("old", old), ("new", new))}
    res = {v: {} for v in caches}
    for r in range(10):
        for v, (c, ids) in caches.items():
            def app():
                c.append(ids, k1, k1, validate=False)
                if c.length(ids[0]) >= ctx + 20:
                    for s in ids: c.truncate(s, ctx)
            for name, fn in (("attend(seq_ids, validate=False)", lambda: c.attend(q, ids, out=out, validate=False)),
                             ("append 1 token x 8, validate=False", app)):
                res[v].setdefault(name, []).append(issue(fn))
            for s in ids: c.truncate(s, ctx)
    for name in res["old"]:
        o, n = np.array(res["old"][name]), np.array(res["new"][name])
        print(f"ctx {ctx:5d} {name:36s} old min {o.min():6.1f} med {np.median(o):6.1f} | new min {n.min():6.1f} "
              f"med {np.median(n):6.1f} us to issue", flush=True)
