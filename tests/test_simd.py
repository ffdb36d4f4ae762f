"""SIMD kernels against the scalar spec, on every ISA this machine has.

- Hadamard and quantised tile records must be bit-identical to scalar.
- Attention may reassociate: its error against a float64 reference of the
  same (dequantised) cache must stay within 2x the scalar path's own error
  (+ a small floor), like flash-attention's rule for its kernels.
- Lengths and head counts are chosen to break vector tails and head groups.
- KVARN_ISA / KVARN_SCORES are checked in subprocesses (they are read once).
"""
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

import kvarn
from conftest import ALL_ISAS, skip_unless_available
import oracle
from oracle import attention as reference  # float64 softmax(q k^T scale) v with GQA, k/v [Hk, n, D], q [Hq, D]
from kvarn import _native, _ops
from kvarn.fp16cache import FP16Cache, attend_fp16_batch

ISAS = kvarn.available_isas()
SIMD_ISAS = [i for i in ISAS if i != "scalar"]
ODD_LENGTHS = [1, 2, 3, 7, 15, 17, 31, 33, 127, 129, 255, 257, 300, 385]
HAS_VNNI = _native.cpu_has_vnni() and "avx512" in ISAS
# The ISAs whose kernels run each integer mode (dispatch.cpp's score_mode()).
MODE_ISAS = {
    "float": SIMD_ISAS,
    "int16": SIMD_ISAS,  # vpdpwssd with VNNI, else vpmaddwd + vpaddd
    # avx2: vpdpbusd with AVX-VNNI, else vpmaddubsw + vpaddw; avx512 only with VNNI (int16 runs without it)
    "int8": ["avx2"] * ("avx2" in ISAS) + ["avx512"] * HAS_VNNI,
}


@pytest.mark.parametrize("isa, mode", [("avx512", "int16"), ("avx512", "int8"), ("avx2", "int16"), ("avx2", "int8")])
def test_loops_over_isas_include(isa, mode, rng):
    """Most tests here compare every ISA and score mode present with scalar inside one test, so an ISA
    this CPU lacks leaves no trace in their ids; this says, by name under -rs, which kernels and modes
    they could not run here. Where the CPU has them: the loops include them, the dispatch runs that
    mode, and its output is within the mode's stated error of float64 attention."""
    skip_unless_available(isa)
    if isa == "avx512" and mode == "int8" and not HAS_VNNI:
        pytest.skip("avx512 int8 scores (vpdpbusd) not run: this CPU has no AVX-512 VNNI")
    assert isa in SIMD_ISAS and isa in MODE_ISAS[mode]
    c = _cache(rng, "k4v2_g128", 2, 128, 700)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    ref = reference(q, *c.dequantize(), 1 / np.sqrt(128))
    _native.set_score_mode(mode)
    out = run_isa(isa, kvarn.attend, q, c)
    assert _native.score_mode() == mode  # the kernels run the mode asked for, not a fallback
    l2 = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    assert l2 < {"int16": 1.5e-3, "int8": 0.12}[mode], l2  # one draw: the gross-error bounds


def simd_isas():
    """The SIMD ISAs to compare with scalar; skips the test where there are none (a loop over an empty list
    would pass having compared nothing). CI requires avx2 (KVARN_REQUIRE_ISAS, conftest.py)."""
    if not SIMD_ISAS:
        pytest.skip("no SIMD ISA on this CPU: nothing to compare with the scalar kernels")
    return SIMD_ISAS


@pytest.fixture(autouse=True)
def restore_isa():
    before = kvarn.active_isa()
    mode = _native.score_mode()
    yield
    kvarn.set_isa(before)
    _native.set_score_mode(mode)


def run_isa(isa, fn, *args, **kw):
    kvarn.set_isa(isa)
    return fn(*args, **kw)


def rel_err(a, ref):
    return float(np.abs(a - ref).max() / max(np.abs(ref).max(), 1e-30))


def keys(rng, shape):
    x = rng.standard_normal(shape)
    x[..., : min(4, shape[-1])] *= 8.0  # a few outlier channels, as real keys have
    return x.astype(np.float32)


# ---- dispatch -------------------------------------------------------------------------
def test_isas_listed():
    assert ISAS[0] == "scalar"
    assert kvarn.active_isa() in ISAS
    assert kvarn.active_isa() == ISAS[-1] or os.environ.get("KVARN_ISA")


def test_set_isa_errors():
    with pytest.raises(ValueError, match=r"^name: unknown ISA 'sse9'; choose one of"):
        kvarn.set_isa("sse9")
    for name in ("avx2", "avx512"):
        if name not in ISAS:
            with pytest.raises(ValueError, match=f"^name: ISA '{name}' is not available here .*not supported"):
                kvarn.set_isa(name)


def _py(code, **env):
    e = dict(os.environ)
    e.pop("KVARN_ISA", None)
    e.pop("KVARN_SCORES", None)
    e.update(env)
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, cwd="/")


@pytest.mark.parametrize("isa", ALL_ISAS)
def test_env_forces_isa(isa):
    skip_unless_available(isa)
    r = _py("import kvarn; print(kvarn.active_isa())", KVARN_ISA=isa)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == isa


def test_env_unknown_isa_is_error():
    r = _py("import kvarn", KVARN_ISA="sse9")
    assert r.returncode != 0
    assert "not a known ISA" in r.stderr
    # The error text quotes the variable: bytes that are not UTF-8 gave a UnicodeDecodeError instead
    r = _py("import kvarn", KVARN_ISA=b"\xffavx2")
    assert r.returncode != 0
    assert "RuntimeError" in r.stderr and "KVARN_ISA=\ufffdavx2 is not a known ISA" in r.stderr, r.stderr


def test_env_unsupported_isa_is_error():
    unsupported = [i for i in ("avx2", "avx512") if i not in ISAS]
    for isa in unsupported:
        r = _py("import kvarn", KVARN_ISA=isa)
        assert r.returncode != 0
        assert "not supported" in r.stderr
    if not unsupported:  # this CPU runs every ISA: the detection must agree with the OS/CPU flags
        flags = open("/proc/cpuinfo").read().split()
        assert {"avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq"} <= set(flags)


@pytest.mark.parametrize("mode", ["float", "int16", "int8"])
def test_env_score_mode(mode):
    if mode != "float" and ISAS[-1] not in MODE_ISAS[mode]:
        pytest.skip(f"the default ISA ({ISAS[-1]}) does not run {mode}")
    r = _py("from kvarn import _native; print(_native.score_mode())", KVARN_SCORES=mode)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == mode


def test_score_mode_default_is_int16_where_the_kernels_run_it():
    code = "import kvarn; from kvarn import _native; print(kvarn.active_isa(), _native.score_mode())"
    for isa in ISAS:
        r = _py(code, KVARN_ISA=isa)
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [isa, "int16" if isa in MODE_ISAS["int16"] else "float"]


@pytest.mark.skipif("avx2" not in ISAS, reason="needs AVX2")
def test_avx2_runs_int8_and_scalar_runs_float():
    r = _py("import kvarn; from kvarn import _native; print(_native.score_mode())", KVARN_ISA="avx2",
            KVARN_SCORES="int8")
    assert r.stdout.strip() == "int8", r.stderr
    _native.set_score_mode("int8")
    kvarn.set_isa("scalar")
    assert _native.score_mode() == "float"
    kvarn.set_isa("avx2")
    assert _native.score_mode() == "int8"
    if "avx512" in ISAS:
        kvarn.set_isa("avx512")
        assert _native.score_mode() == ("int8" if HAS_VNNI else "int16")  # avx512's int8 needs vpdpbusd


def test_env_unknown_score_mode_is_error():
    r = _py("import kvarn", KVARN_SCORES="int4")
    assert r.returncode != 0 and "KVARN_SCORES='int4' is not a score mode" in r.stderr


def test_vnni_switch():
    for isa in simd_isas():
        kvarn.set_isa(isa)
        has = _native.cpu_has_vnni() if isa == "avx512" else _native.cpu_has_avx_vnni()
        try:
            _native.set_vnni(False)
            assert not _native.vnni()
            _native.set_score_mode("int8")
            # avx512's int8 needs vpdpbusd (int16 runs instead); avx2's has a vpmaddubsw form
            assert _native.score_mode() == ("int16" if isa == "avx512" else "int8")
        finally:
            _native.set_vnni(True)
        assert _native.vnni() == has  # on by default where the CPU has it


VNNI_ISAS = ["avx2"] * _native.cpu_has_avx_vnni() + ["avx512"] * HAS_VNNI


@pytest.mark.skipif(not VNNI_ISAS, reason="needs AVX-512 VNNI or AVX-VNNI (neither on this CPU)")
@pytest.mark.parametrize("mode", ["int16", "int8"])
@pytest.mark.parametrize("preset,Hk,D,Hq,n", [("k4v2_g128", 8, 128, 32, 4096 + 77), ("k4v2_g128", 3, 64, 9, 1000),
                                              ("k2v2_g128", 2, 48, 10, 700), ("k4v4_g64", 2, 256, 2, 333),
                                              ("k4v2_g128", 1, 16, 5, 300), ("k4v2_g64", 1, 1024, 3, 200)])
def test_int_vnni_and_madd_forms_are_bit_identical(mode, preset, Hk, D, Hq, n, rng):
    """vpdpwssd and vpmaddwd + vpaddd (int16), vpdpbusd and vpmaddubsw + vpaddw + vpmaddwd (avx2's
    int8) give the same int32 sums: the outputs match bit for bit, on every ISA whose VNNI this CPU
    has and that has both forms of the mode (the madd form is what CPUs without VNNI run)."""
    isas = [i for i in VNNI_ISAS if mode == "int16" or i == "avx2"]  # avx512's int8 has no madd form
    if not isas:
        pytest.skip(f"{mode}: no ISA here has both forms (avx2's int8 needs AVX-VNNI for its vpdpbusd form)")
    c = _cache(rng, preset, Hk, D, n)
    q = rng.standard_normal((Hq, D)).astype(np.float32)
    _native.set_score_mode(mode)
    for isa in isas:
        kvarn.set_isa(isa)
        try:
            _native.set_vnni(False)
            madd = kvarn.attend(q, c)
        finally:
            _native.set_vnni(True)
        assert _native.vnni() and _native.score_mode() == mode
        np.testing.assert_array_equal(madd, kvarn.attend(q, c), err_msg=isa)


HAS_VBMI = _native.cpu_has_vbmi() and "avx512" in ISAS


def test_vbmi_switch():
    for isa in simd_isas():
        kvarn.set_isa(isa)
        try:
            _native.set_vbmi(False)
            assert not _native.vbmi()
        finally:
            _native.set_vbmi(True)
        assert _native.vbmi() == (isa == "avx512" and _native.cpu_has_vbmi())  # on by default where the CPU has it
    kvarn.set_isa("scalar")
    assert not _native.vbmi()


@pytest.mark.skipif(not HAS_VBMI, reason="needs AVX-512 VBMI (not on this CPU)")
@pytest.mark.parametrize("mode,vnni", [("int16", True), ("int16", False), ("int8", True)],
                         ids=["int16-vnni", "int16-madd", "int8"])  # avx512's int8 runs only with VNNI
@pytest.mark.parametrize("preset,Hk,D,Hq,n", [("k4v2_g128", 3, 64, 9, 1000), ("k4v2_g128", 8, 128, 32, 700),
                                              ("k4v2_g64", 2, 80, 6, 500), ("k4v2_g128", 1, 96, 3, 450),
                                              ("k2v2_g128", 2, 112, 4, 400), ("k4v2_g64", 2, 256, 2, 333),
                                              ("k4v2_g128", 1, 48, 5, 300), ("k4v2_g128", 1, 288, 3, 300)])
def test_int_vbmi_and_insert_forms_are_bit_identical(mode, vnni, preset, Hk, D, Hq, n, rng):
    """The avx512 integer kernels' VBMI layouts (vpermb / vpermt2b for the 2-bit value codes' quads at head_dim
    <= 128, vpermb for the 4-bit key codes' pairs at head_dim <= 256) give the same integer sums as the forms of
    AVX-512 CPUs without VBMI: the outputs match bit for bit, with VNNI and in the vpmaddwd forms. head_dim
    48 and 288 take neither permute (the forms must agree there trivially)."""
    c = _cache(rng, preset, Hk, D, n)
    q = (rng.standard_normal((Hq, D)) * 3).astype(np.float32)
    kvarn.set_isa("avx512")
    _native.set_score_mode(mode)
    try:
        _native.set_vnni(vnni)
        _native.set_vbmi(False)
        insert = kvarn.attend(q, c, num_threads=2)
        _native.set_vbmi(True)
        assert _native.vbmi() and _native.score_mode() == mode
        np.testing.assert_array_equal(insert, kvarn.attend(q, c, num_threads=2))
    finally:
        _native.set_vnni(True)
        _native.set_vbmi(True)


def test_score_mode_api():
    assert _native.set_score_mode("bogus") == _native.ERR_ARGUMENT
    for isa in MODE_ISAS["int8"]:
        kvarn.set_isa(isa)
        assert _native.set_score_mode("int8") == _native.OK
        assert _native.score_mode() == "int8"
    if "avx2" not in ISAS:
        assert _native.set_score_mode("int8") == _native.ERR_ISA
    if "avx2" in ISAS:
        kvarn.set_isa("avx2")
        assert _native.set_score_mode("int16") == _native.OK
        assert _native.score_mode() == "int16"
    else:
        assert _native.set_score_mode("int16") == _native.ERR_ISA
        assert _native.score_mode() == "float"
    assert _native.set_score_mode("float") == _native.OK
    assert _native.score_mode() == "float"


# ---- Hadamard: bit-identical ----------------------------------------------------------------
@pytest.mark.parametrize("head_dim", [16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 1024])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 33])
def test_hadamard_identical(head_dim, rows, rng):
    x = rng.standard_normal((rows, head_dim)).astype(np.float32) * 10
    ref = run_isa("scalar", kvarn.hadamard, x)
    for isa in simd_isas():
        out = run_isa(isa, kvarn.hadamard, x)
        assert np.array_equal(out.view(np.uint32), ref.view(np.uint32)), isa


# ---- quantiser: bit-identical records -----------------------------------------------------
def _tiles(rng, kind, n, G, D):
    if kind == "gauss":
        k, v = keys(rng, (n, G, D)), rng.standard_normal((n, G, D)).astype(np.float32)
    elif kind == "scaled":  # channel and token scales spanning 4 decades
        k = rng.standard_normal((n, G, D)) * 10 ** rng.uniform(-2, 2, (n, 1, D)) * 10 ** rng.uniform(-1, 1, (n, G, 1))
        v = rng.standard_normal((n, G, D)) * 10 ** rng.uniform(-2, 2, (n, G, 1))
        k, v = k.astype(np.float32), v.astype(np.float32)
    elif kind == "fp16grid":  # values on the fp16 grid with many exact ties in rounding
        k = np.round(rng.standard_normal((n, G, D)) * 4).astype(np.float32)
        v = np.round(rng.standard_normal((n, G, D)) * 2).astype(np.float32)
    elif kind == "offset":  # means 10^4 x the spread: the statistics' float sums cancel (double fallback)
        k = (rng.uniform(-300, 300, (n, 1, D)) + 0.03 * rng.standard_normal((n, G, D))).astype(np.float32)
        v = (rng.uniform(-300, 300, (n, G, 1)) + 0.03 * rng.standard_normal((n, G, D))).astype(np.float32)
    elif kind == "signedzeros":  # +0 and -0 mixed: which zero a row minimum keeps was order-dependent (kz, vz)
        k = np.where(rng.random((n, G, D)) < 0.5, np.float32(-0.0), np.float32(0.0))
        v = np.where(rng.random((n, G, D)) < 0.5, np.float32(-0.0), np.float32(0.0))
        v[:, :, ::4] = rng.standard_normal((n, G, (D + 3) // 4))  # rows with zeros beside values too
    elif kind in ("large", "small"):  # stds ~4000 and ~1e-5: the balancing clamps them to [1e-3, 1e3] (h47)
        s = 4000.0 if kind == "large" else 1e-5
        k = (rng.standard_normal((n, G, D)) * s).astype(np.float32)
        v = (rng.standard_normal((n, G, D)) * s).astype(np.float32)
    else:  # degenerate: constant rows/columns and zeros (RTN scale floor, zero std)
        k = np.zeros((n, G, D), np.float32)
        k[:, :, ::3] = 1.5
        v = np.ones((n, G, D), np.float32)
        v[:, ::2] = 0
    return k, v


@pytest.mark.parametrize("preset", sorted(kvarn.PRESETS))
@pytest.mark.parametrize("head_dim", [16, 64, 80, 128, 256])
@pytest.mark.parametrize("kind", ["gauss", "scaled", "fp16grid", "offset", "degenerate", "signedzeros", "large", "small"])
def test_quantize_records_identical(preset, head_dim, kind, rng):
    p = _ops.get_preset(preset)
    k, v = _tiles(rng, kind, 3, p.group, head_dim)
    ref = run_isa("scalar", _ops.quantize_tiles_native, k, v, p, _ops.SINKHORN_ITERS, 1)
    for isa in simd_isas():
        rec = run_isa(isa, _ops.quantize_tiles_native, k, v, p, _ops.SINKHORN_ITERS, 1)
        diff = np.flatnonzero((rec != ref).any(axis=0))
        assert diff.size == 0, f"{isa}: {diff.size} record bytes differ, first at {diff[:5]}"


@pytest.mark.parametrize("iters", [0, 1, 3])
def test_quantize_identical_iters(iters, rng):
    p = _ops.get_preset("k4v2_g128")
    k, v = _tiles(rng, "scaled", 2, 128, 128)
    ref = run_isa("scalar", _ops.quantize_tiles_native, k, v, p, iters, 1)
    for isa in simd_isas():
        assert np.array_equal(run_isa(isa, _ops.quantize_tiles_native, k, v, p, iters, 2), ref), isa


@pytest.mark.parametrize("preset", ["k4v4_g64", "k8v8_g128"])
def test_codes_at_exact_half_integers(preset, rng):
    """Balanced values exactly halfway between two codes, under an RTN scale (15) whose float
    reciprocal moves most ties off the half-integer: every ISA must round them half to even, as the
    scalar's exact division does (the SIMD kernels multiply by 1/scale and divide only near
    half-integers, row_codes). With iters=0 the balanced tile is the rotated one, and at D 64 the
    Hadamard (±1/8) maps multiples of 15/2 to multiples of 15/16 exactly: the rotated tile is Y."""
    p = _ops.get_preset(preset)
    G, D, qmax = p.group, 64, (1 << p.kbits) - 1
    assert p.kbits == p.vbits
    scale = 15.0  # 3 would not do: its reciprocal's products round back onto every tie
    hi = scale * qmax
    Y = scale * (rng.integers(0, qmax, (G, D)) + 0.5)  # (y - 0) / scale = code + 1/2
    Y[0], Y[1] = 0.0, hi  # every column (a key row: a channel over tokens) spans [0, hi]
    Y[2:, 0], Y[2:, 1] = 0.0, hi  # every token row from 2 on (value rows) too; rows 0 and 1 are constant
    x = (Y @ oracle.hadamard_matrix(D)).astype(np.float32)  # H symmetric and orthonormal: rotates back to Y
    assert np.array_equal(x.astype(np.float64) @ oracle.hadamard_matrix(D), Y)  # exact in float32
    expected = np.round(Y / scale)  # numpy rounds half to even
    ties = Y / scale - np.floor(Y / scale) == 0.5
    assert ties.sum() > G * D // 2
    # Not vacuous: multiplied by the float reciprocal, most ties land off the half-integer.
    assert (np.float32(Y) * np.float32(1 / scale) != Y / scale)[ties].mean() > 0.5
    for isa in ISAS:
        t = kvarn.Tile(run_isa(isa, _ops.quantize_tiles_native, x[None], x[None], p, 0, 1), p, D)
        assert np.array_equal(t.k_codes()[0], expected.T), isa
        assert np.array_equal(t.v_codes()[0, 2:], expected[2:]), isa
        assert not t.v_codes()[0, :2].any(), isa  # constant rows: the scale floor, all codes 0


def _fp16_edge_values(rng, shape, scale=1.0):
    """float32 values hitting fp16 rounding's edge cases: exact ties between neighbours (ties to
    even), subnormals and their ties, values just under the largest fp16 (times scale), plus ordinary
    ones. scale, a power of two, multiplies all but the subnormal ties and keeps every tie a tie (a
    factor like 1e-3 left 2 ties of ~10,000 and no subnormal ones: h52's audit)."""
    ordinary = rng.standard_normal(shape) * scale
    f16 = (rng.standard_normal(shape) * scale).astype(np.float16)
    above = np.nextafter(f16, np.float16(np.inf))
    ties = (f16.astype(np.float64) + above.astype(np.float64)) / 2  # exactly halfway, representable in float32
    sub = rng.integers(-1023, 1024, shape) * 2.0**-24 + 2.0**-25  # subnormal ties
    big = rng.uniform(65000, 65519.99, shape) * np.sign(rng.standard_normal(shape)) * scale
    pick = rng.integers(0, 5, shape)
    return np.choose(pick, [ordinary, ties, sub, big, f16.astype(np.float64)]).astype(np.float32)


def _exact_fp16_ties(x):
    """How many float32 values lie exactly halfway between two fp16 neighbours."""
    x64 = x.astype(np.float64)
    lo = x.astype(np.float16)
    other = np.where(lo.astype(np.float64) <= x64, np.nextafter(lo, np.float16(np.inf)), np.nextafter(lo, np.float16(-np.inf)))
    return int(np.count_nonzero(np.abs(x64 - lo) == np.abs(other.astype(np.float64) - x64)))


@pytest.mark.parametrize("preset", ["k4v2_g128", "k2v2_g128", "k4v4_g64", "k8v8_g128"])
def test_quantize_fp16_inputs_give_the_float32_records(preset, rng):
    """kvarn_quantize_tiles_typed on every ISA: fp16 tiles, and float32 tiles rounded to fp16 on the
    way in, give exactly the records of float32 tiles holding those fp16 values."""
    p = _ops.get_preset(preset)
    k = _fp16_edge_values(rng, (3, p.group, 64), scale=2.0**-10)  # the large ones well inside the scales' range
    v = _fp16_edge_values(rng, (3, p.group, 64), scale=2.0**-10)
    assert _exact_fp16_ties(k) > k.size // 5 and _exact_fp16_ties(v) > v.size // 5  # the edge cases are there
    k16, v16 = k.astype(np.float16), v.astype(np.float16)  # numpy rounds to nearest, ties to even
    for isa in ISAS:
        ref = run_isa(isa, _ops.quantize_tiles_native, k16.astype(np.float32), v16.astype(np.float32), p, 8, 2)
        assert np.array_equal(_ops.quantize_tiles_native(k16, v16, p, 8, 2), ref), isa
        assert np.array_equal(_ops.quantize_tiles_native(k, v, p, 8, 2, round_to_f16=True), ref), isa
        # Not vacuous: quantising the unrounded float32 values gives other records.
        assert not np.array_equal(_ops.quantize_tiles_native(k, v, p, 8, 2), ref), isa


@pytest.mark.parametrize("bad", [0, 2])
def test_quantize_overflow_reported_on_every_isa(bad, rng):
    # One tile of three is in fp16 range, but its constant 60000 rotates to 60000*sqrt(128) in one
    # channel, and V's folded scales overflow fp16: every ISA must report that tile (1 or 2 threads),
    # not write an infinite scale.
    p = _ops.get_preset("k4v2_g128")
    k, v = _tiles(rng, "scaled", 3, 128, 128)
    k[bad] = v[bad] = 60000.0
    for isa in ISAS:
        kvarn.set_isa(isa)
        for threads in (1, 2):
            with pytest.raises(ValueError, match=f"tile {bad} has values too large"):
                _ops.quantize_tiles_native(k, v, p, 8, threads)


def test_quantize_overflow_of_the_zero_point_alone_is_reported_on_every_isa(rng):
    """Keys near 60000 with a tiny spread, balanced with no iteration (the identity: a balancing candidate could
    scale them into range): ka fits fp16, kz = lo of the rotated channel 0 (~240000) does not, and the values are
    plain. Every ISA must refuse the tile (a report-only mutation audit, h41: without the kz check the scalar path
    stored kz = inf and no test failed - the other overflow tests also overflow V)."""
    k = (60000.0 + rng.standard_normal((64, 16))).astype(np.float32)
    v = rng.standard_normal((64, 16)).astype(np.float32)
    for isa in ISAS:
        kvarn.set_isa(isa)
        with pytest.raises(ValueError, match="too large for its fp16 scale"):
            kvarn.quantize_tile(k, v, "k4v2_g64", iters=0)
        kvarn.quantize_tile(k / 8, v, "k4v2_g64", iters=0)  # 30000 after rotation: fits


# ---- attention ------------------------------------------------------------------------------
def _cache(rng, preset, Hk, D, n):
    c = kvarn.KVCache(Hk, D, preset=preset)
    c.append(keys(rng, (Hk, n, D)), rng.standard_normal((Hk, n, D)).astype(np.float32))
    return c


def _check_attend(cache, q, tol_floor=2e-5, modes=("float",), int8_limit=None):
    K, V = cache.dequantize()
    scale = 1.0 / np.sqrt(cache.head_dim)
    ref = reference(q, K, V, scale)
    base = rel_err(run_isa("scalar", kvarn.attend, q, cache), ref)
    for isa in simd_isas():
        for mode in modes:
            if isa not in MODE_ISAS[mode]:
                continue
            _native.set_score_mode(mode)
            kvarn.set_isa(isa)
            assert _native.score_mode() == mode  # the kernels run what is checked
            out = run_isa(isa, kvarn.attend, q, cache)
            err = rel_err(out, ref)
            # int modes: the query's rounding is a stated, bounded extra error (int8: the caller's
            # limit; without one, as float).
            limit = {"float": max(2 * base, tol_floor), "int16": max(2 * base, 5e-3),
                     "int8": max(2 * base, tol_floor) if int8_limit is None else int8_limit}[mode]
            assert err <= limit, f"{isa}/{mode}: {err:.3g} > {limit:.3g} (scalar {base:.3g})"
            if mode == "int16":
                # One draw's relative L2 error varies too much to bound tightly (avx2, 3,600 draws of
                # test_attend_formats' shapes: medians 0.9-1.2e-4 per head_dim, max 5.4e-4 at head_dim 16;
                # a review saw 8.8e-4 in 3,936): this catches gross errors, test_int16_error_in_every_format
                # bounds the mean over draws.
                l2 = float(np.linalg.norm(out - ref) / np.linalg.norm(ref))
                assert l2 <= 1.5e-3, f"{isa}/int16: relative L2 {l2:.3g} > 1.5e-3"
    _native.set_score_mode("float")


# int8 (avx2, avx512 with VNNI) at the lengths with a quantised tile. One draw's error varies too much to bound
# tightly (the bounds here were once 1.3x one fixed seed's error; the median over seeds was above them),
# so it is judged as the mean relative L2 error over INT8_DRAWS draws. Measured over 100 such means
# (1,600 draws) per length, honest: median 0.0179 / 0.0175 / 0.0244, max 0.0234 / 0.0223 / 0.0310 at
# 257 / 300 / 385 tokens; with the error 2.5x (what a query rounded to 7 bits instead of 8 gave) the
# smallest mean is 0.0359 / 0.0359 / 0.0495. One draw's max-abs error: median 0.020 / 0.020 / 0.026,
# max 0.102 / 0.106 / 0.174 over 1,600 draws, capped loosely (a gross bug) at INT8_ODD_DRAW_MAX.
INT8_DRAWS = 16
INT8_ODD_MEAN_L2 = {257: 0.03, 300: 0.03, 385: 0.042}
INT8_ODD_DRAW_MAX = 0.25


@pytest.mark.parametrize("n", ODD_LENGTHS)
def test_attend_odd_lengths(n, rng):
    c = _cache(rng, "k4v2_g128", 2, 128, n)
    q = rng.standard_normal((8, 128)).astype(np.float32)
    # Below 257 tokens all lies in the fp16 sink and tail, where int8 computes as float does.
    assert (c.num_tiles > 0) == (n in INT8_ODD_MEAN_L2)
    _check_attend(c, q, modes=("float", "int16", "int8"), int8_limit=INT8_ODD_DRAW_MAX if c.num_tiles else None)
    if not c.num_tiles or not MODE_ISAS["int8"]:
        return
    errors = {}
    for i in range(INT8_DRAWS):
        if i:
            c = _cache(rng, "k4v2_g128", 2, 128, n)
            q = rng.standard_normal((8, 128)).astype(np.float32)
        K, V = c.dequantize()
        ref = reference(q, K, V, 1.0 / np.sqrt(128))
        _native.set_score_mode("int8")
        for isa in MODE_ISAS["int8"]:
            out = run_isa(isa, kvarn.attend, q, c)
            assert rel_err(out, ref) <= INT8_ODD_DRAW_MAX, (isa, i, rel_err(out, ref))
            errors.setdefault(isa, []).append(np.linalg.norm(out - ref) / np.linalg.norm(ref))
        _native.set_score_mode("float")
    for isa, e in errors.items():
        assert np.mean(e) < INT8_ODD_MEAN_L2[n], (isa, e)


@pytest.mark.parametrize("preset", ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k2v2_g128", "k8v8_g128"])
@pytest.mark.parametrize("head_dim", [16, 48, 64, 80, 128, 256])
@pytest.mark.parametrize("groups", [1, 3, 4, 5, 9])
def test_attend_formats(preset, head_dim, groups, rng):
    c = _cache(rng, preset, 2, head_dim, 128 + 3 * _ops.get_preset(preset).group + 37)
    q = rng.standard_normal((2 * groups, head_dim)).astype(np.float32)
    _check_attend(c, q, modes=("float", "int16"))


@pytest.mark.parametrize("preset", ["k4v2_g128", "k4v4_g128", "k4v2_g64", "k2v2_g128"])
def test_int16_error_in_every_format(preset, rng):
    """The int16 mode's extra error, as the mean relative L2 error over 8 draws, in every format it
    serves and at every head_dim (test_int_score_error_measured bounds k4v2_g128 at D 128 only).
    Measured on avx2 over 12 x 8 draws per (preset, head_dim): means 4.5e-5 to 1.95e-4. The test audit's
    mutants, which passed every test before, give means up to 9.4e-4 (value weights rounded to 11 bits
    in 64-token tiles) and 3.2e-3 (a coarser query where head_dim != 128)."""
    if not MODE_ISAS["int16"]:
        pytest.skip("no ISA here runs the int16 mode")
    p = _ops.get_preset(preset)
    for head_dim in (16, 48, 64, 80, 128, 256):
        errs = {isa: [] for isa in MODE_ISAS["int16"]}
        for _ in range(8):
            c = _cache(rng, preset, 2, head_dim, 128 + 3 * p.group + 37)
            q = rng.standard_normal((8, head_dim)).astype(np.float32)
            ref = reference(q, *c.dequantize(), 1 / np.sqrt(head_dim))
            _native.set_score_mode("int16")
            for isa in errs:
                out = run_isa(isa, kvarn.attend, q, c)
                assert _native.score_mode() == "int16"
                errs[isa].append(np.linalg.norm(out - ref) / np.linalg.norm(ref))
            _native.set_score_mode("float")
        for isa, e in errs.items():
            assert np.mean(e) < 3e-4, (isa, head_dim, float(np.mean(e)), e)


def test_attend_sink_variants(rng):
    for sink in (0, 1, 17, 300):
        c = kvarn.KVCache(2, 64, sink_tokens=sink)
        n = 700
        c.append(keys(rng, (2, n, 64)), rng.standard_normal((2, n, 64)))
        _check_attend(c, rng.standard_normal((6, 64)).astype(np.float32))


def test_attend_large_scores(rng):
    # Peaked softmax: scores in the hundreds; exp underflow paths and rescaling.
    c = _cache(rng, "k4v2_g128", 1, 128, 1000)
    q = (rng.standard_normal((4, 128)) * 30).astype(np.float32)
    _check_attend(c, q, tol_floor=1e-4)


@pytest.mark.parametrize("sink", [0, 128])
@pytest.mark.parametrize("preset", ["k4v2_g128", "k2v2_g128", "k4v4_g64"])
def test_scores_all_far_below_zero(sink, preset, rng):
    """Every score of a head near -320 (keys near 4 * ones, queries near -10 * ones): softmax is shift-invariant,
    so the output is the ordinary one. A mutation audit (h45) started the avx512 tile kernel's block maximum at 0
    instead of -inf and no test noticed: the running maximum stuck at 0, float gave NaN (l = 0) and the integer
    modes a uniform average (relative error ~1). Measured (max-norm relative error, eight seed salts, the 2-core
    Xeon): float <= 1.2e-4 (scores this large cost fp32 their last bits), int16 <= 1.5e-3, int8 <= 0.24 (its
    8-bit query on a peaked softmax)."""
    D, n = 64, 128 + 3 * 128 + 37
    c = kvarn.KVCache(1, D, preset=preset, sink_tokens=sink)
    c.append((4.0 + 0.3 * rng.standard_normal((1, n, D))).astype(np.float32),
             rng.standard_normal((1, n, D)).astype(np.float32))
    assert c.num_tiles >= 3
    q = (-10.0 * np.ones((2, D)) + rng.standard_normal((2, D))).astype(np.float32)
    K, V = c.dequantize()
    assert (K[0].astype(np.float64) @ q.T.astype(np.float64) / np.sqrt(D)).max() < -150
    ref = reference(q, K, V, 1 / np.sqrt(D))
    limit = {"float": 1e-3, "int16": 1e-2, "int8": 0.5}
    for isa, mode in _every_isa_and_mode():
        err = rel_err(kvarn.attend(q, c), ref)
        print(f"\n[far below zero] {preset} sink {sink} {isa} {mode}: {err:.2e}")
        assert err < limit[mode], (isa, mode, err)


def _editable_parts(cache):
    """cache's native parts with a private copy of its records, and that copy's fields (views, rows
    [tiles * heads]): records to edit, as the C ABI may receive them, and pass to _native.attend."""
    parts = dict(cache._native_parts())
    parts["records"] = parts["records"][: cache.num_tiles].copy()
    records = parts["records"]
    return parts, kvarn.Tile(records.reshape(-1, records.shape[-1]), cache.preset, cache.head_dim).fields()


@pytest.mark.parametrize("preset", ["k4v2_g128", "k2v2_g128", "k4v4_g64"])
@pytest.mark.parametrize("offset", [0, 9, 15, 63, -1])
def test_a_dominant_score_anywhere_in_a_tile(preset, offset, rng):
    """One token of tile 1 scores ~200 above every other, so exp(s - m) overflows unless the tile's maximum m
    is that score, at several offsets in the tile: every ISA and mode must take it into its maximum. A mutation
    audit of the avx2 kernels (h47) found maxima that skipped the last 8 of every 16 tokens (the integer score
    epilogue) or the last 8 of the tile (k2v2's int16 block maximum) passing every other test, their output
    finite and wrong (relative error ~1): the other tests' scores span too little."""
    D = 64
    c = kvarn.KVCache(1, D, preset=preset)
    G = c.preset.group
    q = rng.standard_normal((2, D)).astype(np.float32)
    k = 0.3 * rng.standard_normal((1, c.sink_tokens + 3 * G + 5, D))
    pos = c.sink_tokens + G + offset % G  # a token of tile 1
    k[0, pos] = q[0] * (200 * np.sqrt(D) / float(q[0] @ q[0]))
    c.append(k.astype(np.float32), rng.standard_normal((1, k.shape[1], D)).astype(np.float32))
    assert c.num_tiles >= 2 and c.sink_len == c.sink_tokens
    K, V = c.dequantize()
    s = K[0].astype(np.float64) @ q[0].astype(np.float64) / np.sqrt(D)
    assert s.argmax() == pos and s[pos] - np.delete(s, pos).max() > 150  # the dominant score is where it was put
    ref = reference(q, K, V, 1 / np.sqrt(D))
    limit = {"float": 1e-4, "int16": 1e-2, "int8": 0.5}
    for isa, mode in _every_isa_and_mode():
        out = kvarn.attend(q, c)
        err = rel_err(out, ref)
        assert np.isfinite(out).all() and err < limit[mode], (isa, mode, err)


def test_exp_accuracy_through_two_sink_tokens():
    """The SIMD exp (exp_ps, <= 2 ulp on [-87, 0] by the ISA files' headers) checked on its own: two fp16 sink
    tokens, k = 0 and e_0, v = 0 and ones, so a query with q_0 = -4g (head_dim 16, scale 1/4) scores 0 and -g
    exactly in fp32 and the output is w / (1 + w), w = exp(-g), in every channel: its relative error is exp's
    plus two roundings (the sum and the division). Every step is deterministic IEEE arithmetic, so the bound is
    a measured one: 1.93e-7 at most on avx2 and avx512 (1.67e-7 scalar, libm's expf) over these 20,000 g on the
    2-core Xeon. A mutation audit (h47) found a range reduction rounding down instead of to nearest passing every
    attention test, whose tolerances sit far above exp's: here it gives 3.5e-7 on either ISA (a last polynomial
    coefficient off by 1e-5 relative: 3.2e-7)."""
    D = 16
    g = np.concatenate([np.linspace(1e-4, 2, 10000), np.linspace(2, 60, 10000)]).astype(np.float32)
    c = kvarn.KVCache(1, D)
    k, v = np.zeros((1, 2, D), np.float32), np.zeros((1, 2, D), np.float32)
    k[0, 1, 0], v[0, 1] = 1, 1
    c.append(k, v)
    assert c.sink_len == 2 and c.num_tiles == 0  # the dense kernel's softmax only
    q = np.zeros((g.size, D), np.float32)
    q[:, 0] = -4 * g
    w = np.exp(-g.astype(np.float64))
    ref = w / (1 + w)
    for isa in ISAS:
        out = run_isa(isa, kvarn.attend, q, c).astype(np.float64)
        err = (np.abs(out - ref[:, None]) / ref[:, None]).max(axis=1)
        print(f"\n[exp] {isa}: max relative error {err.max():.2e} at g = {g[err.argmax()]:.4f}")
        assert err.max() < 2.5e-7, (isa, err.max(), float(g[err.argmax()]))


def _every_isa_and_mode():
    """Selects, in turn, every ISA here with every score mode its kernels run; yields (isa, mode)."""
    for isa in ISAS:
        kvarn.set_isa(isa)
        for mode in [m for m in ("float", "int16", "int8") if m == "float" or isa in MODE_ISAS[m]]:
            _native.set_score_mode(mode)
            yield isa, mode


@pytest.mark.parametrize("field", ["ka", "kz", "kt", "vc", "va", "vz"])
@pytest.mark.parametrize("preset", ["k4v2_g128", "k4v4_g64"])
def test_a_nan_in_a_record_is_reported_on_every_isa_and_mode(field, preset, rng):
    """A NaN scale field (records from the C API, or edited after their check) must give
    KVARN_ERR_OVERFLOW as on the scalar kernels: the SIMD exp clamps used to turn a NaN score
    into a weight of ~0 or 1e-38, and the int16 weights' NaN into an out-of-range integer sum
    (undefined behaviour); the output came out finite."""
    c = _cache(rng, preset, 2, 64, 64 + 3 * _ops.get_preset(preset).group + 5)
    parts, fields = _editable_parts(c)
    fields[field][3, 1] = np.float16(np.nan)  # tile 1, kv head 1
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    for isa, mode in _every_isa_and_mode():
        assert _native.score_mode() == mode
        out = np.zeros_like(q)
        rc = _native.attend([parts], q, 0.125, out, 2)
        assert rc == _native.ERR_OVERFLOW, (isa, mode, rc)
        assert not np.isfinite(out[0, 2:]).all(), (isa, mode)  # query heads 2, 3 read kv head 1


@pytest.mark.parametrize("case", ["ka_inf", "scale_overflow", "va_negative"])
def test_records_the_integer_modes_cannot_serve_are_reported(case, rng):
    """Records and calls the C ABI accepts but the integer modes' roundings cannot represent give
    KVARN_ERR_OVERFLOW there, not a finite wrong output (a review found both): an infinite q*ka
    (an Inf in ka, or a scale that overflows it) narrowed to the most negative integer whatever its
    sign, so the tile silently got weight 0; a negative va (the quantiser writes none; Python refuses
    it on import) broke the int16 value sums' rounding against the largest weight (relative error up
    to 1.0). The float kernels compute the negative-va case (checked against scalar); the infinite
    cases are not checked there (they report them, or give the tile weight 0 where every score is -inf)."""
    c = _cache(rng, "k4v2_g128", 2, 64, 128 + 2 * 128 + 5)
    parts, fields = _editable_parts(c)
    scale = 0.125
    if case != "va_negative":
        # tile 1, kv head 1: channel 0's codes all 15 (a 0 code would turn inf * 0 into NaN, reported anyway)
        parts["records"][1, 1, : c.preset.group // 2] = 0xFF
    if case == "ka_inf":
        fields["ka"][3, 0] = np.float16(np.inf)  # tile 1, kv head 1 ([tiles * heads] rows)
    elif case == "scale_overflow":
        fields["ka"][3, 0] = np.float16(65504)
        scale = 1e36  # every field and input finite; q_rot * ka overflows float32
    else:
        fields["va"][3, 5] = np.float16(-0.5)
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    outs = {}
    for isa, mode in _every_isa_and_mode():
        out = np.zeros_like(q)
        rc = _native.attend([parts], q, scale, out, 2)
        if mode != "float":
            assert rc == _native.ERR_OVERFLOW, (isa, mode, rc)
        elif case == "va_negative":
            assert rc == _native.OK, (isa, rc)
            outs[isa] = out
    for isa, out in outs.items():
        np.testing.assert_allclose(out, outs["scalar"], rtol=0, atol=2e-5 * np.abs(outs["scalar"]).max(), err_msg=isa)


@pytest.mark.parametrize("preset,pos", [("k4v2_g128", p) for p in (0, 15, 16, 63, 64, 111, 112, 127)]
                         + [("k4v2_g64", p) for p in (0, 15, 16, 47, 48, 63)])
def test_negative_va_at_any_token_is_reported(preset, pos, rng):
    """The previous test's negative va sits at token 5; the integer modes must report one anywhere in the tile (a
    mutation audit, h45: the avx512 scan stopping one vector early, missing the last 16 tokens, went unnoticed)."""
    if not MODE_ISAS["int16"]:
        pytest.skip("no ISA here runs an integer score mode")
    c = _cache(rng, preset, 2, 64, 128 + 3 * _ops.get_preset(preset).group + 5)
    parts, fields = _editable_parts(c)
    fields["va"][3, pos] = np.float16(-0.5)  # tile 1, kv head 1
    q = rng.standard_normal((1, 4, 64)).astype(np.float32)
    for isa, mode in _every_isa_and_mode():
        rc = _native.attend([parts], q, 0.125, np.zeros_like(q), 2)
        assert rc == (_native.OK if mode == "float" else _native.ERR_OVERFLOW), (isa, mode, pos, rc)


def test_an_infinite_kz_gives_its_tile_weight_zero_in_every_mode(rng):
    """kvarn.h: an infinite kz can give a tile weight 0 instead of an error. With the rotated query
    -e0 and kz[0] = +inf every score of that tile is -inf: weight 0 on every ISA and score mode (the
    avx512 integer modes' exp turned -inf into NaN, reported as an overflow, while avx2's gave 0)."""
    c = _cache(rng, "k4v2_g128", 1, 64, 128 + 2 * 128 + 5)
    parts, fields = _editable_parts(c)
    fields["kz"][1, 0] = np.float16(np.inf)
    scale = 0.125
    e0 = np.zeros((1, 64), np.float32)
    e0[0, 0] = -1.0
    q = (_ops.hadamard(e0) / scale).astype(np.float32)[None]  # H is its own inverse: q_rot = -e0
    assert np.allclose(_ops.hadamard(q[0] * np.float32(scale)), e0, atol=1e-6)
    # the same cache without tile 1: what weight 0 for it means (tile 1 holds tokens 256..383)
    k, v = c.dequantize()
    keep = np.r_[0:256, 384:k.shape[1]]
    ref = reference(q[0], k[:, keep], v[:, keep], scale)
    for isa, mode in _every_isa_and_mode():
        out = np.zeros_like(q)
        assert _native.attend([parts], q, scale, out, 2) == _native.OK, (isa, mode)
        assert rel_err(out[0], ref) < (2e-5 if mode == "float" else 5e-2), (isa, mode, rel_err(out[0], ref))


@pytest.mark.parametrize("threads", [1, 2, 3, 8])
def test_attend_threads_and_splits(threads, rng):
    c = _cache(rng, "k4v2_g128", 3, 64, 128 * 37 + 5)
    q = rng.standard_normal((9, 64)).astype(np.float32)
    K, V = c.dequantize()
    ref = reference(q, K, V, 1 / 8)
    # Each score mode at its own bound (one 5e-4 bound for the default mode, int16 wherever AVX2 runs,
    # held only for this test's seeds). Max-abs relative error measured over 200 seeds, every ISA, 1 and
    # 3 threads: float median 1.9e-6, max 8.9e-6; int16 median 2.0e-4, p99 6.3e-4, max 7.3e-4.
    limit = {"float": 2e-5, "int16": 1.5e-3}
    for mode in ("float", "int16") if MODE_ISAS["int16"] else ("float",):
        _native.set_score_mode(mode)
        for isa in ISAS:
            out = run_isa(isa, kvarn.attend, q, c, num_threads=threads)
            assert rel_err(out, ref) < limit[mode], (isa, mode, rel_err(out, ref))


def test_attend_batch_matches_single(rng):
    caches = [_cache(rng, "k4v2_g128", 2, 64, n) for n in (1, 129, 700, 2000)]
    q = rng.standard_normal((len(caches), 8, 64)).astype(np.float32)
    for isa in ISAS:
        kvarn.set_isa(isa)
        batched = kvarn.attend_batch(q, caches)
        for b, c in enumerate(caches):
            np.testing.assert_allclose(batched[b], kvarn.attend(q[b], c), rtol=0, atol=1e-5 * np.abs(batched[b]).max())


def test_attend_concurrent_python_threads(rng):
    # The GIL is released; concurrent calls must not share scratch state.
    caches = [_cache(rng, "k4v2_g128", 2, 128, 900 + 128 * i) for i in range(4)]
    qs = [rng.standard_normal((8, 128)).astype(np.float32) for _ in caches]
    # Sequential calls at the same thread count (so the same splits): 1 vs 2 threads alone differ by
    # up to 1.3e-5 of max|out| (int16; 150 seeds, median 3.2e-6), above the 1e-5 here in 4 % of seeds.
    want = [kvarn.attend(q, c, num_threads=2) for q, c in zip(qs, caches)]
    got = [None] * 4

    def work(i):
        for _ in range(5):
            got[i] = kvarn.attend(qs[i], caches[i], num_threads=2)

    ts = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5 * np.abs(w).max())


@pytest.mark.parametrize("on_helper", [True, False], ids=["helper-thread", "calling-thread"])
def test_pool_item_exception_is_an_error_not_a_crash(on_helper):
    # An item that throws (in the kernels: only an allocation failure) must become an error status
    # after every other item has finished - not end the process from a helper thread, nor return
    # while helpers still run the caller's job. A subprocess, so that a crash fails only this test.
    if on_helper and _native.default_threads() < 2:
        pytest.skip("one CPU in the affinity mask: the pool runs every item on the calling thread")
    code = f"""
import numpy as np, kvarn
from kvarn import _native
for attempt in range(5):
    rc, finished, faulted = _native.testing_pool_fault(200, 2, {on_helper})
    if faulted:
        break
print(rc == _native.ERR_INTERNAL, finished, faulted)
c = kvarn.KVCache(2, 64)
c.append(np.ones((2, 300, 64), np.float32), np.ones((2, 300, 64), np.float32))
print(np.allclose(kvarn.attend(np.ones((4, 64), np.float32), c, num_threads=2), 1.0, atol=0.05))
"""
    r = _py(code)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "199", "True", "True"], r.stdout


def test_pool_helpers_sleep_after_an_isolated_call():
    # Helpers spin after a job only when jobs come close together (back-to-back calls); after a
    # call that followed idle time they sleep at once, so that inside a model they leave the cores to
    # torch's and BLAS's threads, which run between two attention calls. Read off each thread's CPU
    # time (schedstat, ns) over 50 ms after a call: a spinning helper takes ~200 us of it.
    if _native.default_threads() < 2:
        pytest.skip("one CPU in the affinity mask: the pool has no helper threads")
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/schedstat"):
        pytest.skip("no per-thread CPU times (/proc/.../schedstat) on this system")
    code = """
import glob, os, threading, time
# Two CPUs, so one helper whatever the machine (every sleeping helper wakes for a job).
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import numpy as np, kvarn
def others_cpu_ns():
    me = str(threading.get_native_id())
    return sum(int(open(f).read().split()[0]) for f in glob.glob("/proc/self/task/*/schedstat")
               if f.split("/")[4] != me)
rng = np.random.default_rng(0)
c = kvarn.KVCache(2, 64)
c.append(rng.standard_normal((2, 600, 64)).astype(np.float32), rng.standard_normal((2, 600, 64)).astype(np.float32))
q = rng.standard_normal((4, 64)).astype(np.float32)
for _ in range(20):
    kvarn.attend(q, c, num_threads=2)
after_idle, after_back_to_back = [], []
for trial in range(6):
    time.sleep(0.05)
    t = others_cpu_ns(); kvarn.attend(q, c, num_threads=2); time.sleep(0.05)
    after_idle.append((others_cpu_ns() - t) / 1e3)
    for _ in range(50):
        kvarn.attend(q, c, num_threads=2)
    t = others_cpu_ns(); time.sleep(0.05)
    after_back_to_back.append((others_cpu_ns() - t) / 1e3)
print(min(after_idle), max(after_back_to_back))
"""
    r = _py(code)
    assert r.returncode == 0, r.stderr
    after_idle_us, after_back_to_back_us = map(float, r.stdout.split())
    # The helper's part of a ~20 us call plus its wake-up, against >= 200 us with a spin.
    assert after_idle_us < 100, (after_idle_us, after_back_to_back_us)
    # Back to back it still spins (waking it per call would cost more than such a call's work).
    assert after_back_to_back_us > 100, (after_idle_us, after_back_to_back_us)



def test_pool_runs_isolated_calls_alone_or_with_woken_helpers_alike():
    # A call after idle time that finds the helpers asleep is run by the caller alone or with them woken,
    # whichever has been faster for calls of its size (both tried first): the same items either way, so the
    # same output bit for bit as back-to-back calls, whose helpers spin.
    if _native.default_threads() < 2:
        pytest.skip("one CPU in the affinity mask: the pool has no helper threads")
    code = """
import os, time
os.sched_setaffinity(0, sorted(os.sched_getaffinity(0))[:2])
import numpy as np, kvarn
from kvarn import _native
rng = np.random.default_rng(1)
c = kvarn.KVCache(2, 64)
c.append(rng.standard_normal((2, 600, 64)).astype(np.float32), rng.standard_normal((2, 600, 64)).astype(np.float32))
q = rng.standard_normal((4, 64)).astype(np.float32)
want = [kvarn.attend(q, c, num_threads=2) for _ in range(5)][-1]
same = True
for _ in range(10):
    time.sleep(0.01)
    same = same and np.array_equal(kvarn.attend(q, c, num_threads=2), want)
size = 2 * ((c.sink_len + c.tail_len) * 4 * 64 + c.num_tiles * c.preset.record_bytes(64))
rc, alone, woken = _native.testing_pool_wake_runs(size)
print(same, rc == 0, alone, woken, alone + woken)
"""
    r = _py(code)
    assert r.returncode == 0, r.stderr
    same, ok, alone, woken, isolated = r.stdout.split()
    assert same == "True" and ok == "True", r.stdout
    # The first such calls alternate (three each way), later ones go either way; a loaded machine can make one
    # of the five back-to-back calls such a call too.
    assert int(alone) >= 3 and int(woken) >= 3 and int(isolated) <= 15, r.stdout

def _wake_choices(alone, woken):
    """The pool's wake choice, fresh, over jobs taking alone[i] / woken[i] (time per byte) either way:
    woke[i] as it chose (kvarn_testing_wake_choice)."""
    alone, woken = np.asarray(alone, np.float64), np.asarray(woken, np.float64)
    woke = np.full(len(alone), -1, np.int8)
    assert _native.testing_wake_choice(alone, woken, woke) == _native.OK
    return woke.astype(bool)


def test_wake_choice_runs_the_faster_way_and_explores_the_other_at_a_bounded_cost():
    n = 3000
    warm = 6  # three jobs each way, alternately, the woken way first
    for alone_t, woken_t in [(10.0, 1.0), (1.0, 10.0), (1.2, 1.0), (1.0, 1.2), (1.0, 1.0)]:
        woke = _wake_choices(np.full(n, alone_t), np.full(n, woken_t))
        assert woke[:warm].tolist() == [True, False] * 3
        took = np.where(woke, woken_t, alone_t)[warm:]
        best = min(alone_t, woken_t)
        # The slower way still runs now and then (a machine's change must be noticed) ...
        slower = woke[warm:] if woken_t > alone_t else ~woke[warm:]
        if alone_t != woken_t:
            assert 1 <= slower.sum() <= (n - warm) // 16 + 1, (alone_t, woken_t, slower.sum())
        # ... and costs under 2 % of the time (every 16th job alone at 10x had cost 56 %).
        assert took.sum() <= 1.02 * best * len(took), (alone_t, woken_t, took.sum() / (best * len(took)))


def test_wake_choice_keeps_its_way_through_hiccups_and_follows_a_change():
    n = 2000
    # Every 5th job of the faster way (woken, 1.0 against 1.2) takes 4x as long, as on a VM now and then: the
    # choice stays with it (a running mean pulled past 1.2 by one such job had run the slower way for dozens).
    woken = np.where(np.arange(n) % 5 == 4, 4.0, 1.0)
    woke = _wake_choices(np.full(n, 1.2), woken)
    assert (~woke[6:]).sum() <= (n - 6) // 16 + 1, (~woke[6:]).sum()
    # Waking becomes 3x slower than running alone at job 1000 (it had been twice as fast): within a few jobs the
    # choice runs alone, and wakes the helpers only to explore after that.
    change = 1000
    alone = np.full(n, 2.0)
    alone[change:] = 1.0
    woken = np.where(np.arange(n) < change, 1.0, 3.0)
    woke = _wake_choices(alone, woken)
    assert woke[change - 16 : change].sum() >= 15
    switched = change + int(np.argmax(~woke[change:]))
    assert switched - change <= 8, switched - change
    assert woke[switched + 1 :].sum() <= (n - switched) // 16 + 1


def test_wake_choice_hook_refuses_mismatched_lengths():
    woke = np.zeros(3, np.int8)
    assert _native.testing_wake_choice(np.ones(3), np.ones(2), woke) == _native.ERR_ARGUMENT
    assert not woke.any()


# ---- fp16 cache (attend_dense_f16) ------------------------------------------------------------
@pytest.mark.parametrize("n", ODD_LENGTHS)
@pytest.mark.parametrize("head_dim,groups", [(128, 4), (64, 3), (16, 1), (80, 5)])
def test_fp16_cache(n, head_dim, groups, rng):
    Hk = 2
    f = FP16Cache(Hk, head_dim)
    k = keys(rng, (Hk, n, head_dim)).astype(np.float16)
    v = rng.standard_normal((Hk, n, head_dim)).astype(np.float16)
    f.append(k[:, : n // 2], v[:, : n // 2])
    f.append(k[:, n // 2 :], v[:, n // 2 :])
    q = rng.standard_normal((Hk * groups, head_dim)).astype(np.float32)
    ref = reference(q, k, v, 1 / np.sqrt(head_dim))
    base = rel_err(run_isa("scalar", f.attend, q), ref)
    assert base < 1e-5, base  # the scalar path itself against the float64 oracle
    for isa in simd_isas():
        err = rel_err(run_isa(isa, f.attend, q), ref)
        assert err <= max(2 * base, 2e-5), (isa, err, base)


def test_fp16_cache_batch_and_errors(rng):
    fs = []
    for n in (5, 300):
        f = FP16Cache(2, 64)
        f.append(rng.standard_normal((2, n, 64)), rng.standard_normal((2, n, 64)))
        fs.append(f)
    q = rng.standard_normal((2, 4, 64)).astype(np.float32)
    out = attend_fp16_batch(q, fs)
    for b in range(2):
        np.testing.assert_allclose(out[b], fs[b].attend(q[b]), atol=1e-6)
    with pytest.raises(ValueError, match="^cache: the cache is empty"):
        FP16Cache(2, 64).attend(q[0])
    with pytest.raises(ValueError, match="^q: 3 query heads is not a positive multiple of the cache's 2 kv heads"):
        fs[0].attend(q[0][:3])
    with pytest.raises(ValueError, match=r"^k: expected shape \[2, n, 64\]"):
        fs[0].append(np.zeros((3, 1, 64)), np.zeros((3, 1, 64)))


INT_SCORE_DRAWS = 8


def _more_draws(rng, isa, mode):
    """Relative L2 errors of INT_SCORE_DRAWS - 1 further draws (cache and queries) of the score mode on isa,
    against float64 over each draw's dequantised cache."""
    errs = []
    for _ in range(INT_SCORE_DRAWS - 1):
        c = _cache(rng, "k4v2_g128", 8, 128, 4096 + 77)
        q = rng.standard_normal((32, 128)).astype(np.float32)
        ref = reference(q, *c.dequantize(), 1 / np.sqrt(128))
        _native.set_score_mode(mode)
        out = run_isa(isa, kvarn.attend, q, c)
        _native.set_score_mode("float")
        errs.append(np.linalg.norm(out - ref) / np.linalg.norm(ref))
    return errs


def test_int_score_error_measured(rng):
    """Reports (and bounds) the extra error of the integer score modes vs the float path, on
    every ISA that runs them; avx2's int16 (vpmaddwd) and avx512's (VNNI) do the same integer
    sums, so they differ by float summation order only."""
    if not MODE_ISAS["int16"]:
        pytest.skip("no ISA here runs the integer modes")
    c = _cache(rng, "k4v2_g128", 8, 128, 4096 + 77)
    q = rng.standard_normal((32, 128)).astype(np.float32)
    outs = {}
    for mode in ("float", "int16", "int8"):
        for isa in MODE_ISAS[mode]:
            _native.set_score_mode(mode)
            kvarn.set_isa(isa)
            assert _native.score_mode() == mode
            outs[isa, mode] = kvarn.attend(q, c)
    K, V = c.dequantize()
    ref = reference(q, K, V, 1 / np.sqrt(128))
    e = {k: np.linalg.norm(o - ref) / np.linalg.norm(ref) for k, o in outs.items()}
    print("relative L2 error vs float64 on the dequantised cache:", e)
    # Measured over 320 seeds (relative L2, avx512): float median 2.0e-6, max 4.3e-6; int16 median
    # 1.8e-4, max 3.4e-4; int8 (8-bit value weights since the twenty-sixth session, centred key codes since
    # the forty-second; both ISAs alike) median 0.0185, p90 0.022, max 0.034 - one draw's int8 error varies
    # too much for a tight bound. So one draw's int8 error is capped loosely (a gross bug), and the mean over
    # INT_SCORE_DRAWS draws is bounded. Means of 8 draws resampled from the 320 (results/zen4_2c_s82/
    # int8_err_seeds.*): p99.98 0.0234 (median 0.0186); the uncentred key codes before (one draw's median
    # 0.042, max 0.104) gave means of 8 whose p0.02 is 0.0335, so 0.03 holds the centring. (Before it the
    # bound was 0.062, which a query rounded to 7 bits instead of 8 - 1.76x the error - failed in 99.8 %.)
    limit = {"float": 1e-5, "int16": 5e-4, "int8": 0.06}
    for (isa, mode), err in e.items():
        assert err < limit[mode], (isa, mode, err)
    # int16, the default mode: one draw's error (9e-5 to 3.1e-4 over 48 seeds on avx2) hides a coarser
    # rounding, so the mean over INT_SCORE_DRAWS draws is bounded too. Means of 8 draws, avx2: honest
    # 1.66-2.02e-4 (six means); with the value weights rounded to 14 bits instead of 15 (a review's
    # mutant, which passed the single-draw bound of 1e-3 used before) 3.70-4.02e-4.
    for isa in MODE_ISAS["int16"]:
        int16 = [e[isa, "int16"]] + _more_draws(rng, isa, "int16")
        assert max(int16) < limit["int16"] and np.mean(int16) < 2.7e-4, (isa, int16)
    for isa in MODE_ISAS["int8"]:
        int8 = [e[isa, "int8"]] + _more_draws(rng, isa, "int8")
        assert max(int8) < limit["int8"] and np.mean(int8) < 0.03, (isa, int8)
    if ("avx2", "int16") in outs and ("avx512", "int16") in outs:
        # Measured over 200 seeds: median 3.2e-6, p99 1.6e-5, max 2.7e-5 (2e-5 held only for this
        # test's seed); avx2 computing in float instead of int16: min 7.2e-5, median 2.0e-4 (40 seeds).
        d = np.abs(outs["avx2", "int16"] - outs["avx512", "int16"]).max() / np.abs(ref).max()
        assert d < 5e-5, d


def _int_mode_oracle(q, cache, mode):
    """Attention as an integer score mode states it, float64 but for the stated roundings; levels L = 32767 for
    int16, 127 for int8. Scores on 4-bit keys: per (tile, head) the rotated, scaled query times ka (float32, as the
    kernels form it) rounded against max|q ka| / L (half to even, as cvtps2dq), dotted exactly with the codes,
    finished as kt (sum * qscale + q.kz); int8 dots the codes centred on 7.5, kt (qscale sum q_int (c - 7.5) +
    q.(kz + 7.5 ka)), i.e. the uncentred sum plus 7.5 sum (q ka - qscale q_int); other keys score in float.
    2-bit values: w = p va rounded against max w / W
    (W = 32767 for int16, 255 for int8), with the centred-code identity
    sum_t w c = (wscale sum_t wi (2c - 3) + 3 sum_t w) / 2; other values exact. Sink and tail exact."""
    levels, weight_levels = {"int16": (32767, 32767), "int8": (127, 255)}[mode]
    hq, D = q.shape
    g = hq // cache.num_kv_heads
    p = cache.preset
    scale = np.float32(1 / np.sqrt(D))
    qs = (q * scale).astype(np.float32)
    q_rot = _ops.hadamard(qs)  # float32, bit-identical on every ISA
    K, V = cache.dequantize()
    n, lo, hi = K.shape[1], cache.sink_len, cache.sink_len + cache.num_tiles * p.group
    dense = np.r_[0:lo, hi:n]  # the full-precision sink and tail, exact in the dequantised cache
    records = cache.records
    out = np.empty((hq, D))
    for h in range(hq):
        kv = h // g
        s_dense = K[kv, dense].astype(np.float64) @ qs[h].astype(np.float64)
        tiles = []
        for t in range(cache.num_tiles):
            f = oracle.record_fields(records[t, kv], p.kbits, p.vbits, p.group, D)
            qa = q_rot[h] * f["ka"].astype(np.float32)
            if p.kbits == 4:
                mx = np.abs(qa).max()
                q_int = np.rint(qa * (np.float32(levels) / mx)).astype(np.int64)
                qscale = float(mx / np.float32(levels))
                dots = (q_int @ f["k_codes"]) * qscale
                if mode == "int8":
                    dots += 7.5 * (qa.astype(np.float64) - qscale * q_int).sum()
            else:
                dots = qa.astype(np.float64) @ f["k_codes"]
            tiles.append((f["kt"] * (dots + q_rot[h].astype(np.float64) @ f["kz"]), f))
        m = max([s_dense.max(initial=-np.inf)] + [s.max() for s, _ in tiles])
        pd = np.exp(s_dense - m)
        total, num, rot = pd.sum(), pd @ V[kv, dense].astype(np.float64), np.zeros(D)
        for s, f in tiles:
            pt = np.exp(s - m)
            total += pt.sum()
            w = pt * f["va"]
            if p.vbits == 2:
                wi = np.minimum(np.rint(w * (weight_levels / w.max())), weight_levels)
                wc = ((w.max() / weight_levels) * (wi @ (2 * f["v_codes"] - 3)) + 3 * w.sum()) / 2
            else:
                wc = w @ f["v_codes"]
            rot += f["vc"] * (wc + pt @ f["vz"])
        out[h] = (num + oracle.rotate(rot[None])[0]) / total
    return out


@pytest.mark.parametrize("mode", ["int16", "int8"])
@pytest.mark.parametrize("preset,Hk,D,Hq,n", [("k4v2_g128", 2, 128, 8, 128 * 5 + 37), ("k4v2_g64", 3, 64, 9, 600),
                                              ("k4v2_g128", 1, 16, 3, 400), ("k4v2_g128", 1, 48, 4, 700),
                                              ("k4v2_g64", 2, 80, 6, 350), ("k4v4_g128", 1, 256, 5, 500),
                                              ("k2v2_g128", 2, 64, 10, 700), ("k2v2_g128", 1, 48, 3, 500),
                                              ("k4v2_g64", 1, 1024, 2, 250)])
def test_int_modes_are_the_stated_integer_arithmetic(mode, preset, Hk, D, Hq, n, rng):
    """Each integer mode computes what it states (_int_mode_oracle): its bounds against exact attention (int16 ~2e-4,
    int8 ~4e-2) let a kernel that rounds otherwise pass. A mutation audit (h45) found an avx512 value-weight scale of
    wmax / 32768 (against a rounding by 32767 / wmax) and k2v2's values in float unnoticed.
    The oracle's float64 scores and exp differ from the kernels' fp32 ones in the last bits, which flips the
    rounding of a few weights near a half-integer, so the bound is on the mean over draws. int16, means of 8 draws
    measured on the 2-core Xeon (four seed salts, both ISAs): 0.6-4.3e-6; the wmax / 32768 mutant 2.3-3.1e-5
    (avx512, every format with 2-bit values), k2v2's float values 7.0-8.5e-5. int8 (avx512, 8 draws per shape):
    means 4.9e-7 to 1.7e-6, and 6.5e-5 at D 1024 (one draw 5.1e-4: a flipped 8-bit weight costs 1/255 of the
    tile's largest); 8-bit weights left at the int16 mode's 16 bits lie ~8e-3 from the oracle."""
    if not MODE_ISAS[mode]:
        pytest.skip(f"no ISA here runs the {mode} mode")
    dist = {isa: [] for isa in MODE_ISAS[mode]}
    for _ in range(INT_ORACLE_DRAWS):
        c = _cache(rng, preset, Hk, D, n)
        q = rng.standard_normal((Hq, D)).astype(np.float32)
        stated = _int_mode_oracle(q, c, mode)
        exact = reference(q, *c.dequantize(), 1 / np.sqrt(D))
        _native.set_score_mode(mode)
        for isa in MODE_ISAS[mode]:
            out = run_isa(isa, kvarn.attend, q, c)
            assert _native.score_mode() == mode
            to_stated = np.linalg.norm(out - stated) / np.linalg.norm(stated)
            to_exact = np.linalg.norm(out - exact) / np.linalg.norm(exact)
            dist[isa].append((to_stated, to_exact))
    for isa, d in dist.items():
        mean_stated, mean_exact = np.mean(d, axis=0)
        print(f"\n[{mode} oracle] {isa} {preset} D{D}: mean {mean_stated:.2e} from it, {mean_exact:.2e} from exact")
        assert mean_stated < {"int16": 1e-5, "int8": 2e-4}[mode], (isa, d)


INT_ORACLE_DRAWS = 8


def _attend_parts_scalar_and(parts, q, scale, vnni, isas, mode):
    """Outputs of the C ABI's attend over one sequence's parts: the scalar float kernels, then each of isas in
    mode, with VNNI on or off (restored on after). Keys: (isa, mode)."""
    outs = {}
    try:
        _native.set_vnni(vnni)
        for isa, m in [("scalar", "float")] + [(i, mode) for i in isas]:
            kvarn.set_isa(isa)
            _native.set_score_mode(m)
            assert _native.score_mode() == m
            out = np.zeros_like(q)
            assert _native.attend([parts], q, scale, out, 2) == _native.OK
            outs[isa, m] = out
    finally:
        _native.set_vnni(True)
    return outs


@pytest.mark.parametrize("mode", ["int8", "int16"])
@pytest.mark.parametrize("vnni", [True, False], ids=["vnni", "madd"])
@pytest.mark.parametrize("D", [16, 48, 112, 256, 288, 1024])
@pytest.mark.parametrize("sign", [1, -1])
def test_int_score_sums_at_their_largest(mode, D, sign, vnni, rng):
    """The integer score kernels' worst case: every code 15 (half the tokens; the others 0) against a query
    whose every integer value is the largest (+-127 in int8, +-32767 in int16). int8: each 2-channel product
    pair is +-3810 and avx2's int16 sums reach +-30480 after 32 channels, where they must widen (a 9th step
    would wrap past 32767). int16: avx512 masks the high nibbles in place as 16 c, whose int32 sums reach
    D/2 * 2 * 240 * 32767, which wraps from D 288 on (the kernel shifts them there). The scores are then
    exactly +-3 or 0, and each mode must give the float path's output up to its value weights' rounding. On
    the tests' random data no sum came near the limit (a kernel that never widened passed them all, a review
    found). Both forms: on a CPU with AVX-VNNI the default runs avx2's vpdpbusd, whose int32 sums never wrap,
    so only "madd" (VNNI off) reaches the vpmaddubsw + vpaddw widening there (h47: widening every 10 steps
    passed every test)."""
    isas = [i for i in MODE_ISAS[mode] if vnni or mode == "int16" or i == "avx2"]  # avx512's int8 has no madd form
    if not isas:
        pytest.skip(f"no ISA here runs this form of the {mode} mode")
    preset, G = "k4v2_g128", 128
    c = kvarn.KVCache(1, D, preset=preset)
    c.append(1e-3 * rng.standard_normal((1, 700, D)).astype(np.float32), rng.standard_normal((1, 700, D)).astype(np.float32))
    parts, f = _editable_parts(c)
    f["k_codes"].reshape(-1, D, G // 2)[:] = np.where(np.arange(G // 2) % 2 == 0, 0xFF, 0x00).astype(np.uint8)
    f["ka"][:] = np.float16(3.0 / (15 * D))  # scores 15 * D * ka = 3 for the tokens whose codes are 15
    f["kz"][:] = np.float16(0)
    f["kt"][:] = np.float16(1)
    scale = np.float32(1 / np.sqrt(D))
    q = (_ops.hadamard(np.full((1, 5, D), sign, np.float32)) / scale).astype(np.float32)  # rotated: +-1 everywhere
    outs = _attend_parts_scalar_and(parts, q, float(scale), vnni, isas, mode)
    # The 8-bit value weights cost 1.5e-3 to 3.2e-3 of max|out| here (avx512, int8); the int16 ones ~1e-5. A
    # wrapped score sum turns a score of 3 into a large negative one (an output off by O(1)).
    atol = {"int8": 1e-2, "int16": 1e-3}[mode]
    for key, out in outs.items():
        np.testing.assert_allclose(out, outs["scalar", "float"], rtol=0, atol=atol * np.abs(out).max(), err_msg=str(key))


@pytest.mark.parametrize("mode", ["int8", "int16"])
@pytest.mark.parametrize("vnni", [True, False], ids=["vnni", "madd"])
@pytest.mark.parametrize("D", [16, 48, 112, 256])
@pytest.mark.parametrize("preset", ["k4v2_g128", "k2v2_g128"])
def test_int_value_sums_at_their_largest(preset, D, vnni, mode, rng):
    """The integer modes' 2-bit value sums at their worst case: every value code 3 and, in a tile, every weight
    p va the same (every score kt * ... = 0, one va), so every weight is the mode's largest (255 in int8, 32767
    in int16). int8: avx2's madd form then adds 2 * 255 * 3 = 1530 per 4 tokens to each int16 lane: 16 steps
    reach 24480, 22 would wrap past 32767 (h50: widening every 22 steps passed every test before this one, whose
    random weights are mostly far below 255; with G = 128 one tile is 32 steps). int16: the avx2 and avx512 loops
    keep code k of a byte in place as 4^k c, whose int32 sums reach 64 * 3 * 32767 * 128 < 2^31 and are shifted
    back per channel. The weights are then exact, so each
    mode must give the float path's output up to float rounding; a wrapped or misscaled sum moves a channel by
    O(1) of max|out|. D 16, 48, 112 take the C = 1 and C = 2 tails on both ISAs."""
    isas = [i for i in MODE_ISAS[mode] if vnni or mode == "int16" or i == "avx2"]  # avx512's int8 has no madd form
    if not isas:
        pytest.skip(f"no ISA here runs this form of the {mode} mode")
    c = kvarn.KVCache(1, D, preset=preset)
    c.append(rng.standard_normal((1, 700, D)).astype(np.float32), rng.standard_normal((1, 700, D)).astype(np.float32))
    parts, f = _editable_parts(c)
    f["v_codes"][:] = 0xFF  # every 2-bit code 3
    f["va"][:] = np.float16(0.25)
    f["kt"][:] = np.float16(0)  # every tile score 0: within a tile every p, so every w = p va, is equal
    q = rng.standard_normal((1, 3, D)).astype(np.float32)
    scale = float(1 / np.sqrt(D))
    outs = _attend_parts_scalar_and(parts, q, scale, vnni, isas, mode)
    ref = outs["scalar", "float"]
    for key, out in outs.items():
        np.testing.assert_allclose(out, ref, rtol=0, atol=1e-4 * np.abs(ref).max(), err_msg=str(key))


def test_public_score_mode_api():
    before = kvarn.score_mode()
    with pytest.raises(ValueError, match="mode: unknown"):
        kvarn.set_score_mode("bogus")
    if "avx2" in ISAS:
        kvarn.set_score_mode("int16")
        assert kvarn.score_mode() == "int16"
    else:
        with pytest.raises(ValueError, match="mode: 'int16' needs AVX2"):
            kvarn.set_score_mode("int16")
    if "avx2" in ISAS:
        kvarn.set_score_mode("int8")
        assert kvarn.score_mode() == ("int16" if kvarn.active_isa() == "avx512" and not HAS_VNNI else "int8")
    else:
        with pytest.raises(ValueError, match="mode: 'int8' needs AVX2"):
            kvarn.set_score_mode("int8")
    kvarn.set_score_mode(before)
    assert kvarn.score_mode() == before


@pytest.mark.parametrize("part", ["k", "v"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("round_to_f16", [False, True])
def test_nonfinite_tiles_fail_the_same_on_every_isa(part, bad, round_to_f16, rng):
    """The C ABI takes tiles unchecked (Python checks them first). One NaN or infinity in a tile must give
    KVARN_ERR_OVERFLOW naming that tile on every ISA: the scalar's clamps carry a NaN into its scale vectors,
    while the vector min/max dropped it, so the SIMD kernels wrote a finite, valid-looking record for a NaN
    in K (found by the C ABI fuzzer, scripts/fuzz.sh)."""
    k = rng.standard_normal((3, 64, 64)).astype(np.float32)
    v = rng.standard_normal((3, 64, 64)).astype(np.float32)
    (k if part == "k" else v)[1, 5, 7] = bad
    preset = kvarn.PRESETS["k4v2_g64"]
    for isa in ISAS:
        kvarn.set_isa(isa)
        records = np.zeros((3, preset.record_bytes(64)), np.uint8)
        rc, first_bad = _native.quantize_tiles(k, v, preset.kbits, preset.vbits, 8, records, 1, round_to_f16)
        assert (rc, first_bad) == (_native.ERR_OVERFLOW, 1), (isa, rc, first_bad)
