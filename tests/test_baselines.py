"""The KIVI baseline of `kvarn demo` and test_cache's accuracy check (kvarn.baselines): the tests that use it
only require KVarN to beat it, so a baseline gone wrong in the weak direction would pass them (h52's audit: a
KIVI that quantised the sink, kept fp32 sink and tail, skipped the fp16 scales or miscounted its bytes all did)."""
import numpy as np

from kvarn.baselines import kivi_bytes, kivi_cache, kivi_tile


def _f16(x):
    return x.astype(np.float16).astype(np.float32)


def test_kivi_cache_quantises_exactly_the_tiles_after_the_sink(rng):
    H, n, D, G, sink = 2, 128 + 2 * 128 + 37, 64, 128, 128
    k, v = rng.standard_normal((2, H, n, D)).astype(np.float32)
    kh, vh = kivi_cache(k, v, 4, 2, G, sink)
    tail = slice(sink + 2 * G, n)
    for got, x in ((kh, k), (vh, v)):
        np.testing.assert_array_equal(got[:, :sink], _f16(x[:, :sink]))  # the sink: fp16, not quantised
        np.testing.assert_array_equal(got[:, tail], _f16(x[:, tail]))  # the unfinished tile: fp16
    for t in range(2):
        s = slice(sink + t * G, sink + (t + 1) * G)
        want_k, want_v = kivi_tile(k[:, s], v[:, s], 4, 2)
        np.testing.assert_array_equal(kh[:, s], want_k)
        np.testing.assert_array_equal(vh[:, s], want_v)


def test_kivi_rounds_its_scale_and_minimum_to_fp16(rng):
    # Values per token: row t is codes * fp16(scale_t) + fp16(lo_t) (SPEC §5's fp16 vectors, as eval's KIVI).
    v = rng.standard_normal((1, 128, 64)).astype(np.float32)
    _, vh = kivi_tile(v, v, 4, 2)
    lo, hi = v[0].min(1), v[0].max(1)
    scale = np.maximum((hi - lo) / 3, 1e-10)
    codes = np.clip(np.rint((v[0] - lo[:, None]) / scale[:, None]), 0, 3)
    f16 = lambda x: x.astype(np.float16).astype(np.float64)  # noqa: E731
    np.testing.assert_allclose(vh[0], codes * f16(scale)[:, None] + f16(lo)[:, None], rtol=0, atol=1e-6)


def test_kivi_bytes_count_codes_fp16_vectors_sink_and_tail():
    # k4v2 at G = D = 128: codes 128 * 128 * (4 + 2) / 8 = 12,288 B, an fp16 (scale, minimum) per key channel
    # (512 B) and per value token (512 B): 13,312 B per tile and head, the 3.25 bits per element eval charges
    # KIVI; the sink and the unfinished tile are fp16 K and V (4 bytes per channel and token).
    from kvarn.eval import build_methods

    kivi = {m.name: m for m in build_methods(128, presets=("k4v2_g128",))}["KIVI k4v2_g128"]
    assert kivi.bits_per_element * 2 * 128 * 128 / 8 == 13312
    n = 128 + 3 * 128 + 5
    assert kivi_bytes(2, n, 128, 4, 2, 128, 128) == 2 * (3 * 13312 + (128 + 5) * 128 * 4)
