# Sixty-fifth session: storing one decode token (k and v, fp16) warm, and its parts (timeit, min of 7 x 2000).
import timeit, numpy as np, kvarn
from kvarn import _ops, _native
for hk, d in ((3, 64), (8, 128)):
    src = np.random.default_rng(0).standard_normal((hk, 128, d)).astype(np.float16)
    tail = np.zeros((hk, 128, d), np.float16)
    x = src[:, 127:]; out = tail[:, 5:6]
    xb = x.view(np.uint16); ob = out.view(np.uint16)
    f = lambda s: min(timeit.repeat(s, number=2000, repeat=7, globals=dict(globals(), **locals()))) / 2000 * 1e6
    print(hk, d, "store_tokens %.2f" % f("_ops.store_tokens(x, x, out, out, True)"),
          "check_tokens_f16 %.2f" % f("_ops.check_tokens_f16(x, 'k', out)"),
          "scan_f16 %.2f" % f("_native.scan_f16(xb, ob)"),
          "views %.2f" % f("x.view(np.uint16); out.view(np.uint16)"),
          "scan_f16 no out %.2f" % f("_native.scan_f16(xb)"),
          "np copy %.2f" % f("out[...] = x"))
