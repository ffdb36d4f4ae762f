"""layer_loop.py's setup, with KVarNLayer.update + attend_pending's stages timed one by one (perf_counter_ns
between them; a copy of attend_pending's one-token path with the same calls)."""
import functools, os, statistics, sys, time
import numpy as np
import torch
import kvarn
from kvarn import _ops
from kvarn._ops import append_attend_chunks, check_scale, check_step_queries
from kvarn.integrations import transformers as T
from kvarn.integrations.transformers import KVarNLayer, _to_numpy

ctx = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
steps = int(sys.argv[2]) if len(sys.argv) > 2 else 200
kvarn.set_num_threads(int(os.environ.get("KT", "1")))
L, Hq, Hk, D = 30, 9, 3, 64
rng = np.random.default_rng(0)
layers = [KVarNLayer() for _ in range(L)]
with torch.inference_mode():
    for layer in layers:
        k = torch.from_numpy(rng.standard_normal((1, Hk, ctx, D), dtype=np.float32))
        layer.update(k, k.clone())
        layer.store_prefill(None)
names = ["update", "take_pending", "to_numpy", "out_alloc", "checkpoints", "check_q", "append", "attend_py", "native", "tail"]
acc = {n: [] for n in names}
native_t = [0]
fn = _ops._native.attend
def timed(*a):
    t = time.perf_counter_ns()
    try:
        return fn(*a)
    finally:
        native_t[0] += time.perf_counter_ns() - t
_ops._native.attend = timed
append_t = [0]
orig_append = kvarn.KVCache.append
def timed_append(self, *a, **k):
    t = time.perf_counter_ns()
    try:
        return orig_append(self, *a, **k)
    finally:
        append_t[0] += time.perf_counter_ns() - t
kvarn.KVCache.append = timed_append

def step(self, key, value, query, attention_mask, scaling, st):
    t0 = time.perf_counter_ns()
    self.update(key, value)
    t1 = time.perf_counter_ns()
    key_states, value_states = self._take_pending(query, attention_mask)
    t2 = time.perf_counter_ns()
    B, Hq, n, D = query.shape
    k, v, q = _to_numpy(key_states, keep_f16=True), _to_numpy(value_states, keep_f16=True), _to_numpy(query)
    t3 = time.perf_counter_ns()
    out_tensor = torch.empty((B, n, Hq, D), dtype=torch.float32)
    out = out_tensor.numpy()
    t4 = time.perf_counter_ns()
    before = [c.checkpoint() for c in self.caches]
    t5 = time.perf_counter_ns()
    scale = check_scale(scaling, D)
    qs = check_step_queries(q, self.caches[0].num_kv_heads, D, scale)
    t6 = time.perf_counter_ns()
    native_t[0] = append_t[0] = 0
    append_attend_chunks(qs, self.caches, k, v, scale, None, out, self._row_error)
    t7 = time.perf_counter_ns()
    journal = self._journal if self._journal is not None and self._journal.active else None
    ring_saved = [] if journal is not None else None
    if self.crop_window:
        pass
    self.cumulative_length += n
    if journal is not None:
        journal.add(functools.partial(self._undo_step, before, n, ring_saved))
        journal.took()
    r = out_tensor if query.dtype is torch.float32 and query.is_cpu else out_tensor.to(device=query.device, dtype=query.dtype)
    t8 = time.perf_counter_ns()
    for nm, d in zip(names, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t5 - t4, t6 - t5, append_t[0],
                             t7 - t6 - append_t[0] - native_t[0], native_t[0], t8 - t7)):
        st[nm] += d
    return r

ks = [torch.from_numpy(rng.standard_normal((1, Hk, 1, D), dtype=np.float32)) for _ in range(8)]
qs = [torch.from_numpy(rng.standard_normal((1, Hq, 1, D), dtype=np.float32)) for _ in range(8)]
with torch.inference_mode():
    for s in range(steps):
        st = dict.fromkeys(names, 0)
        for layer in layers:
            step(layer, ks[s % 8], ks[(s + 1) % 8], qs[s % 8], None, 0.125, st)
        for nm in names:
            acc[nm].append(st[nm] / L / 1e3)
        if (s + 1) % 64 == 0:
            for layer in layers:
                layer.crop(-64)
med = {nm: statistics.median(v) for nm, v in acc.items()}
print(f"ctx {ctx} per layer (us, medians over steps): " + ", ".join(f"{nm} {med[nm]:.1f}" for nm in names)
      + f"; sum {sum(med.values()):.1f}")
