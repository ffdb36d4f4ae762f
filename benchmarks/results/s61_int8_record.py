# Twenty-first session: one core's time per k4v2 record (Hq 32, Hk 8, D 128, 32K tokens = 2040 records per call)
# in the int16 and int8 score modes, per ISA and VNNI form, in alternating rounds (min of 10 calls per round;
# medians over rounds; the per-round ratio int8 / int16 of the same ISA and form). Output: *_int8_record.log.
import sys, time
import numpy as np
import kvarn
from kvarn import _native

rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 7
rng = np.random.default_rng(0)
Hq, Hk, D, n = 32, 8, 128, 32768
c = kvarn.KVCache(Hk, D)
c.append(rng.standard_normal((Hk, n, D)).astype(np.float32), rng.standard_normal((Hk, n, D)).astype(np.float32))
q = rng.standard_normal((Hq, D)).astype(np.float32)
records = c.num_tiles * Hk
variants = []
for isa in [i for i in kvarn.available_isas() if i != "scalar"]:
    has_vnni = _native.cpu_has_vnni() if isa == "avx512" else _native.cpu_has_avx_vnni()
    for vnni in ([True, False] if has_vnni else [False]):
        for mode in ("int16", "int8"):
            kvarn.set_isa(isa); _native.set_vnni(vnni); _native.set_score_mode(mode)
            if _native.score_mode() == mode:
                variants.append((isa, vnni, mode))
times = {v: [] for v in variants}
for r in range(rounds):
    order = variants if r % 2 == 0 else variants[::-1]
    for v in order:
        isa, vnni, mode = v
        kvarn.set_isa(isa); _native.set_vnni(vnni); _native.set_score_mode(mode)
        kvarn.attend(q, c, num_threads=1)
        best = min((lambda t: (kvarn.attend(q, c, num_threads=1), time.perf_counter() - t)[1])(time.perf_counter())
                   for _ in range(10))
        times[v].append(best)
_native.set_vnni(True)
print(f"{records} records per call, {rounds} rounds, one thread")
for v, t in times.items():
    isa, vnni, mode = v
    line = f"{isa:7s} {'vnni' if vnni else 'madd'} {mode:6s} {np.median(t) / records * 1e6:.3f} us/record (min {min(t) / records * 1e6:.3f})"
    if mode == "int8" and (isa, vnni, "int16") in times:
        ratio = np.array(t) / np.array(times[isa, vnni, "int16"])
        line += f"  int8/int16 median {np.median(ratio):.3f} (range {ratio.min():.3f}-{ratio.max():.3f})"
    print(line)
