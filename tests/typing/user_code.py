"""A user's program written against kvarn's public API, type-checked by tests/test_typing.py (mypy --strict
against the installed package) and run by it too: every call here must work, and every result have the type
written beside it. Not collected by pytest (no test_ prefix)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import kvarn

if TYPE_CHECKING:
    from typing_extensions import assert_type  # mypy's own typeshed has it; nothing is imported at run time
else:
    def assert_type(value, _type):
        return value


def main() -> None:
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 300, 64)).astype(np.float16)
    v = rng.standard_normal((2, 300, 64)).astype(np.float32)
    q = rng.standard_normal((4, 64), dtype=np.float32)

    cache = kvarn.KVCache(num_kv_heads=2, head_dim=64, preset="k4v2_g64", sink_tokens=64)
    cache.append(k, v, num_threads=1)
    assert_type(len(cache), int)
    assert_type(cache.nbytes, int)
    assert_type(cache.compression_ratio, float)
    assert_type(cache.preset, kvarn.Preset)
    out = assert_type(kvarn.attend(q, cache, 0.125, num_threads=2), np.ndarray)
    assert out.shape == (4, 64)
    assert_type(cache.attend(q), np.ndarray)
    assert_type(kvarn.attend_batch(np.stack([q, q]), [cache, cache.copy()]), np.ndarray)

    point = cache.truncation_point(250)
    assert_type(point, int)
    cache.truncate(point)
    saved = cache.checkpoint()
    cache.append(k[:, :5], v[:, :5])
    cache.rollback(saved)
    parts = assert_type(cache.to_parts(), "dict[str, Any]")
    restored = assert_type(kvarn.KVCache.from_parts(**parts), kvarn.KVCache)
    k_hat, v_hat = assert_type(restored.dequantize(), "tuple[np.ndarray, np.ndarray]")
    assert k_hat.shape == v_hat.shape == (2, len(restored), 64)

    tile = assert_type(kvarn.quantize_tile(k[0, :128], v[0, :128], "k4v4_g128", num_threads=1), kvarn.Tile)
    assert_type(kvarn.dequantize_tile(tile), "tuple[np.ndarray, np.ndarray]")
    blob = assert_type(tile.to_bytes(), bytes)
    assert_type(kvarn.Tile.from_bytes(blob), kvarn.Tile)
    codes = assert_type(kvarn.unpack_codes(kvarn.pack_codes(np.arange(8, dtype=np.uint8), 4), 4), np.ndarray)
    assert codes.tolist() == list(range(8))
    assert_type(kvarn.hadamard(q), np.ndarray)

    preset: kvarn.Preset = kvarn.PRESETS[kvarn.DEFAULT_PRESET]
    assert_type(preset.bits_per_element(128), float)
    custom = kvarn.KVCache(2, 64, preset=kvarn.Preset("mine", 4, 2, 64))
    assert_type(custom.head_dim, int)

    fp16 = kvarn.FP16Cache(num_kv_heads=2, head_dim=64)
    fp16.append(k, v)
    assert_type(fp16.attend(q, num_threads=1), np.ndarray)
    assert_type(kvarn.attend_fp16_batch(np.stack([q]), [fp16]), np.ndarray)

    isas = assert_type(kvarn.available_isas(), "list[str]")
    active = assert_type(kvarn.active_isa(), str)
    kvarn.set_isa(isas[-1])
    kvarn.set_isa(active)
    threads = assert_type(kvarn.get_num_threads(), int)
    kvarn.set_num_threads(threads)
    mode = assert_type(kvarn.score_mode(), str)
    kvarn.set_score_mode("float")
    kvarn.set_score_mode(mode if mode != "float" else "float")
    assert_type(kvarn.__version__, str)


if __name__ == "__main__":
    main()
    print("ok")
