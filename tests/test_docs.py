"""The Python examples in README.md and docs/cuda.md run as written.

Each fenced ``python`` block is executed verbatim; the test only supplies the inputs the prose
describes (k, v, q, ...), so a renamed function, a changed signature or a wrong shape in the
docs fails here.
"""
from __future__ import annotations

import pathlib
import re

import numpy as np
import pytest

import kvarn

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_blocks(name: str) -> list[str]:
    text = (ROOT / name).read_text(encoding="utf-8")
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


def test_readme_example_runs(capsys):
    (block,) = python_blocks("README.md")
    rng = np.random.default_rng(0)
    hk, d, n_tokens = 8, 128, 300
    k = rng.standard_normal((hk, n_tokens, d)).astype(np.float16)
    v = rng.standard_normal((hk, n_tokens, d)).astype(np.float16)
    cache_a, cache_b = kvarn.KVCache(hk, d), kvarn.KVCache(hk, d)
    cache_a.append(k, v)
    cache_b.append(k[:, :50], v[:, :50])
    tile_k = rng.standard_normal((128, d)).astype(np.float32)
    names = {
        "k": k, "v": v, "q": rng.standard_normal((32, d)).astype(np.float32), "n": 200,
        "k2": k[:, :10], "v2": v[:, :10], "k_tile": tile_k, "v_tile": -tile_k, "x": tile_k,
        "q_batch": rng.standard_normal((2, 32, d)).astype(np.float32), "cache_a": cache_a, "cache_b": cache_b,
        "q_n": rng.standard_normal((4, 32, d)).astype(np.float32), "k_n": k[:, 200:204], "v_n": v[:, 200:204],
    }
    isa, threads = kvarn.active_isa(), kvarn._ops._num_threads  # raw: get_num_threads() resolves 0 to the cores
    try:
        exec(compile(block, "README.md", "exec"), names)
    finally:
        kvarn.set_isa(isa)  # the example selects avx2 and 2 threads; later tests expect the defaults back
        kvarn.set_num_threads(threads)
    # truncate + re-append and checkpoint + rollback leave the first n tokens, as the comments say; append_attend
    # then adds its 4, the last of which attends to the whole cache.
    assert len(names["cache"]) == 204 and capsys.readouterr().out.startswith("300 ")
    assert names["out_n"].shape == (4, 32, d)
    assert np.array_equal(names["out_n"][-1], kvarn.attend(names["q_n"][-1], names["cache"]))
    assert names["out"].shape == (32, d) and np.isfinite(names["out"]).all()
    assert names["tile2"].to_bytes() == names["tile"].to_bytes() and names["k_hat"].shape == (128, d)


def _gpu_ready() -> str | None:
    try:
        import torch
    except ImportError:
        return "torch not installed"
    import kvarn.cuda as kc

    if not kc.is_available():
        return "no usable CUDA GPU (kvarn.cuda.is_available() is False)"
    free, _ = torch.cuda.mem_get_info()
    if free < 64 * 2**30:  # the example's cache: 32 layers x 64 sequences x 32K tokens, ~58 GB of records
        return f"the docs/cuda.md example allocates ~58 GB; {free / 2**30:.0f} GiB free"
    return None


def test_cuda_doc_example_runs():
    reason = _gpu_ready()
    if reason:
        pytest.skip(reason)
    import torch

    (block,) = python_blocks("docs/cuda.md")
    g = torch.Generator(device="cuda").manual_seed(0)
    randn = lambda *shape: torch.randn(*shape, device="cuda", generator=g)  # noqa: E731
    names = {
        "k": randn(2, 5, 8, 128).bfloat16(), "v": randn(2, 5, 8, 128).bfloat16(), "q": randn(2, 32, 128).bfloat16(),
        "q_n": randn(2, 3, 32, 128).bfloat16(), "k_n": randn(2, 3, 8, 128).bfloat16(),
        "v_n": randn(2, 3, 8, 128).bfloat16(), "k_tiles": randn(3, 128, 128), "v_tiles": randn(3, 128, 128),
    }
    exec(compile(block, "docs/cuda.md", "exec"), names)
    out, out_n, records, cache = names["out"], names["out_n"], names["records"], names["cache"]
    assert out.shape == (2, 32, 128) and out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    assert out_n.shape == (2, 3, 32, 128) and torch.isfinite(out_n).all()
    assert cache.length(names["c"]) == cache.length(names["b"]) == 8  # the fork holds b's 5 + 3 tokens
    expect = kvarn.quantize_tile(names["k_tiles"].cpu().numpy(), names["v_tiles"].cpu().numpy(), "k4v2_g128")
    np.testing.assert_array_equal(records.cpu().numpy(), expect.records)  # the GPU writes the CPU's records
