"""Stream-ordering hazards of kvarn.cuda.PagedKVCache (H200, torch, kvarn built with CUDA).

    python repro_streams.py            # runs every case, each in its own process (a crash = FAIL)
    python repro_streams.py <case>     # one case in this process

Each case races a kvarn call against a torch side stream (torch pool streams are non-blocking: work on
the legacy stream 0 does not order with them) and compares with a fully synchronised reference.
Races are made deterministic with torch.cuda._sleep on a stream, or by holding every SM with one large
GEMM kernel on a third stream (kernels queued behind it wait, copy-engine copies do not).
FAIL = the hazard happened; INCONCLUSIVE = the setup did not hold (e.g. the SMs were freed too early)."""
import os
import subprocess
import sys
import time

import numpy as np
import torch

SLEEP = int(3e8)  # cycles, ~0.15-0.2 s on an H200
H, D = 8, 128


class Inconclusive(Exception):
    pass


def kc():
    import kvarn.cuda as m
    return m


def cache(**kw):
    kw.setdefault("max_seqs", 8)
    kw.setdefault("max_seq_len", 4096)
    return kc().PagedKVCache(num_kv_heads=H, head_dim=D, **kw)


def rand(*shape, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return torch.randn(*shape, device="cuda", dtype=torch.float16, generator=g)


def fill(c, T, seed):
    s = c.add_sequence()
    c.append([s], rand(1, T, H, D, seed=seed), rand(1, T, H, D, seed=seed + 1000))
    return s


def same(a, b):
    return a.shape == b.shape and bool(torch.equal(a, b))


def saturate():
    """One long kernel on its own stream that holds every SM (an fp32 SIMT GEMM, ~1 TFLOP, ~15-20 ms):
    kernels queued on other streams wait behind it, copy-engine copies do not. Returns (stream, buffers,
    event recorded after it) -- keep the buffers alive until synchronised."""
    torch.backends.cuda.matmul.allow_tf32 = False
    s = torch.cuda.Stream()
    a = torch.randn(8192, 8192, device="cuda")
    with torch.cuda.stream(s):
        a @ a  # warm-up: cuBLAS handle, workspace, lazy module load happen outside the race window
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        c = a @ a
        ev = torch.cuda.Event()
        ev.record(s)
    return s, (a, c), ev


# 1. records()/to_cpu() copy on stream 0 while append(validate=False) still runs on a side stream.
def case_records_after_side_append():
    c = cache()
    a = c.add_sequence()
    k, v = rand(1, 300, H, D, seed=1), rand(1, 300, H, D, seed=2)  # sink 128 + one tile + 44 tail
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        c.append([a], k, v, validate=False)
    got = c.records(a)  # stream 0: does not wait for `side`
    tail_k = c.to_cpu(a).to_parts()["tail_k"]
    torch.cuda.synchronize()
    ok = np.array_equal(got, c.records(a)) and np.array_equal(tail_k, c.to_cpu(a).to_parts()["tail_k"])
    return ok, "records()/to_cpu() returned bytes the side-stream append had not written yet"


# 2. free() + load_cpu() (stream 0) overwrite pages/tail/block table an in-flight side-stream attend reads.
def case_load_cpu_overwrites_inflight_attend():
    c = cache()
    a, b = fill(c, 400, 10), fill(c, 400, 20)
    cpu_b = c.to_cpu(b)
    q = rand(1, 32, D, seed=3)
    ref = c.attend(q, [a])
    out = torch.empty_like(q)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP)
        c.attend(q, [a], out=out, validate=False)  # the last decode step of request a
    c.free(a)  # request a finished: its slot and pages go back at once
    n = c.add_sequence()  # same slot, LIFO
    c.load_cpu(n, cpu_b)  # same pages; stream 0 + stream_sync(0) only
    torch.cuda.synchronize()
    return same(out, ref), "attend issued before free() read the data load_cpu() wrote afterwards"


# 3. plan() uploads on stream 0 (pageable cudaMemcpyAsync); attend(plan=) on a side stream runs first.
def case_plan_upload_not_ordered():
    c = cache()
    a = fill(c, 700, 30)
    q = rand(1, 32, D, seed=4)
    ref = c.attend(q, [a])
    out = torch.empty_like(q)
    torch.cuda.synchronize()
    torch.cuda._sleep(SLEEP)  # torch's default stream is the legacy stream 0: e.g. the engine's own work
    t0 = time.perf_counter()
    plan = c.plan([a])  # the upload queues behind it
    blocked = time.perf_counter() - t0
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        c.attend(q, plan=plan, out=out, validate=False)  # reads the plan's metadata before it lands
    torch.cuda.synchronize()
    ok = same(out, ref)
    if ok and blocked > 0.05:  # the driver may sync stream 0 before staging a pageable copy
        raise Inconclusive(f"plan() blocked {blocked:.3f} s on stream 0's work (no race, but a hidden host stall)")
    return ok, "attend(plan=) on a side stream read the plan's metadata before plan()'s upload landed"


# 4. _attend_meta shared: attend on stream A, then attend on stream B overwrites A's metadata.
def case_attend_meta_two_streams():
    c = cache()
    a, b = fill(c, 300, 40), fill(c, 700, 50)
    qa, qb = rand(1, 32, D, seed=5), rand(1, 32, D, seed=6)
    ra, rb = c.attend(qa, [a]), c.attend(qb, [b])
    oa, ob = torch.empty_like(qa), torch.empty_like(qb)
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    _, x, ev = saturate()
    with torch.cuda.stream(sa):
        c.attend(qa, [a], out=oa, validate=False)
    with torch.cuda.stream(sb):
        c.attend(qb, [b], out=ob, validate=False)
    early = ev.query()
    torch.cuda.synchronize()
    del x
    ok = same(oa, ra) and same(ob, rb)
    if ok and early:
        raise Inconclusive("the saturating kernel ended before both calls were issued")
    return ok, "attend on stream A used the metadata uploaded by an attend on stream B"


# 5. _append_meta/_flag shared: append on stream A, then append on stream B (other sequences).
def case_append_meta_two_streams():
    c, r = cache(), cache()
    d = c.add_sequence()  # warm-up: _append_meta at its size (a later growth would cudaFree = device sync)
    c.append([d], rand(1, 300, H, D, seed=7), rand(1, 300, H, D, seed=8))
    c.free(d)
    a, b = c.add_sequence(), c.add_sequence()
    ra, rb = r.add_sequence(), r.add_sequence()
    ka, va, kb, vb = (rand(1, 300, H, D, seed=s) for s in (60, 61, 62, 63))
    r.append([ra], ka, va)
    r.append([rb], kb, vb)
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    _, x, ev = saturate()
    with torch.cuda.stream(sa):
        c.append([a], ka, va, validate=False)
    with torch.cuda.stream(sb):
        c.append([b], kb, vb, validate=False)
    early = ev.query()
    torch.cuda.synchronize()
    del x
    q = rand(1, 32, D, seed=9)
    ok = same(c.attend(q, [a]), r.attend(q, [ra])) and same(c.attend(q, [b]), r.attend(q, [rb]))
    if ok and early:
        raise Inconclusive("the saturating kernel ended before both calls were issued")
    return ok, "append on stream A used the metadata/flag of an append on stream B (tokens in the wrong sequence)"


# 6. _scratch shared by attends on two streams (merge path), even with plans (no host metadata).
def case_scratch_two_streams():  # runs with KVARN_ATTEND_DIRECT=0 (D 256 / >8 splits take this path anyway)
    c = cache()
    a, b = fill(c, 700, 70), fill(c, 700, 80)
    pa, pb = c.plan([a]), c.plan([b])
    qa, qb = rand(1, 32, D, seed=10), rand(1, 32, D, seed=11)
    oa, ob = torch.empty_like(qa), torch.empty_like(qb)
    ra, rb = c.attend(qa, plan=pa), c.attend(qb, plan=pb)  # also warms the scratch
    sa, sb = torch.cuda.Stream(), torch.cuda.Stream()
    _, x, ev = saturate()
    with torch.cuda.stream(sa):
        c.attend(qa, plan=pa, out=oa, validate=False)
    with torch.cuda.stream(sb):
        c.attend(qb, plan=pb, out=ob, validate=False)
    early = ev.query()
    torch.cuda.synchronize()
    del x
    ok = same(oa, ra) and same(ob, rb)
    if ok and early:
        raise Inconclusive("the saturating kernel ended before both calls were issued")
    return ok, "the merge of stream A's attend read split states written by stream B's attend (timing-dependent)"


# 7. A captured attend(plan=) bakes the cache's scratch pointer; a later, larger eager attend grows
#    the scratch and cudaFree's the old buffer: every replay then writes freed memory.
def case_graph_scratch_use_after_free():  # runs with KVARN_ATTEND_DIRECT=0
    import kvarn.cuda as m
    c = cache()
    ids = [fill(c, 700, 90 + i) for i in range(8)]
    p1 = c.plan(ids[:1])
    q1 = rand(1, 32, D, seed=12)
    o1 = torch.empty_like(q1)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c.attend(q1, plan=p1, out=o1, validate=False)  # warm-up: scratch sized for this batch
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        c.attend(q1, plan=p1, out=o1, validate=False)
    old_ptr, old_n = c._scratch.buf.ptr, c._scratch.buf.nbytes
    c.attend(rand(8, 32, D, seed=13), ids)  # an ordinary larger batch (e.g. prefill-time decode)
    torch.cuda.synchronize()
    if c._scratch.buf.ptr == old_ptr:
        raise Inconclusive("the scratch did not grow")
    probe = m.DeviceArray((old_n,), np.uint8).zero_()  # often lands on the freed address
    torch.cuda.synchronize()
    g.replay()
    torch.cuda.synchronize()
    hit = probe.ptr == old_ptr and probe.to_numpy().any()
    why = "the captured graph still writes the scratch buffer kvarn freed when it grew"
    if hit:
        why += "; the replay overwrote a live DeviceArray allocated afterwards"
    return False, why


CASES = {
    "records_after_side_append": ({}, case_records_after_side_append),
    "load_cpu_overwrites_inflight_attend": ({}, case_load_cpu_overwrites_inflight_attend),
    "plan_upload_not_ordered": ({}, case_plan_upload_not_ordered),
    "attend_meta_two_streams": ({}, case_attend_meta_two_streams),
    "append_meta_two_streams": ({}, case_append_meta_two_streams),
    "scratch_two_streams": ({"KVARN_ATTEND_DIRECT": "0"}, case_scratch_two_streams),
    "graph_scratch_use_after_free": ({"KVARN_ATTEND_DIRECT": "0"}, case_graph_scratch_use_after_free),
}


def run_one(name):
    try:
        ok, why = CASES[name][1]()
    except Inconclusive as e:
        print(f"INCONCLUSIVE {name}: {e}", flush=True)
        return 0
    except Exception as e:  # a race can also surface as an exception (e.g. garbage records)
        print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
        return 1
    print(f"{'PASS' if ok else 'FAIL'} {name}" + ("" if ok else f": {why}"), flush=True)
    return 0 if ok else 1


def main():
    if len(sys.argv) > 1:
        return run_one(sys.argv[1])
    if not torch.cuda.is_available() or not kc().is_available():
        print("SKIP: needs a CUDA GPU and kvarn's CUDA module")
        return 2
    failed = 0
    for name, (env, _) in CASES.items():
        try:
            p = subprocess.run([sys.executable, os.path.abspath(__file__), name], env={**os.environ, **env},
                               capture_output=True, text=True, timeout=60)
            lines = [ln for ln in p.stdout.splitlines() if ln.split(" ")[0] in ("PASS", "FAIL", "INCONCLUSIVE")]
            if lines:
                print(lines[-1], flush=True)
            if p.returncode != 0 or not lines:
                if not lines:  # crashed (e.g. an illegal address from garbage metadata)
                    tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
                    print(f"FAIL {name}: process exited {p.returncode}: {tail}", flush=True)
                failed += 1
        except Exception as e:
            print(f"FAIL {name}: {type(e).__name__}: {e}", flush=True)
            failed += 1
    print(f"{failed} of {len(CASES)} cases failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
