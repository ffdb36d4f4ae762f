# In-process A/B of PagedKVCache's host cost per call: the previous cuda.py (loaded as kvarn.cuda_old,
# same _cuda) against the new one, alternating 10 rounds; plus the two runtime calls the new one adds.
# OLD_CUDA=.s15/prev_cuda.py (s41: this session's cuda.py before the torch-stream accessor); unset, .s15/old_cuda.py
# (s36, s42: git show f88d397:src/kvarn/cuda.py). Run from the repository root.
import importlib.util, sys, time, numpy as np, torch
import kvarn, kvarn.cuda as new
import os; spec = importlib.util.spec_from_file_location("kvarn.cuda_old", os.environ.get("OLD_CUDA", ".s15/old_cuda.py"))
old = importlib.util.module_from_spec(spec); sys.modules["kvarn.cuda_old"] = old; spec.loader.exec_module(old)
from kvarn import _cuda
def setup(m):
    c = m.PagedKVCache(8, 128, max_seqs=8, max_seq_len=4096)
    ids = [c.add_sequence() for _ in range(8)]
    g = torch.Generator(device="cuda").manual_seed(0)
    kv = torch.randn(8, 1000, 8, 128, device="cuda", dtype=torch.float16, generator=g)
    c.append(ids, kv, kv)
    return c, ids, c.plan(ids)
q = torch.randn(8, 32, 128, device="cuda", dtype=torch.float16); out = torch.empty_like(q)
k1 = torch.randn(8, 8, 128, device="cuda", dtype=torch.float16)
def per_call(fn, n):
    for _ in range(20): fn()
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t) / n * 1e6
caches = {"old": setup(old), "new": setup(new)}
def calls(c, ids, plan):
    def app():
        c.append(ids, k1, k1, validate=False)
        if c.length(ids[0]) >= 1020:  # inside the tail: truncate never cuts a tile
            for s in ids: c.truncate(s, 1000)  # back to the plan's lengths
    return {"attend(plan, validate=False)": (lambda: c.attend(q, plan=plan, out=out, validate=False), 1000),
            "attend(seq_ids, validate=False)": (lambda: c.attend(q, ids, out=out, validate=False), 500),
            "attend(seq_ids)": (lambda: c.attend(q, ids, out=out), 300),
            "append 1 token x 8, validate=False": (app, 300)}
res = {v: {} for v in caches}
for r in range(10):
    for v, (c, ids, plan) in caches.items():
        for name, (fn, n) in calls(c, ids, plan).items():
            res[v].setdefault(name, []).append(per_call(fn, n))
        for s in ids: c.truncate(s, 1000)
for name in res["old"]:
    o, n = np.array(res["old"][name]), np.array(res["new"][name])
    print(f"{name:38s} old min {o.min():6.1f} med {np.median(o):6.1f} | new min {n.min():6.1f} med {np.median(n):6.1f} us "
          f"| new-old per round med {np.median(n - o):+5.1f} us")
ev = _cuda.event_create()[1]; s = torch.cuda.current_stream().cuda_stream
for name, fn in (("cudaStreamIsCapturing", lambda: _cuda.stream_capturing(s)), ("cudaEventRecord", lambda: _cuda.event_record(ev, s))):
    t = time.perf_counter()
    for _ in range(20000): fn()
    print(f"{name}: {(time.perf_counter() - t) / 20000 * 1e6:.2f} us per call (Cython wrapper included)")
