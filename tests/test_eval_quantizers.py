"""The numpy reference quantisers used by `kvarn eval` (numpy only, no torch)."""
from __future__ import annotations

import numpy as np
import pytest

import kvarn
from kvarn import eval_quantizers as eq
from kvarn.baselines import kivi_tile
from kvarn.data import load_default_sample


def rel(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def real_tiles():
    s = load_default_sample()
    G = 128
    k = s["k"][1, :, 128 : 128 + 4 * G].astype(np.float32)  # layer 14, 4 tiles after the sink
    v = s["v"][1, :, 128 : 128 + 4 * G].astype(np.float32)
    H, _, D = k.shape
    tiles = lambda x: x.reshape(H, 4, G, D).reshape(H * 4, G, D)  # noqa: E731
    return tiles(k), tiles(v)


def test_sample_loader_shapes_and_meta():
    s = load_default_sample()
    L, Hk, T, D = s["k"].shape
    assert s["k"].dtype == s["v"].dtype == s["q"].dtype == np.float16
    assert s["v"].shape == s["k"].shape and s["q"].shape == (L, 9, T, D)
    assert (Hk, D) == (3, 64) and T == s["meta"]["num_tokens"] and len(s["meta"]["token_ids"]) == T
    assert s["meta"]["layers"] == [0, 14, 29] and np.isfinite(s["k"]).all()


def test_hadamard_matrix_is_orthonormal_and_matches_kvarn():
    for d in (64, 96, 128, 256):
        h = eq.hadamard_matrix(d)
        np.testing.assert_allclose(h @ h.T, np.eye(d), atol=1e-12)
        x = np.random.default_rng(d).standard_normal((5, d))
        np.testing.assert_allclose(x @ h, kvarn.hadamard(x), atol=1e-10)


@pytest.mark.parametrize("preset", ["k4v2_g128", "k4v4_g128", "k2v2_g128"])
def test_float64_reference_matches_the_native_quantiser(real_tiles, preset):
    k, v = real_tiles
    p = kvarn.PRESETS[preset]
    kr, vr = eq.kvarn_ref(k, v, p.kbits, p.vbits)
    kc, vc = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
    # Same algorithm: differences are rare code flips at rounding ties (fp32 vs fp64).
    assert rel(kc, kr) < 5e-3 and rel(vc, vr) < 5e-3
    # ... and far below the quantisation error itself.
    assert rel(kc, kr) < 0.1 * rel(kc, k)


def test_balance_evens_out_the_stds():
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 64, 128)) * np.exp(rng.normal(0, 1, (3, 64, 1))) * np.exp(rng.normal(0, 0.5, (3, 1, 128)))
    r, c = eq.balance(x)
    b = x / r[:, :, None] / c[:, None, :]
    spread = lambda y: y.std(axis=2, ddof=1).max(1) / y.std(axis=2, ddof=1).min(1)  # noqa: E731
    assert (spread(b) < 0.2 * spread(x)).all()
    assert (r > 0).all() and (c > 0).all()


def test_ablations_are_distinct_and_kivi_matches_the_demo_baseline(real_tiles):
    k, v = real_tiles
    ka, va = eq.kivi(k, v, 4, 2)
    kb, vb = kivi_tile(k, v, 4, 2)
    assert rel(ka, kb) < 5e-3 and rel(va, vb) < 5e-3
    outs = [eq.kivi(k, v, 2, 2), eq.rotation_only(k, v, 2, 2), eq.normalisation_only(k, v, 2, 2), eq.kvarn_ref(k, v, 2, 2)]
    for i in range(len(outs)):
        for j in range(i):
            assert rel(outs[i][0], outs[j][0]) > 1e-3
    # More bits, less error.
    assert rel(eq.kivi(k, v, 4, 4)[1], v) < rel(eq.kivi(k, v, 4, 2)[1], v)


def test_lloyd_max_codebook_is_the_gaussian_one_for_large_d():
    d = 4096
    cb = eq.lloyd_max_codebook(2, d) * np.sqrt(d)
    np.testing.assert_allclose(cb, [-1.510, -0.4528, 0.4528, 1.510], atol=5e-3)  # Max (1960), N(0, 1)
    cb3 = eq.lloyd_max_codebook(3, 64)
    np.testing.assert_allclose(cb3, -cb3[::-1], atol=1e-9)
    assert np.all(np.diff(cb3) > 0)


@pytest.mark.parametrize("bits,mse", [(1, 0.36), (2, 0.117), (3, 0.030), (4, 0.009)])
def test_turboquant_mse_matches_the_papers_values(bits, mse):
    # TurboQuant (Zandieh et al. 2025), Thm. 1: MSE distortion of unit vectors ~ 0.36, 0.117, 0.03, 0.009.
    x = np.random.default_rng(bits).standard_normal((2000, 128))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    err = np.mean(np.sum((eq.turboquant_rows(x, bits) - x) ** 2, axis=1))
    assert abs(err - mse) < 0.15 * mse


def test_bits_per_element_accounting():
    # KVarN record for k4v2, D=G=128: 13,824 bytes = 3.375 bits/elem (SPEC §6); RTN + kt + vc is the same layout.
    assert eq.rtn_bits_per_element(4, 2, 128, 128, extra_vectors=256) == pytest.approx(3.375)
    assert eq.rtn_bits_per_element(4, 2, 128, 128, extra_vectors=256) == pytest.approx(
        kvarn.PRESETS["k4v2_g128"].bits_per_element(128))


def test_bad_input_names_the_argument():
    k = np.zeros((2, 128, 64), np.float32)
    with pytest.raises(ValueError, match="v:"):
        eq.kvarn_ref(k, np.zeros((2, 128, 32)), 4, 2)
    with pytest.raises(ValueError, match="kbits"):
        eq.kvarn_ref(k, k, 5, 2)
    with pytest.raises(ValueError, match="k:"):
        eq.kivi(k[0], k[0], 4, 2)
    bad = k.copy()
    bad[0, 0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        eq.turboquant(bad, k, 3, 3)
