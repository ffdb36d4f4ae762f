"""kvarn: KVarN KV-cache quantisation (SPEC.md) with fused decode attention.

    import kvarn
    cache = kvarn.KVCache(num_kv_heads=8, head_dim=128)          # k4v2_g128
    cache.append(k, v)                                           # [Hk, n, D] fp16/fp32
    out = kvarn.attend(q, cache)                                 # q [Hq, D] -> [Hq, D]
"""
from ._ops import (
    DEFAULT_PRESET,
    PRESETS,
    Preset,
    active_isa,
    available_isas,
    get_num_threads,
    hadamard,
    score_mode,
    set_isa,
    set_num_threads,
    set_score_mode,
)
from .cache import KVCache, append_attend, append_attend_batch, attend, attend_batch
from .fp16cache import FP16Cache, append_attend_fp16_batch, attend_fp16_batch
from .tile import Tile, dequantize_tile, pack_codes, quantize_tile, unpack_codes

__version__ = "0.1.0"


def __getattr__(name):
    # `kvarn.cuda` works after a plain `import kvarn` (as torch.cuda does), yet `import kvarn` never
    # loads the CUDA module: it is imported on first use.
    if name == "cuda":
        import importlib

        return importlib.import_module(".cuda", __name__)
    raise AttributeError(f"module 'kvarn' has no attribute {name!r}")

__all__ = [
    "DEFAULT_PRESET",
    "FP16Cache",
    "PRESETS",
    "Preset",
    "KVCache",
    "Tile",
    "active_isa",
    "append_attend",
    "append_attend_batch",
    "append_attend_fp16_batch",
    "attend",
    "attend_batch",
    "attend_fp16_batch",
    "available_isas",
    "dequantize_tile",
    "get_num_threads",
    "hadamard",
    "pack_codes",
    "quantize_tile",
    "set_isa",
    "set_num_threads",
    "score_mode",
    "set_score_mode",
    "unpack_codes",
]
