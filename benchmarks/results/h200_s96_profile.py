"""Fifty-sixth session, device call s96: where the host time of a GPU cache layer's decode step goes (s95c: 246 us
per layer for PagedKVCache.checkpoint + append_attend(validate=False, flags=), as KVarNCache's layers call them, at
Hq 32 / Hk 8 / head_dim 128, bf16, 16K tokens, batch 1). cProfile over 300 steps (its own overhead inflates the
totals; the split is what it is for), then single pieces timed alone (median us of 300 calls)."""
import cProfile
import pstats
import statistics
import sys
import time

import torch

import kvarn.cuda as kc
_cuda = kc._cuda

B, HQ, HK, D, N, REPS = 1, 32, 8, 128, 16384, 300
dev = torch.device("cuda")
g = torch.Generator(device=dev).manual_seed(0)


def rnd(*shape):
    return torch.randn(*shape, device=dev, generator=g, dtype=torch.bfloat16)


paged = kc.PagedKVCache(HK, D, num_layers=1, max_seqs=B, max_seq_len=N + 8 * REPS)
s = paged.add_sequence()
paged.append([s], rnd(B, N, HK, D), rnd(B, N, HK, D))
q, k, v = rnd(B, HQ, 1, D), rnd(B, HK, 1, D), rnd(B, HK, 1, D)  # transformers' layouts
flags = torch.zeros(1, dtype=torch.int32, device=dev)


def step():
    paged.checkpoint([s], 1)
    paged.append_attend(q.transpose(1, 2), [s], k.transpose(1, 2), v.transpose(1, 2), validate=False, flags=flags)


def host_us(fn, reps=REPS):
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
        torch.cuda.synchronize()
    return 1e6 * statistics.median(times)


for _ in range(20):
    step()
torch.cuda.synchronize()
print(torch.cuda.get_device_name(), f"B {B}, Hq {HQ}, Hk {HK}, D {D}, {N} tokens, bf16")
print(f"step (checkpoint + append_attend flags): {host_us(step):.1f} us", flush=True)
if "--step-only" in sys.argv:
    sys.exit(0)
pr = cProfile.Profile()
pr.enable()
for _ in range(REPS):
    step()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(35)
# KVarNCache's layer step as its forward runs it: update (keeps the token aside), then attend_pending under an
# active journal (checkpoint + append_attend with deferred flags); the journal's undo list cleared each step, its
# flags never read (no synchronisation: the last layer of a forward reads them)
from kvarn.integrations.transformers import KVarNCudaLayer, _StepJournal  # noqa: E402

layer = KVarNCudaLayer(device=0, max_cache_len=N + 8 * REPS)
layer.update(rnd(B, HK, N, D), rnd(B, HK, N, D))
layer.store_prefill(None)
layer._journal = _StepJournal(10**9, gpu_flags=layer._flags)
layer._flags[0] = flags
layer._journal.start()


def layer_step():
    layer.update(k, v)
    layer.attend_pending(q, None, D ** -0.5)
    layer._journal.undo.clear()


for _ in range(20):
    layer_step()
print(f"layer step (update + attend_pending, deferred): {host_us(layer_step):.1f} us", flush=True)
pr = cProfile.Profile()
pr.enable()
for _ in range(REPS):
    layer_step()
pr.disable()
torch.cuda.synchronize()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
qt = q.transpose(1, 2)
meta = kc.np.zeros(16, kc.np.int32)
st = paged._stream_state(kc._torch_stream(torch, 0))
ptr = st.attend_meta.get(meta.nbytes)
event = kc._Event()
pieces = {
    "_view(torch q transposed)": lambda: kc._view(qt, "q"),
    "_torch_stream": lambda: kc._torch_stream(torch, 0),
    "q.transpose(1, 2)": lambda: q.transpose(1, 2),
    "memcpy_htod 64 B pageable": lambda: _cuda.memcpy_htod(ptr, meta.view(kc.np.uint8), 0),
    "memset 4 B": lambda: _cuda.memset(st.flag.ptr, 0, 4, 0),
    "check launch (q)": lambda: _cuda.check(kc._view(qt, "q").spec(), st.flag.ptr, 1, 2, 0),
    "event_record": lambda: _cuda.event_record(event.handle, 0),
    "get_device": lambda: _cuda.get_device(),
    "checkpoint([s], 1)": lambda: paged.checkpoint([s], 1),
    "torch.zeros(1) on the GPU (a small torch launch)": lambda: torch.zeros(1, device=dev),
}
for name, fn in pieces.items():
    print(f"{name:50s} {host_us(fn):8.2f} us")
