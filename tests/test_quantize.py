"""Tile quantiser: record layout, balancing, RTN and packing against the float64 oracle."""
import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import kvarn
import oracle
from oracle import assert_fields_match_oracle
from conftest import kv_like

PRESETS = ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k4v4_g64", "k2v2_g128"]
FP16_REL = 2.0**-10  # one fp16 rounding, relative (half an ulp is 2^-11; keep margin)


def fields_for(tile, h):
    p = tile.preset
    return oracle.record_fields(tile.records[h], p.kbits, p.vbits, p.group, tile.head_dim)


def test_record_size_matches_spec():
    assert kvarn.PRESETS["k4v2_g128"].record_bytes(128) == 13824
    assert kvarn.PRESETS["k4v2_g128"].record_bytes(128) / 128 == 108  # bytes per token per head
    assert kvarn.PRESETS["k4v2_g128"].bits_per_element(128) == pytest.approx(3.375)
    # SPEC: 4.74x smaller than fp16 (K and V, 2 bytes per element) -- from kvarn's own numbers.
    p = kvarn.PRESETS["k4v2_g128"]
    assert 2 * p.group * 128 * 2 / p.record_bytes(128) == pytest.approx(4.74, abs=0.005)
    assert 16 / p.bits_per_element(128) == pytest.approx(4.74, abs=0.005)
    assert type(p.bits_per_element(np.int64(128))) is float and type(p.record_bytes(np.int64(128))) is int


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("d", [64, 80, 128, 256])
def test_record_layout_parses(preset, d, rng):
    p = kvarn.PRESETS[preset]
    k = kv_like(rng, (2, p.group, d))
    v = kv_like(rng, (2, p.group, d), 0)
    tile = kvarn.quantize_tile(k, v, preset)
    expect = d * p.group * p.kbits // 8 + p.group * d * p.vbits // 8 + 2 * (3 * d + 3 * p.group)
    assert tile.records.shape == (2, expect)
    assert tile.num_heads == 2 and tile.nbytes == 2 * expect == tile.records.nbytes
    # Python field views (a public inspection API, and what from_records validates) agree with the
    # oracle's independent parser: every fp16 vector and both code arrays, for every head.
    views = tile.fields()
    for h in range(2):
        f = fields_for(tile, h)
        assert f["k_codes"].max() < 2**p.kbits and f["v_codes"].max() < 2**p.vbits
        for name in ("ka", "kz", "kt", "vc", "va", "vz"):
            np.testing.assert_array_equal(views[name][h].astype(np.float64), f[name], err_msg=f"{name}, head {h}")
        np.testing.assert_array_equal(tile.k_codes()[h], f["k_codes"])
        np.testing.assert_array_equal(tile.v_codes()[h], f["v_codes"])


@pytest.mark.parametrize("preset", ["k4v2_g128", "k4v4_g64", "k2v2_g128"])
def test_exact_rounding_ties_round_half_to_even(preset, isa, rng):
    """SPEC §4 rounds half to even. The oracle comparison forgives a code off by one near a tie (float32
    against float64 quotients), so it cannot see the rule itself: here every quotient is exact. The input is
    H·y for integer rows y (head_dim 64: H's 1/8 and the butterflies are exact in float32), iters=0 keeps
    r = c = 1, and each row spans 2·qmax, so scale = 2 and every odd offset from the row minimum is a tie."""
    p = kvarn.PRESETS[preset]
    D, G = 64, p.group

    def rows(n, length, qmax):  # integer rows spanning exactly 2*qmax, ends present, odd offsets common
        lo = rng.integers(-10, 10, (n, 1))
        y = lo + rng.integers(0, 2 * qmax + 1, (n, length))
        y[:, 0], y[:, 1] = lo[:, 0], lo[:, 0] + 2 * qmax
        return y.astype(np.float64)

    yk = rows(D, G, 2**p.kbits - 1).T  # keys: rows are channels over the tile's tokens -> y[t, d]
    yv = rows(G, D, 2**p.vbits - 1)  # values: rows are tokens over channels
    H = oracle.hadamard_matrix(D)
    k, v = (y @ H for y in (yk, yv))  # multiples of 1/8, exact in float32; the kernel's rotation gives y back
    assert np.array_equal(kvarn.hadamard(k.astype(np.float32)), yk.astype(np.float32))
    tile = kvarn.quantize_tile(k.astype(np.float32), v.astype(np.float32), p, iters=0)
    f = tile.fields()
    for name, y, bits, axis in (("k", yk.T, p.kbits, 1), ("v", yv, p.vbits, 1)):
        q = (y - y.min(axis=axis, keepdims=True)) / 2.0  # exact quotients
        ties = q - np.floor(q) == 0.5
        assert ties.sum() > y.size // 8 and (np.floor(q + 0.5) != np.rint(q)).sum() > y.size // 20  # not vacuous
        codes = kvarn.unpack_codes(f[f"{name}_codes"][0], bits)
        np.testing.assert_array_equal(codes, np.rint(q), err_msg=f"{name}: exact ties must round half to even")
        a, z = ("ka", "kz") if name == "k" else ("va", "vz")
        np.testing.assert_array_equal(f[a][0].astype(np.float32), 2.0)
        np.testing.assert_array_equal(f[z][0].astype(np.float32), y.min(axis=axis))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("d", [64, 128, 96])
def test_codes_and_scales_match_oracle(preset, d, isa, rng):
    p = kvarn.PRESETS[preset]
    k = kv_like(rng, (p.group, d))
    v = kv_like(rng, (p.group, d), 0)
    tile = kvarn.quantize_tile(k, v, preset)
    assert_fields_match_oracle(fields_for(tile, 0), oracle.quantize_tile(k, v, p.kbits, p.vbits))


@pytest.mark.parametrize("preset", ["k4v2_g64", "k4v4_g128"])
def test_tied_candidates_go_to_the_later_one(preset, isa):
    """SPEC §3 keeps the later of tied candidates. A ±0.5 checkerboard ties every candidate exactly
    (imbalance 2: all rows and columns alike), and the clamp makes every round's candidate r = c =
    e^-0.3, so the rule decides between that and the identity. Fed as the rotation of a checkerboard
    with head_dim 64 (Hadamard scale 1/8, so the kernels' rotation gives it back exactly), the
    quantiser balances the checkerboard itself. Keeping the first of the ties (a mutant of both the
    scalar and the SIMD quantiser, which no other test caught) stores the identity's scales."""
    p = kvarn.PRESETS[preset]
    i, j = np.indices((p.group, 64))
    board = 0.5 * (-1.0) ** (i + j)
    r, c = kvarn._ops.balance_scales(board.astype(np.float32))
    r_ref, c_ref, imb, imb_identity = oracle.balance(board)
    assert imb == imb_identity == 2.0 and np.allclose(r_ref, np.exp(-0.3)) and np.allclose(c_ref, np.exp(-0.3))
    np.testing.assert_allclose(r, r_ref, rtol=1e-6)
    np.testing.assert_allclose(c, c_ref, rtol=1e-6)
    x = oracle.rotate(board).astype(np.float32)
    assert np.array_equal(kvarn._ops.hadamard(x), board)  # the quantiser sees the checkerboard exactly
    tile = kvarn.quantize_tile(x, x, preset)
    assert_fields_match_oracle(fields_for(tile, 0), oracle.quantize_tile(x, x, p.kbits, p.vbits))


@pytest.mark.parametrize("iters", [0, 1, 3])
def test_iters_matches_oracle(iters, rng):
    # iters is public (quantize_tile, KVCache, from_parts); comparing scalar with SIMD at equal
    # iters cannot see it ignored, so compare with the oracle run for the same number of rounds.
    p = kvarn.PRESETS["k4v2_g128"]
    k = kv_like(rng, (2, p.group, 64))
    v = kv_like(rng, (2, p.group, 64), 0) * np.exp(rng.standard_normal((1, p.group, 1))).astype(np.float32)
    tile = kvarn.quantize_tile(k, v, p, iters=iters)
    for h in range(2):
        f = fields_for(tile, h)
        assert_fields_match_oracle(f, oracle.quantize_tile(k[h], v[h], p.kbits, p.vbits, iters=iters))
        if iters == 0:  # no rounds: the identity is the only candidate
            assert (f["kt"] == 1).all() and (f["vc"] == 1).all()
    # The rounds change the result (else this test could not tell them apart): 8 differs from each.
    assert not np.array_equal(tile.records, kvarn.quantize_tile(k, v, p).records)


@pytest.mark.parametrize("rows, cols", [(128, 128), (64, 128), (128, 64), (256, 128), (17, 33)])
def test_balance_matches_oracle_and_beats_identity(rows, cols, rng):
    x = rng.standard_normal((rows, cols)) * np.exp(rng.standard_normal((rows, 1))) * np.exp(rng.standard_normal((1, cols)))
    x = x.astype(np.float32)
    r, c = kvarn._ops.balance_scales(x)
    r_ref, c_ref, imb_ref, imb_identity = oracle.balance(x)
    np.testing.assert_allclose(r, r_ref, rtol=1e-4)
    np.testing.assert_allclose(c, c_ref, rtol=1e-4)
    balanced = x / c[None, :] / r[:, None]
    # balanced * r * c reproduces the tile
    np.testing.assert_allclose(balanced * c[None, :] * r[:, None], x, rtol=1e-6, atol=1e-6)
    # never worse than the identity
    assert oracle._imbalance(balanced.astype(np.float64)) <= imb_identity * (1 + 1e-6)
    assert (r >= np.exp(-0.3) * (1 - 1e-6)).all() and (c >= np.exp(-0.3) * (1 - 1e-6)).all()


@pytest.mark.parametrize("axis", [0, 1])
def test_balance_matches_oracle_when_means_dominate(axis, rng):
    # Rows (axis 1) or columns (axis 0) with means ~10^4 x their spread: one-pass float sums
    # would cancel to noise here, so the statistics must take their double path.
    shape = (64, 128)
    offset = rng.uniform(-300, 300, (1, 128) if axis == 0 else (64, 1))
    x = (offset * (1 + 0.003 * rng.standard_normal(shape)) + 0.03 * rng.standard_normal(shape)).astype(np.float32)
    r, c = kvarn._ops.balance_scales(x)
    r_ref, c_ref, imb_ref, _ = oracle.balance(x)
    # r (x) c is fixed only up to one factor: the imbalance is unchanged by scaling the whole tile, so
    # converged candidates alpha * r (x) c tie exactly and float32 vs float64 rounding picks one (and
    # quantisation is the same for any alpha). Measured over 300 seeds: axis 0 alpha = 1 always; axis 1
    # alpha = e^-0.3 / 1 / e^0.3 in 83 / 159 / 58 seeds (the one-factor check here held only for its
    # seed). With alpha removed, r (x) c matches to 6.8e-7 (max), the imbalance to 2.4e-5 (max).
    ratio = np.outer(r, c) / np.outer(r_ref, c_ref)
    alpha = np.median(ratio)
    assert np.min(np.abs(np.log(alpha) - np.array([-0.3, 0.0, 0.3]))) < 1e-4, alpha
    np.testing.assert_allclose(ratio, alpha, rtol=1e-4)
    imb = oracle._imbalance(x.astype(np.float64) / c[None, :] / r[:, None])
    assert abs(imb / imb_ref - 1) < 1e-4, (imb, imb_ref)


@pytest.mark.parametrize("rows, cols", [(2, 2), (2, 5), (3, 2)])
def test_balance_tiny_matrices_never_worse_than_identity(rows, cols, rng):
    # Tiny matrices reach exact imbalance ties, where float32 and float64 may pick different
    # (equally good) candidates, so only the guarantee is checked here.
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    r, c = kvarn._ops.balance_scales(x)
    _, _, _, imb_identity = oracle.balance(x)
    assert oracle._imbalance((x / c[None, :] / r[:, None]).astype(np.float64)) <= imb_identity * (1 + 1e-5)


def test_balance_strongly_imbalanced_tile_improves(rng):
    x = (rng.standard_normal((128, 128)) * np.logspace(-2, 2, 128)[None, :]).astype(np.float32)
    r, c = kvarn._ops.balance_scales(x)
    _, _, imb, imb_identity = oracle.balance(x)
    b = x / c[None, :] / r[:, None]
    assert oracle._imbalance(b.astype(np.float64)) < 0.1 * imb_identity


@pytest.mark.parametrize("preset", PRESETS)
def test_rtn_error_bound_in_balanced_domain(preset, isa, rng):
    """|b - b̂| <= scale/2 per element, checked in the rotated frame through the stored fp16 vectors:
    X - X̂ = r c (b - b̂) so |X - X̂| <= kt*ka/2 (K) plus fp16 rounding of the stored vectors."""
    p = kvarn.PRESETS[preset]
    k = kv_like(rng, (p.group, 128))
    v = kv_like(rng, (p.group, 128), 0)
    f = fields_for(kvarn.quantize_tile(k, v, preset), 0)
    qk, qv = 2**p.kbits - 1, 2**p.vbits - 1
    xk = oracle.rotate(k).T  # [D, G]
    k_hat = (f["k_codes"] * f["ka"][:, None] + f["kz"][:, None]) * f["kt"][None, :]
    bound_k = f["kt"][None, :] * (np.abs(f["ka"][:, None]) / 2 + FP16_REL * (qk * np.abs(f["ka"][:, None]) + np.abs(f["kz"][:, None]))) + FP16_REL * np.abs(xk)
    assert (np.abs(xk - k_hat) <= bound_k + 1e-7).all()
    xv = oracle.rotate(v)  # [G, D]
    v_hat = (f["v_codes"] * f["va"][:, None] + f["vz"][:, None]) * f["vc"][None, :]
    bound_v = f["vc"][None, :] * (np.abs(f["va"][:, None]) / 2 + FP16_REL * (qv * np.abs(f["va"][:, None]) + np.abs(f["vz"][:, None]))) + FP16_REL * np.abs(xv)
    assert (np.abs(xv - v_hat) <= bound_v + 1e-7).all()


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("d", [64, 80, 128, 192, 256])
def test_dequantize_matches_oracle_decoder(preset, d, isa, rng):
    p = kvarn.PRESETS[preset]
    k = kv_like(rng, (3, p.group, d))
    v = kv_like(rng, (3, p.group, d), 0)
    tile = kvarn.quantize_tile(k, v, preset)
    k_hat, v_hat = kvarn.dequantize_tile(tile)
    assert k_hat.shape == k.shape and k_hat.dtype == np.float32
    for h in range(3):
        kr, vr = oracle.dequantize_record(tile.records[h], p.kbits, p.vbits, p.group, d)
        np.testing.assert_allclose(k_hat[h], kr, atol=1e-4 * np.abs(kr).max())
        np.testing.assert_allclose(v_hat[h], vr, atol=1e-4 * np.abs(vr).max())
    # Quantisation error is that of a b-bit quantiser, not a broken one.
    rel_k = np.linalg.norm(k_hat - k) / np.linalg.norm(k)
    rel_v = np.linalg.norm(v_hat - v) / np.linalg.norm(v)
    assert rel_k < {2: 0.6, 4: 0.15}[p.kbits]
    assert rel_v < {2: 0.6, 4: 0.15}[p.vbits]


def test_normalisation_beats_plain_rtn_on_outlier_channels(rng):
    """The point of the method: with outlier channels, KVarN's key error is below per-channel RTN without it."""
    k = kv_like(rng, (128, 128), outlier_channels=6) * np.exp(rng.standard_normal((128, 1))).astype(np.float32)
    v = kv_like(rng, (128, 128), 0)
    k_hat, _ = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, "k2v2_g128"))
    codes, scale, lo, _ = oracle.rtn(k.T.astype(np.float64), 2)
    kivi = (codes * scale[:, None] + lo[:, None]).T
    assert np.linalg.norm(k_hat - k) < np.linalg.norm(kivi - k)


@given(st.sampled_from([2, 4, 8]), st.integers(1, 5), st.integers(1, 8), st.integers(0, 2**32 - 1))
def test_pack_unpack_round_trip(bits, rows, groups, seed):
    n = groups * (8 // bits) * 4
    codes = np.random.default_rng(seed).integers(0, 2**bits, size=(rows, n)).astype(np.uint8)
    packed = kvarn.pack_codes(codes, bits)
    assert packed.shape == (rows, n * bits // 8)
    np.testing.assert_array_equal(kvarn.unpack_codes(packed, bits), codes)


def test_nibble_order():
    # 4-bit: even index in the low nibble; 2-bit: index i at shift 2*(i%4).
    assert kvarn.pack_codes(np.array([[1, 2]]), 4)[0, 0] == 0x21
    assert kvarn.pack_codes(np.array([[1, 2, 3, 0]]), 2)[0, 0] == 0b00111001


def test_packing_in_records_is_spec_order(rng):
    """Native packing equals pack_codes of the unpacked codes (a round trip through the record)."""
    k = kv_like(rng, (128, 128))
    tile = kvarn.quantize_tile(k, k, "k4v2_g128")
    views = tile.fields()
    np.testing.assert_array_equal(kvarn.pack_codes(tile.k_codes(), 4), views["k_codes"])
    np.testing.assert_array_equal(kvarn.pack_codes(tile.v_codes(), 2), views["v_codes"])


@given(st.sampled_from(PRESETS), st.sampled_from([16, 48, 64, 112, 128]), st.integers(1, 3),
       st.floats(1e-3, 1e3), st.integers(0, 2**32 - 1))
@example("k4v2_g128", 16, 1, 2.0, 2104153)  # 0.205: beyond the 300-seed bound of 0.2 that a long search broke
def test_round_trip_relative_error_bounded(preset, d, heads, magnitude, seed):
    p = kvarn.PRESETS[preset]
    rng = np.random.default_rng(seed)
    k = (kv_like(rng, (heads, p.group, d)) * magnitude).astype(np.float32)
    v = (rng.standard_normal((heads, p.group, d)) * magnitude).astype(np.float32)
    k_hat, v_hat = kvarn.dequantize_tile(kvarn.quantize_tile(k, v, preset))
    k_err = np.linalg.norm(k_hat - k) / np.linalg.norm(k)
    v_err = np.linalg.norm(v_hat - v) / np.linalg.norm(v)
    # The error is the method's: SPEC's float64 reconstruction (folded vectors unrounded) has the same, to 9.0e-4
    # relative over 6,000 tensors of these inputs (median 7e-5; the fp16 vectors and fp32 arithmetic).
    spec = [oracle.round_trip(k[h], v[h], p.kbits, p.vbits) for h in range(heads)]
    k_spec = np.linalg.norm(np.stack([s[0] for s in spec]) - k) / np.linalg.norm(k)
    v_spec = np.linalg.norm(np.stack([s[1] for s in spec]) - v) / np.linalg.norm(v)
    assert abs(k_err / k_spec - 1) < 5e-3 and abs(v_err / v_spec - 1) < 5e-3, (k_err, k_spec, v_err, v_spec)
    # And what it is: the largest errors over 120,000 seeds per (preset, head_dim) at one head (more heads average
    # down; results/zen4_2c_s90/round_trip_tails.log), with margin. 4-bit keys 0.1435 (head_dim 64), 2-bit 0.637;
    # values 0.53 (2-bit), 0.106 (4-bit). head_dim 16 with kv_like's 4 outlier channels (a 16-point rotation
    # spreads 25 % outliers into every channel) has a long tail: 4-bit keys 0.325, 2-bit 1.92 (p99.9 0.97), where
    # the balancing (SPEC §3) can make a tile worse than plain RTN of the rotated keys would (the tail run's
    # seed 2093: 1.63 against 0.50). The bounds of 300 seeds (0.2 / 0.9 at head_dim 16, 0.15 / 0.6 else) failed
    # under a long hypothesis search (the fiftieth session).
    k_bound = {2: 2.5, 4: 0.45}[p.kbits] if d == 16 else {2: 0.8, 4: 0.2}[p.kbits]
    assert k_err < k_bound
    assert v_err < {2: 0.6, 4: 0.15}[p.vbits]


def test_constant_tile_is_exact_enough():
    k = np.full((128, 64), 0.5, np.float32)
    k_hat, v_hat = kvarn.dequantize_tile(kvarn.quantize_tile(k, k))
    np.testing.assert_allclose(k_hat, k, atol=2e-3)
    np.testing.assert_allclose(v_hat, k, atol=2e-3)


def test_fp16_input_equals_fp32_of_same_values(rng):
    k = kv_like(rng, (128, 64)).astype(np.float16)
    a = kvarn.quantize_tile(k, k)
    b = kvarn.quantize_tile(k.astype(np.float32), k.astype(np.float32))
    np.testing.assert_array_equal(a.records, b.records)


# ---- serialisation ---------------------------------------------------------------
@pytest.mark.parametrize("preset", PRESETS)
def test_to_from_bytes_round_trip(preset, rng):
    p = kvarn.PRESETS[preset]
    tile = kvarn.quantize_tile(kv_like(rng, (2, p.group, 64)), kv_like(rng, (2, p.group, 64)), preset)
    back = kvarn.Tile.from_bytes(tile.to_bytes(), preset=preset)
    np.testing.assert_array_equal(back.records, tile.records)
    assert back.preset == tile.preset and back.head_dim == 64
    np.testing.assert_array_equal(kvarn.dequantize_tile(back)[0], kvarn.dequantize_tile(tile)[0])


def test_records_at_an_odd_address_dequantize(rng):
    """Records read straight out of a larger buffer (np.frombuffer at an odd offset) were accepted by
    from_records and then refused by dequantize_tile ("records buffer is not 2-byte aligned")."""
    tile = kvarn.quantize_tile(kv_like(rng, (2, 128, 64)), kv_like(rng, (2, 128, 64)))
    blob = b"x" + tile.records.tobytes()
    odd = np.frombuffer(blob, np.uint8, offset=1).reshape(tile.records.shape)
    assert odd.ctypes.data % 2
    wrapped = kvarn.Tile.from_records(odd, tile.preset, 64)
    for got, want in zip(kvarn.dequantize_tile(wrapped), kvarn.dequantize_tile(tile)):
        np.testing.assert_array_equal(got, want)


def _misaligned(x):
    """A copy of x whose data starts at an odd address (numpy marks it unaligned)."""
    out = np.frombuffer(b"x" + np.ascontiguousarray(x).tobytes(), x.dtype, offset=1).reshape(x.shape)
    assert out.ctypes.data % 2 and not out.flags.aligned
    return out


def test_misaligned_inputs_are_copied_not_refused(rng):
    """The native code refuses misaligned buffers (undefined behaviour in its scalar kernels); the
    Python layer copies them, so arrays read out of byte buffers work as before."""
    k, v = (kv_like(rng, (2, 128, 64)) for _ in range(2))
    for dtype in (np.float32, np.float16):
        tile = kvarn.quantize_tile(k.astype(dtype), v.astype(dtype))
        np.testing.assert_array_equal(
            kvarn.quantize_tile(_misaligned(k.astype(dtype)), _misaligned(v.astype(dtype))).records, tile.records)
        # quantize_tile widens fp16 to float32 (a fresh, aligned copy); the fp16 path itself is reached here
        p = kvarn.PRESETS["k4v2_g128"]
        np.testing.assert_array_equal(
            kvarn._ops.quantize_tiles_native(_misaligned(k.astype(dtype)), _misaligned(v.astype(dtype)), p, 8, 1),
            kvarn._ops.quantize_tiles_native(k.astype(dtype), v.astype(dtype), p, 8, 1))
    cache, odd = kvarn.KVCache(2, 64), kvarn.KVCache(2, 64)
    k, v = (kv_like(rng, (2, 128 + 2 * 128 + 5, 64)) for _ in range(2))  # tiles quantised from the input itself
    cache.append(k, v)
    odd.append(_misaligned(k), _misaligned(v))
    np.testing.assert_array_equal(odd.records, cache.records)
    q = rng.standard_normal((4, 64)).astype(np.float32)
    np.testing.assert_array_equal(kvarn.attend(_misaligned(q), cache), kvarn.attend(q, cache))
    np.testing.assert_array_equal(kvarn.hadamard(_misaligned(q)), kvarn.hadamard(q))


def test_from_bytes_rejects_corruption(rng):
    tile = kvarn.quantize_tile(kv_like(rng, (128, 64)), kv_like(rng, (128, 64)))
    data = tile.to_bytes()
    with pytest.raises(ValueError, match="data: expected"):
        kvarn.Tile.from_bytes(data[:-1])
    with pytest.raises(ValueError, match="data: expected"):
        kvarn.Tile.from_bytes(data + b"\0")
    with pytest.raises(ValueError, match="magic"):
        kvarn.Tile.from_bytes(b"X" + data[1:])
    with pytest.raises(ValueError, match="shorter"):
        kvarn.Tile.from_bytes(data[:5])
    with pytest.raises(ValueError, match="preset"):
        kvarn.Tile.from_bytes(data, preset="k4v4_g128")
    with pytest.raises(TypeError, match="data"):
        kvarn.Tile.from_bytes("text")
    # A NaN written into a scale vector (kt of head 0) is caught.
    bad = bytearray(data)
    kt_off = kvarn._native.record_layout(4, 2, 128, 64)["kt"] + kvarn.tile._HEADER.size
    bad[kt_off : kt_off + 2] = np.array([np.nan], np.float16).tobytes()
    with pytest.raises(ValueError, match="corrupt tile record: field kt"):
        kvarn.Tile.from_bytes(bytes(bad))
    # Header claiming an unsupported head_dim or format.
    hdr = bytearray(data)
    hdr[13:15] = (100).to_bytes(2, "little")  # head_dim field (after magic, version, kbits, vbits, group)
    with pytest.raises(ValueError, match="head_dim"):
        kvarn.Tile.from_bytes(bytes(hdr))
    hdr = bytearray(data)
    hdr[9] = 3  # kbits
    with pytest.raises(ValueError, match="unknown format"):
        kvarn.Tile.from_bytes(bytes(hdr))
    # kt and vc (the per-token and per-channel scales) must be positive: zero or negative is corrupt.
    layout = kvarn._native.record_layout(4, 2, 128, 64)
    for field in ("kt", "vc"):
        for value in (0.0, -1.5):
            bad = bytearray(data)
            off = layout[field] + kvarn.tile._HEADER.size + 2 * 7  # entry 7 of head 0
            bad[off : off + 2] = np.array([value], np.float16).tobytes()
            with pytest.raises(ValueError, match=f"field {field} must be positive"):
                kvarn.Tile.from_bytes(bytes(bad))
    # ka and va (r·scale) must not be negative (the integer value sums assume p·va >= 0); zero is fp16's
    # rounding of a tiny product and is accepted.
    for field in ("ka", "va"):
        bad = bytearray(data)
        off = layout[field] + kvarn.tile._HEADER.size + 2 * 7
        bad[off : off + 2] = np.array([-1.5], np.float16).tobytes()
        with pytest.raises(ValueError, match=f"field {field} must not be negative"):
            kvarn.Tile.from_bytes(bytes(bad))
        bad[off : off + 2] = np.array([0.0], np.float16).tobytes()
        kvarn.Tile.from_bytes(bytes(bad))
    # Garbage after a valid header: either rejected with ValueError, or a record whose scales are
    # all finite (kt, vc > 0) and that dequantises to finite values -- never a crash.
    header = data[: kvarn.tile._HEADER.size]
    outcomes = set()
    for seed in range(50):
        body = np.random.default_rng(seed).integers(0, 256, size=len(data) - len(header), dtype=np.uint8)
        if seed % 2:  # half of them with sane fp16 exponents, so some records pass validation
            body[1::2] &= 0x3B
        try:
            t = kvarn.Tile.from_bytes(header + body.tobytes())
        except ValueError as e:
            assert str(e).startswith("data: corrupt tile record"), e
            outcomes.add("rejected")
            continue
        kd, vd = kvarn.dequantize_tile(t)
        assert np.isfinite(kd).all() and np.isfinite(vd).all()
        outcomes.add("accepted")
    assert outcomes == {"rejected", "accepted"}


# ---- bad input ---------------------------------------------------------------------
def test_bad_tile_input(rng):
    good = kv_like(rng, (128, 64))
    cases = [
        (dict(k=good.astype(np.int16), v=good), TypeError, "k: dtype"),
        (dict(k=good, v=good[:64]), ValueError, "v: shape"),
        (dict(k=good[:100], v=good[:100]), ValueError, "128 tokens"),
        (dict(k=good[:, :40], v=good[:, :40]), ValueError, "head_dim"),
        (dict(k=good[None, None], v=good[None, None]), ValueError, "k: expected a 2-D or 3-D"),
        (dict(k=np.where(np.eye(128, 64) > 0, np.nan, good).astype(np.float32), v=good), ValueError, "k: contains NaN"),
        (dict(k=good, v=np.full_like(good, np.inf)), ValueError, "v: contains NaN or Inf"),
        (dict(k=good * 1e5, v=good), ValueError, "fp16 range"),
        (dict(k=good, v=good, preset="k3v3"), ValueError, "preset"),
    ]
    for kwargs, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            kvarn.quantize_tile(**kwargs)


def test_pack_codes_checks_bits_and_range():
    np.testing.assert_array_equal(kvarn.unpack_codes(kvarn.pack_codes(np.array([15, 0, 3, 7]), 4), 4), [15, 0, 3, 7])
    with pytest.raises(ValueError, match=r"codes: values must be in \[0, 15\]"):
        kvarn.pack_codes(np.array([16, 0]), 4)
    with pytest.raises(ValueError, match=r"codes: values must be in \[0, 3\]"):
        kvarn.pack_codes(np.array([-1, 0, 0, 0]), 2)
    with pytest.raises(ValueError, match="codes: last axis 3 is not a multiple of 2"):
        kvarn.pack_codes(np.array([1, 2, 3]), 4)
    with pytest.raises(TypeError, match="codes: expected an integer array"):
        kvarn.pack_codes(np.array([0.5, 1.0]), 4)
    for bits, exc, msg in ((3, ValueError, "bits: must be one of"), (0, ValueError, "bits: must be one of"),
                           (4.0, TypeError, "bits: expected an int"), (True, TypeError, "bits: expected an int"),
                           ("4", TypeError, "bits: expected an int")):
        with pytest.raises(exc, match=msg):
            kvarn.pack_codes(np.zeros(8, np.uint8), bits)
        with pytest.raises(exc, match=msg):
            kvarn.unpack_codes(np.zeros(2, np.uint8), bits)
    with pytest.raises(TypeError, match="packed: expected a uint8 array"):
        kvarn.unpack_codes(np.zeros(2, np.float32), 4)


def test_unpack_codes_takes_what_pack_codes_takes():
    """pack_codes takes any integer array-like; unpack_codes refused a list of bytes (np.asarray gives int64)
    with a TypeError about uint8. Any integers in [0, 255] are bytes now; other values and non-integers are
    refused, naming packed, and the input is left as it was."""
    np.testing.assert_array_equal(kvarn.unpack_codes([0x21, 0xF0], 4), [1, 2, 0, 15])
    np.testing.assert_array_equal(kvarn.unpack_codes([[0b00111001]], 2), [[1, 2, 3, 0]])
    assert kvarn.unpack_codes((0x21,), 4).dtype == np.uint8
    codes = np.random.default_rng(0).integers(0, 16, size=(3, 8))
    np.testing.assert_array_equal(kvarn.unpack_codes(kvarn.pack_codes(codes.tolist(), 4).tolist(), 4), codes)
    for dtype in (np.int16, np.int32, np.int64, np.uint16, np.uint64):
        packed = np.array([[0x21, 0xF0]], dtype)
        np.testing.assert_array_equal(kvarn.unpack_codes(packed, 4), [[1, 2, 0, 15]])
        assert packed.dtype == dtype and packed.tolist() == [[0x21, 0xF0]]
    for bad in ([256, 0], [0, -1], np.array([1, 300], np.int32)):
        with pytest.raises(ValueError, match=r"^packed: values must be in \[0, 255\] \(bytes\), got \[-?\d+, \d+\]"):
            kvarn.unpack_codes(bad, 4)
    for bad in ([1.0, 2.0], np.array([1, 2], np.float64), [True, False], [2**70], 7, []):
        with pytest.raises(TypeError, match="^packed: expected a uint8 array"):
            kvarn.unpack_codes(bad, 4)


def test_tile_round_trip_keeps_its_shape_and_reads_version_1(rng):
    k2, v2 = kv_like(rng, (128, 64)), kv_like(rng, (128, 64))
    t2 = kvarn.quantize_tile(k2, v2)
    t3 = kvarn.quantize_tile(k2[None], v2[None])
    for t, shape in ((t2, (128, 64)), (t3, (1, 128, 64))):
        back = kvarn.Tile.from_bytes(t.to_bytes())
        assert kvarn.dequantize_tile(back)[0].shape == shape
        np.testing.assert_array_equal(back.records, t.records)
    # Bytes written before the flags byte existed (version 1) read back, as the [H, G, D] form.
    v1 = kvarn.tile._HEADER_V1.pack(b"KVARNTL1", 1, 4, 2, 128, 64, 1) + t2.records.tobytes()
    np.testing.assert_array_equal(kvarn.Tile.from_bytes(v1).records, t2.records)
    bad = bytearray(t3.to_bytes())
    bad[kvarn.tile._HEADER.size - 1] = 0x80  # an unknown flag
    with pytest.raises(ValueError, match="data: header flags 0x80"):
        kvarn.Tile.from_bytes(bytes(bad))
    with pytest.raises(ValueError, match=r"records: expected shape \[H, 13824\] \(H >= 1\)"):
        kvarn.Tile(np.zeros((0, 13824), np.uint8), "k4v2_g128", 128)
    with pytest.raises(ValueError, match="squeeze: a 2-D tile has one head"):
        kvarn.Tile(np.concatenate([t3.records, t3.records]), "k4v2_g128", 64, squeeze=True)
    # A custom (supported) format round-trips too.
    tc = kvarn.quantize_tile(k2[:64], v2[:64], kvarn.Preset("k2v4_g64", 2, 4, 64))
    assert kvarn.Tile.from_bytes(tc.to_bytes()).preset.name == "k2v4_g64"


def test_tile_built_from_unchecked_records_is_refused_when_read(rng):
    """Tile() wraps records as they are (from_records validates them); a NaN scale must then be refused by
    dequantize_tile, not returned as NaN values. squeeze is a bool, as every flag."""
    t = kvarn.quantize_tile(kv_like(rng, (2, 128, 64)), kv_like(rng, (2, 128, 64)))
    records = t.records.copy()
    ka = kvarn.Tile(records, t.preset, 64).fields()["ka"]
    ka[1, 3] = np.nan  # a view into records
    bad = kvarn.Tile(records, t.preset, 64)
    with pytest.raises(ValueError, match="tile: corrupt record"):
        kvarn.dequantize_tile(bad)
    with pytest.raises(ValueError, match="field ka holds NaN"):
        kvarn.Tile.from_records(records, t.preset, 64)
    assert all(np.isfinite(x).all() for x in kvarn.dequantize_tile(t))  # the intact tile still reads
    with pytest.raises(TypeError, match="squeeze: expected a bool"):
        kvarn.Tile(t.records, t.preset, 64, squeeze="no")


def test_tile_describing_fields_are_read_only_and_native_buffers_are_checked(rng):
    t = kvarn.quantize_tile(kv_like(rng, (128, 64)), kv_like(rng, (128, 64)))
    for name, value in (("records", np.zeros((20000, 1), np.uint8)), ("head_dim", 1024),
                        ("preset", kvarn.PRESETS["k8v8_g128"]), ("squeeze", False)):
        with pytest.raises(AttributeError):
            setattr(t, name, value)  # native reads are sized from these: they must keep matching
    # The wrappers themselves refuse buffers the native code would overrun (callers skipping _ops).
    k = np.zeros((3, 128, 64), np.float32)
    with pytest.raises(ValueError, match="records do not match"):
        kvarn._native.dequantize_tiles(np.zeros((3, 10), np.uint8), 4, 2, k, k.copy())
    with pytest.raises(ValueError, match="k and v differ"):
        kvarn._native.quantize_tiles(k, k[:2].copy(), 4, 2, 8, np.zeros((3, 10), np.uint8), 1)
    with pytest.raises(ValueError, match="records buffer does not fit"):
        kvarn._native.quantize_tiles(k, k.copy(), 4, 2, 8, np.zeros((3, 10), np.uint8), 1)
    # Records start 2-byte aligned (their fp16 fields are read as uint16): a view one byte in is refused.
    size = kvarn._native.record_layout(4, 2, 128, 64)["total"]
    odd = np.zeros(3 * size + 1, np.uint8)[1:].reshape(3, size)
    for call in (lambda: kvarn._native.quantize_tiles(k, k.copy(), 4, 2, 8, odd, 1),
                 lambda: kvarn._native.quantize_tiles_f16(*(np.zeros((3, 128, 64), np.uint16),) * 2, 4, 2, 8, odd, 1)):
        with pytest.raises(ValueError, match="not 2-byte aligned"):
            call()
    # Reading needs no alignment (the fields are read with memcpy): odd records dequantize as they are.
    even = np.zeros_like(odd)
    assert kvarn._native.quantize_tiles(kv_like(rng, (3, 128, 64)), kv_like(rng, (3, 128, 64)), 4, 2, 8, even, 1)[0] == 0
    odd[:] = even
    got, want = (np.zeros_like(k), np.zeros_like(k)), (np.zeros_like(k), np.zeros_like(k))
    assert kvarn._native.dequantize_tiles(odd, 4, 2, *got) == kvarn._native.dequantize_tiles(even, 4, 2, *want) == 0
    for x, y in zip(got, want):
        np.testing.assert_array_equal(x, y)
    cache = kvarn.KVCache(1, 64, sink_tokens=0)
    cache.append(kv_like(rng, (1, 128, 64)), kv_like(rng, (1, 128, 64)))
    parts = dict(cache._native_parts())
    shifted = np.zeros(parts["records"].nbytes + 1, np.uint8)[1:].reshape(parts["records"].shape)
    shifted[:] = parts["records"]
    parts["records"] = shifted
    with pytest.raises(ValueError, match="cache view: records buffer is not 2-byte aligned"):
        kvarn._native.attend([parts], np.zeros((1, 1, 64), np.float32), 0.125, np.zeros((1, 1, 64), np.float32), 1)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_native_hadamard_checks_the_row_width(dtype):
    # A 1-row view of a wider buffer, transformed as rows of 32: the core wrote into row 1.
    big = np.zeros((4, 16), dtype)
    big[1:] = 7
    fn = kvarn._native.hadamard_f32 if dtype == np.float32 else kvarn._native.hadamard_f64
    with pytest.raises(ValueError, match="rows hold 16 values, not head_dim=32"):
        fn(big[:1], 32)
    assert (big[0] == 0).all() and (big[1:] == 7).all()
    assert fn(big[:1], 16) == kvarn._native.OK


def test_hadamard_overflow_is_an_error_not_inf():
    for x in (np.full((1, 64), 1e308), np.full((2, 48), 3e38, np.float32)):  # finite in, inf out
        with pytest.raises(ValueError, match="^x: values up to .* overflow the float(64|32) transform"):
            kvarn.hadamard(x)
    # Large, but the result fits: computed (the result is checked, not only max |x|).
    one_hot = np.zeros((1, 64))
    one_hot[0, 5] = 1e308
    assert np.isfinite(kvarn.hadamard(one_hot)).all()
    assert np.isfinite(kvarn.hadamard(np.full((1, 64), 1e306))).all()


def test_array_likes_that_numpy_cannot_read_get_a_named_error():
    torch = pytest.importorskip("torch")  # installed with the eval extra, as in CI
    x = torch.randn(1, 3, 16, device="meta")  # no data to read (bfloat16, refused before, is now widened)
    with pytest.raises(TypeError, match="k: cannot be read as a numpy array"):
        kvarn.KVCache(1, 16).append(x, x)


def test_scale_overflow_is_an_error_not_garbage():
    # In fp16 range, but a constant channel of 60000 rotates to 60000*sqrt(64): kz overflows fp16.
    k = np.full((128, 64), 60000.0, np.float32)
    with pytest.raises(ValueError, match="too large"):
        kvarn.quantize_tile(k, k)
