"""The CPU benchmarks still run: bench_attend.py and bench_quantize.py in their quick mode (1K
contexts, tiny time budgets) in a subprocess, as RESULTS.md's commands run them. Each benchmark
checks its own output (kvarn and the fp16 kernel against float64 attention, records against a
second quantisation); this test asserts that they all pass and that the table has every row kind.
No timing is asserted: performance lives in the benchmarks, not in tests."""
import os
import re
import subprocess
import sys

import pytest

import kvarn

pytest.importorskip("pytest_benchmark")

BENCH_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "benchmarks")


def test_cpu_benchmarks_run_and_check_their_results(tmp_path):
    table = tmp_path / "table.md"
    env = dict(os.environ, KVARN_BENCH_QUICK="1", KVARN_BENCH_CONTEXTS="1024", KVARN_BENCH_BUDGET="0.01",
               KVARN_BENCH_THREADS="1", KVARN_BENCH_TABLE=str(table), KVARN_BENCH_SETTLE_S="0.01")
    env.pop("KVARN_ISA", None)  # the benchmarks select each ISA themselves
    # Under pytest-xdist (-n N) each worker's PYTEST_XDIST_* variables would reach the child pytest, and
    # pytest-benchmark, reading PYTEST_XDIST_WORKER, would disable its benchmarks (benchmark.stats None).
    for name in [n for n in env if n.startswith("PYTEST_XDIST_")]:
        del env[name]
    r = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "bench_attend.py", "bench_quantize.py",
         "--benchmark-min-rounds=1", "--benchmark-max-time=0.01", "-rs"],
        cwd=BENCH_DIR, env=env, capture_output=True, text=True, timeout=600,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]
    # How many rows run depends on the ISAs and on torch (16 on a CPU without AVX2 and without torch, 32 on
    # an AVX2 machine with it): what must hold everywhere is that nothing skipped but for a missing torch.
    passed = re.search(r"(\d+) passed", r.stdout)
    assert passed and int(passed.group(1)) >= 16, r.stdout[-2000:]
    skips = re.findall(r"^SKIPPED \[\d+\] [^:]+:\d+: (.*)$", r.stdout, flags=re.M)
    assert all(reason == "torch not installed" for reason in skips), skips
    text = table.read_text()
    for group in ("## attend hq32-hk8-d128 ctx=1024 batch=1", "## attend smollm2-hq9-hk3-d64 ctx=1024 batch=1",
                  "## warm hq32-hk8-d128 ctx=1024 batch=1", "## membw", "## quantize"):
        assert group in text, group
    rows = {line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")}
    expected = {"numpy", "kvarn-scalar", "quantize-scalar", "hadamard-scalar", "numpy-read-1thread", "numpy-copy-1thread",
                "kvarn-" + kvarn.available_isas()[-1] + "-interleaved", "numpy-interleaved", "append-grows",
                "append-reserved"}
    try:
        import torch  # noqa: F401

        expected |= {"torch", "torch-folded", "torch-interleaved", "torch-folded-interleaved"}
    except ImportError:
        pass
    for isa in kvarn.available_isas():
        if isa != "scalar":  # the int16 default and the fp16 baseline on every SIMD ISA here
            expected |= {f"kvarn-{isa}-int16", f"fp16-{isa}", f"quantize-{isa}"}
    if "avx2" in kvarn.available_isas():
        expected.add("kvarn-avx2-int8")
    assert expected <= rows, sorted(expected - rows)
    assert re.search(r"warm, interleaved in blocks: kvarn [0-9.]+ ms -> [0-9.]+x fp16", text), text[-2000:]
    assert re.search(r"medians of the same series .*: [0-9.]+x fp16", text), text[-2000:]
    # A row that times a whole round of blocks (pauses included) has no bytes-per-time or ratio.
    round_rows = [line.split("|") for line in text.splitlines() if line.startswith("| interleaved-round-all-")]
    assert round_rows and all([c.strip() for c in r[5:10]] == ["-"] * 5 for r in round_rows), round_rows
    best = kvarn.available_isas()[-1]
    if best == "avx2" or (best == "avx512" and kvarn._native.cpu_has_vnni()):  # where the best ISA runs int8
        assert re.search(r"int8 score mode, same series: kvarn-int8 [0-9.]+ ms -> [0-9.]+x fp16", text), text[-2000:]


def test_bench_cuda_output_check_passes_the_right_output_and_fails_a_wrong_one():
    """bench_cuda.check_kvarn's pass rule without a GPU: a stand-in cache whose "GPU" output is the CPU path's plus
    noise. Noise at the weighted tolerance's scale fails; where the output does not cancel (|out| >= CANCEL_RATIO x
    the weighted value norm) a relative error over REL_TOL fails even under the weighted tolerance."""
    torch = pytest.importorskip("torch")
    import importlib.util
    import types

    import numpy as np

    spec = importlib.util.spec_from_file_location("bench_cuda", os.path.join(BENCH_DIR, "bench_cuda.py"))
    bc = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bc)
    rng = np.random.default_rng(0)
    cpu = kvarn.KVCache(2, 64, "k4v2_g64", sink_tokens=64)
    cpu.append(rng.standard_normal((2, 300, 64)).astype(np.float16), rng.standard_normal((2, 300, 64)).astype(np.float16))
    q = torch.from_numpy(rng.standard_normal((1, 8, 64)).astype(np.float32))
    mode = kvarn.score_mode()
    kvarn.set_score_mode("float")
    try:
        exact = kvarn.attend(q[0].numpy(), cpu)
    finally:
        kvarn.set_score_mode(mode)

    def fake(noise):
        out = torch.from_numpy(exact * (1 + noise))[None]
        return types.SimpleNamespace(to_cpu=lambda sid, layer: cpu, attend=lambda q_, plan, validate: out.to(q_.dtype))

    plan = types.SimpleNamespace(layer=0)
    assert bc.check_kvarn(fake(1e-6), 0, q, plan)[-1] is None
    err32, _, err_w, fail = bc.check_kvarn(fake(4e-4), 0, q, plan)  # 4e-4 relative: over REL_TOL (2e-4) ...
    ratio = err_w / err32  # |out| / weighted |v| (noise proportional to the output)
    assert bc.CANCEL_RATIO <= ratio < 0.5 and err_w < bc.WTD_TOL and "FAILED" in fail  # ... under the weighted one
    assert "FAILED" in bc.check_kvarn(fake(0.2), 0, q, plan)[-1]  # over the weighted tolerance too
