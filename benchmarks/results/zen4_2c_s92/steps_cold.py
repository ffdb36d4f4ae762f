"""Multi-token steps read cold, as a model reads them (fifty-second session): `layers` copies of one cache,
each read once per step in turn, so that by its next read the other copies have pushed it out of the L3.
Token by token = for each token, every layer's append + attend (a model decoding the tokens one at a time);
one call = per layer, kvarn.append_attend (append_attend_fp16_batch over the fp16 copies). The four forms
run in turn in every round (each round starting one form later); every round starts from the same caches
(states restored outside the timing). Minima over the rounds; 2 threads (the default on the 2-vCPU box).

    PYTHONPATH=<site with kvarn> python steps_cold.py
"""
import time

import numpy as np

import kvarn

rng = np.random.default_rng(0)


def case(Hq, Hk, D, ctx, n, layers, rounds=7):
    K = rng.standard_normal((Hk, ctx, D)).astype(np.float16)
    V = rng.standard_normal((Hk, ctx, D)).astype(np.float16)
    pad = (64 - ctx % 128) % 128  # the step starts with 64 tokens in the tail: no tile completes in it
    kv, f16 = [], []
    for _ in range(layers):
        c = kvarn.KVCache(Hk, D)
        f = kvarn.FP16Cache(Hk, D, capacity=ctx + pad + n)
        for x in (c, f):
            x.append(K, V)
            x.append(K[:, :pad], V[:, :pad])
        kv.append(c)
        f16.append(f)
    k = rng.standard_normal((Hk, n, D)).astype(np.float16)
    v = rng.standard_normal((Hk, n, D)).astype(np.float16)
    q = rng.standard_normal((n, Hq, D)).astype(np.float32)

    def token_by_token(caches, attend):
        for i in range(n):
            for c in caches:
                c.append(k[:, i : i + 1], v[:, i : i + 1])
                attend(q[i][None], [c])

    forms = {
        "kvarn one call": (kv, lambda: [kvarn.append_attend(q, c, k, v) for c in kv]),
        "kvarn token by token": (kv, lambda: token_by_token(kv, kvarn.attend_batch)),
        "fp16 one call": (f16, lambda: [kvarn.append_attend_fp16_batch(q[None], [c], k[None], v[None]) for c in f16]),
        "fp16 token by token": (f16, lambda: token_by_token(f16, kvarn.attend_fp16_batch)),
    }
    times = {name: [] for name in forms}
    order = list(forms)
    for r in range(rounds + 1):  # round 0: warm-up, not counted
        for name in order[r % 4 :] + order[: r % 4]:
            caches, fn = forms[name]
            states = [c._state for c in caches]
            t = time.perf_counter()
            fn()
            if r:
                times[name].append(time.perf_counter() - t)
            for c, s in zip(caches, states):
                c._state = s  # the whole state back (a benchmark's shortcut: nothing else reads these caches)
    m = {name: min(t) for name, t in times.items()}
    print(f"Hq {Hq} Hk {Hk} D {D}, {ctx} tokens x {layers} layers, {n}-token step: "
          + ", ".join(f"{name} {m[name] * 1e3:.2f} ms" for name in order), flush=True)
    print(f"    one call vs token by token: kvarn {m['kvarn token by token'] / m['kvarn one call']:.2f}x, "
          f"fp16 {m['fp16 token by token'] / m['fp16 one call']:.2f}x; kvarn vs fp16: one call "
          f"{m['fp16 one call'] / m['kvarn one call']:.2f}x, token by token "
          f"{m['fp16 token by token'] / m['kvarn token by token']:.2f}x", flush=True)


if __name__ == "__main__":
    print("kvarn", kvarn.__version__, "isa", kvarn.active_isa(), "threads", kvarn.get_num_threads())
    for shape in [(9, 3, 64, 32768, 16), (32, 8, 128, 8192, 8)]:
        for n in (2, 4, 8):
            case(*shape[:4], n, shape[4])
