"""Calls kvarn's annotations must reject: tests/test_typing.py expects mypy to report each line marked
`# error: <code>` and nothing else. Never run."""
from __future__ import annotations

import numpy as np

import kvarn

q = np.zeros((4, 64), np.float32)
cache = kvarn.KVCache(2, 64)
cache.append(q)  # error: call-arg
kvarn.attend(q, cache, num_threads="2")  # error: arg-type
kvarn.KVCache(2, 64, preset=3)  # error: arg-type
kvarn.attend_batch(q, cache)  # error: arg-type
tile: kvarn.Tile = kvarn.dequantize_tile(kvarn.quantize_tile(q, q))  # error: assignment
heads: str = cache.num_kv_heads  # error: assignment
kvarn.set_isa(2)  # error: arg-type
# array results are arrays to mypy, not Any (with Any the attribute would pass)
kvarn.attend(q, cache).no_such_attribute  # error: attr-defined
cache.dequantize()[1].no_such_attribute  # error: attr-defined
kvarn.hadamard(q).no_such_attribute  # error: attr-defined
kvarn.FP16Cache(2, 64).attend(q).no_such_attribute  # error: attr-defined
kvarn.append_attend(q, cache, q, q, num_threads="1")  # error: arg-type
kvarn.append_attend_batch(q, cache, [q], [q])  # error: arg-type
