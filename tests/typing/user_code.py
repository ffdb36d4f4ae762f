"""A user's program written against kvarn's public API, type-checked by tests/test_typing.py (mypy --strict
against the installed package) and run by it too: every call here must work, and every result have the type
written beside it (assert_type; arrays by annotated names, as numpy's own spelling of a bare ndarray differs
between its versions: misuse.py shows that those results are arrays, not Any). Not collected by pytest (no
test_ prefix)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np

import kvarn

if TYPE_CHECKING:
    from typing_extensions import assert_type  # mypy's own typeshed has it; nothing is imported at run time

    Array = np.ndarray[Any, np.dtype[Any]]
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
    out: Array = kvarn.attend(q, cache, 0.125, num_threads=2)
    assert out.shape == (4, 64)
    by_method: Array = cache.attend(q)
    batch: Array = kvarn.attend_batch(np.stack([q, q]), [cache, cache.copy()])
    assert by_method.shape == out.shape and batch.shape == (2, 4, 64)
    step: Array = kvarn.append_attend(np.stack([q, q, q]), cache, k[:, :3], v[:, :3], num_threads=1)
    step_batch: Array = kvarn.append_attend_batch(np.stack([q, q])[:, None], [cache, cache.copy()], [k[:, :1]] * 2,
                                                  [v[:, :1]] * 2)
    assert step.shape == (3, 4, 64) and step_batch.shape == (2, 1, 4, 64)

    point = cache.truncation_point(250)
    assert_type(point, int)
    cache.truncate(point)
    saved = cache.checkpoint()
    cache.reserve(4096)
    cache.append(k[:, :5], v[:, :5])
    cache.rollback(saved)
    parts = assert_type(cache.to_parts(), "dict[str, Any]")
    restored = assert_type(kvarn.KVCache.from_parts(**parts), kvarn.KVCache)
    k_hat, v_hat = restored.dequantize()
    pair: tuple[Array, Array] = (k_hat, v_hat)
    assert k_hat.shape == v_hat.shape == (2, len(restored), 64)

    tile = assert_type(kvarn.quantize_tile(k[0, :128], v[0, :128], "k4v4_g128", num_threads=1), kvarn.Tile)
    tile_kv: tuple[Array, Array] = kvarn.dequantize_tile(tile)
    blob = assert_type(tile.to_bytes(), bytes)
    assert_type(kvarn.Tile.from_bytes(blob), kvarn.Tile)
    codes: Array = kvarn.unpack_codes(kvarn.pack_codes(np.arange(8, dtype=np.uint8), 4), 4)
    assert codes.tolist() == list(range(8))
    rotated: Array = kvarn.hadamard(q)
    assert rotated.shape == q.shape and tile_kv[0].shape == (128, 64) and pair[0].shape == (2, len(restored), 64)

    preset: kvarn.Preset = kvarn.PRESETS[kvarn.DEFAULT_PRESET]
    assert_type(preset.bits_per_element(128), float)
    custom = kvarn.KVCache(2, 64, preset=kvarn.Preset("mine", 4, 2, 64))
    assert_type(custom.head_dim, int)

    fp16 = kvarn.FP16Cache(num_kv_heads=2, head_dim=64)
    fp16.reserve(1024)
    fp16.append(k, v)
    dense: Array = fp16.attend(q, num_threads=1)
    dense_batch: Array = kvarn.attend_fp16_batch(np.stack([q]), [fp16])
    assert dense_batch.shape == (1,) + dense.shape
    dense_step: Array = kvarn.append_attend_fp16_batch(np.stack([q])[:, None], [fp16], np.stack([k[:, :1]]),
                                                       np.stack([v[:, :1]]))
    assert dense_step.shape == (1, 1, 4, 64)

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
