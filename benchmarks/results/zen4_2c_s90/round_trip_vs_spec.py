"""Native round-trip error against the SPEC oracle's (tests/oracle.round_trip: float64, unrounded scale vectors) on
the test's inputs."""
import numpy as np, kvarn
from round_trip_tails import PRESETS, tail_inputs
import oracle  # tests/, on the path round_trip_tails puts it

rng0 = np.random.default_rng(7)
rows = []
for i in range(3000):
    seed = int(rng0.integers(2**32)); preset = PRESETS[i % 5]; d = [16, 48, 64, 112, 128][(i // 5) % 5]
    p = kvarn.PRESETS[preset]
    mag, k, v = tail_inputs(seed, preset, d)
    kh, vh = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
    ko, vo = oracle.round_trip(k[0], v[0], p.kbits, p.vbits)
    for x, xh, xo, keys in ((k, kh, ko, True), (v, vh, vo, False)):
        n = np.linalg.norm(x)
        e_nat = np.linalg.norm(xh - x) / n
        e_or = np.linalg.norm(xo - x[0]) / n
        rows.append((abs(e_nat / e_or - 1), mag, d, preset, keys, seed))
r = np.array([x[0] for x in rows])
print("|native/oracle - 1| of the relative round-trip error: median %.2e p99 %.2e max %.2e" % (np.median(r), np.quantile(r, .99), r.max()))
for x in sorted(rows, key=lambda t: -t[0])[:5]:
    print("  ", x)
