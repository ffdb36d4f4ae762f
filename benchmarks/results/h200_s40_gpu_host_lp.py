# Line profile of PagedKVCache.attend(seq_ids) / append host paths with torch tensors (B 8, 1K tokens),
# plus the cost of the pieces: torch's current-stream query, torch.empty, a pageable 128-byte upload.
import time, numpy as np, torch, line_profiler
import kvarn.cuda as kc
from kvarn import _cuda
c = kc.PagedKVCache(8, 128, max_seqs=8, max_seq_len=4096)
ids = [c.add_sequence() for _ in range(8)]
kv = torch.randn(8, 1000, 8, 128, device="cuda", dtype=torch.float16)
c.append(ids, kv, kv)
q = torch.randn(8, 32, 128, device="cuda", dtype=torch.float16); out = torch.empty_like(q)
k1 = torch.randn(8, 8, 128, device="cuda", dtype=torch.float16)
lp = line_profiler.LineProfiler(kc.PagedKVCache.attend.__wrapped__, kc.PagedKVCache.append.__wrapped__,
                                kc.PagedKVCache._plan_host, kc._view)
att, app = lp(kc.PagedKVCache.attend.__wrapped__), lp(kc.PagedKVCache.append.__wrapped__)
for i in range(1000):
    att(c, q, ids, out=out, validate=False)
    app(c, ids, k1, k1, validate=False)
    if c.length(ids[0]) >= 1020:
        for s in ids: c.truncate(s, 1000)
torch.cuda.synchronize()
lp.print_stats(output_unit=1e-6)
def t(fn, n=5000):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): fn()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e6
buf = c._streams[0].attend_meta.buf.ptr; host = np.zeros(32, np.uint8)
print("current_stream().cuda_stream %.2f us" % t(lambda: torch.cuda.current_stream(q.device).cuda_stream))
print("torch.empty_like %.2f us" % t(lambda: torch.empty_like(q)))
print("pageable 32-byte cudaMemcpyAsync %.2f us" % t(lambda: _cuda.memcpy_htod(buf, host, 0)))
print("plan attend %.2f us" % t(lambda: c.attend(q, plan=c.plan(ids) if False else plan, out=out, validate=False)) if (plan := c.plan(ids)) else "")
print("eager attend %.2f us" % t(lambda: c.attend(q, ids, out=out, validate=False), 2000))
