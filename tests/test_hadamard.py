import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import kvarn
import oracle

ALL_DIMS = list(range(16, 1025, 16))
SAMPLE_DIMS = [16, 32, 48, 64, 80, 96, 112, 128, 160, 192, 256, 320, 512, 1024]


@pytest.mark.parametrize("d", ALL_DIMS)
def test_equals_explicit_sylvester_matrix(d, isa):
    eye = np.eye(d, dtype=np.float32)
    h = kvarn.hadamard(eye)  # rows of I times H = H
    np.testing.assert_allclose(h, oracle.hadamard_matrix(d), atol=2e-6)


@pytest.mark.parametrize("d", SAMPLE_DIMS)
def test_orthonormal_and_involution(d, isa):
    h = kvarn.hadamard(np.eye(d))  # float64 path
    np.testing.assert_allclose(h, oracle.hadamard_matrix(d), atol=1e-12)  # SPEC's H, not another orthonormal one
    np.testing.assert_allclose(h @ h.T, np.eye(d), atol=1e-12)
    np.testing.assert_allclose(kvarn.hadamard(h), np.eye(d), atol=1e-12)


@given(st.sampled_from(SAMPLE_DIMS), st.integers(1, 9), st.integers(0, 2**32 - 1))
def test_norm_preserved_and_self_inverse(d, rows, seed):
    x = np.random.default_rng(seed).standard_normal((rows, d)).astype(np.float32)
    y = kvarn.hadamard(x)
    assert y.dtype == np.float32 and y.shape == x.shape
    np.testing.assert_allclose(np.linalg.norm(y, axis=1), np.linalg.norm(x, axis=1), rtol=1e-5)
    np.testing.assert_allclose(kvarn.hadamard(y), x, atol=1e-5)
    np.testing.assert_allclose(y, oracle.rotate(x), atol=1e-5)


def test_batched_leading_axes_and_fp16(isa):
    x = np.random.default_rng(1).standard_normal((2, 3, 4, 80)).astype(np.float16)
    y = kvarn.hadamard(x)
    assert y.shape == x.shape and y.dtype == np.float32
    np.testing.assert_allclose(y, oracle.rotate(x.astype(np.float64)), atol=1e-5)


@pytest.mark.parametrize("shape", [(0, 64), (3, 0, 128)])
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_empty_batch_gives_empty_output(shape, dtype):
    y = kvarn.hadamard(np.ones(shape, dtype))
    assert y.shape == shape and y.dtype == (np.float64 if dtype == np.float64 else np.float32)


@pytest.mark.parametrize("d", [0, 1, 8, 15, 24, 100, 1040, 2048])
def test_unsupported_sizes_raise(d):
    with pytest.raises(ValueError, match="head_dim"):
        kvarn.hadamard(np.ones((2, d), np.float32))


@pytest.mark.parametrize(
    "bad, exc, msg",
    [
        (np.array([[np.nan] * 16], np.float32), ValueError, "NaN"),
        (np.array([[np.inf] * 16], np.float32), ValueError, "NaN or Inf"),
        (np.ones((2, 16), np.int32), TypeError, "dtype"),
        (np.ones((2, 16), np.complex64), TypeError, "dtype"),
        ("not an array", TypeError, "x"),
        (np.float32(1.0), ValueError, "1-D"),
    ],
)
def test_bad_input(bad, exc, msg):
    with pytest.raises(exc, match=msg):
        kvarn.hadamard(bad)
