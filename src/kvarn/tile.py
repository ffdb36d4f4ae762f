"""One quantised tile: G tokens x D channels for each of H kv-heads (SPEC §6)."""
from __future__ import annotations

import struct
from typing import TYPE_CHECKING

import numpy as np

from . import _native
from ._ops import (
    PRESETS,
    SINKHORN_ITERS,
    SUPPORTED_BITS,
    SUPPORTED_GROUPS,
    Preset,
    as_float_array,
    check_head_dim,
    check_iters,
    dequantize_records_native,
    get_preset,
    quantize_tiles_native,
)

if TYPE_CHECKING:  # annotations only
    from numpy.typing import ArrayLike

    from ._ops import PresetLike

# Container around raw records for to_bytes/from_bytes: magic, version, kbits,
# vbits, group, head_dim, num_heads, flags (little endian). The records themselves
# follow unchanged, so any backend's records can be wrapped and read back.
# Version 1 had no flags byte; version 2 adds it (bit 0: the tile came from 2-D k, v).
_MAGIC = b"KVARNTL1"
_HEADER_V1 = struct.Struct("<8sBBBHHI")
_HEADER = struct.Struct("<8sBBBHHIB")
_VERSION = 2
_FLAG_SQUEEZE = 1


def _field_views(records: np.ndarray, preset: Preset, head_dim: int) -> dict:
    L = _native.record_layout(preset.kbits, preset.vbits, preset.group, head_dim)
    G, D = preset.group, head_dim

    def f16(name, n):
        return records[:, L[name] : L[name] + 2 * n].view(np.float16)

    return {
        "k_codes": records[:, L["k_codes"] : L["ka"]].reshape(-1, D, G * preset.kbits // 8),
        "ka": f16("ka", D),
        "kz": f16("kz", D),
        "kt": f16("kt", G),
        "v_codes": records[:, L["v_codes"] : L["vc"]].reshape(-1, G, D * preset.vbits // 8),
        "vc": f16("vc", D),
        "va": f16("va", G),
        "vz": f16("vz", G),
    }


def _check_bits(bits) -> int:
    if isinstance(bits, (bool, np.bool_)) or not isinstance(bits, (int, np.integer)):
        raise TypeError(f"bits: expected an int, one of {SUPPORTED_BITS}, got {type(bits).__name__} {bits!r}")
    if bits not in SUPPORTED_BITS:
        raise ValueError(f"bits: must be one of {SUPPORTED_BITS}, got {bits!r}")
    return int(bits)


def unpack_codes(packed: ArrayLike, bits: int) -> np.ndarray:
    """Unpacks codes along the last axis: code i from byte i // (8/bits), shift (i % (8/bits))*bits.

    packed: bytes of at least 1 dimension: a uint8 array, or any integer array-like (a list of ints, an
    int64 array) whose values are all in [0, 255], as pack_codes takes any integer array-like. Returns
    uint8 codes, the last axis 8/bits times longer."""
    bits = _check_bits(bits)
    packed = np.asarray(packed)
    if packed.dtype.kind not in "iu" or packed.ndim == 0:
        raise TypeError(f"packed: expected a uint8 array (or integers in [0, 255]) of at least 1 dimension, got "
                        f"{packed.dtype} {packed.shape}")
    if packed.dtype != np.uint8:
        # np.asarray makes a list of ints int64: bytes if in range (astype would wrap the others silently).
        if packed.size and (packed.min() < 0 or packed.max() > 255):
            raise ValueError(f"packed: values must be in [0, 255] (bytes), got [{packed.min()}, {packed.max()}]")
        packed = packed.astype(np.uint8)
    per_byte = 8 // bits
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    codes = (packed[..., :, None] >> shifts) & np.uint8((1 << bits) - 1)
    return codes.reshape(*packed.shape[:-1], packed.shape[-1] * per_byte)


def pack_codes(codes: ArrayLike, bits: int) -> np.ndarray:
    """Inverse of unpack_codes; codes must be < 2**bits and the last axis a multiple of 8/bits."""
    bits = _check_bits(bits)
    per_byte = 8 // bits
    codes = np.asarray(codes)
    if codes.dtype.kind not in "iu" or codes.ndim == 0:
        raise TypeError(f"codes: expected an integer array of at least 1 dimension, got {codes.dtype} {codes.shape}")
    if codes.size and (codes.min() < 0 or codes.max() >= 1 << bits):
        raise ValueError(f"codes: values must be in [0, {(1 << bits) - 1}] for {bits}-bit codes, "
                         f"got [{codes.min()}, {codes.max()}]")
    if codes.shape[-1] % per_byte:
        raise ValueError(f"codes: last axis {codes.shape[-1]} is not a multiple of {per_byte} ({bits}-bit codes)")
    codes = codes.astype(np.uint8)
    grouped = codes.reshape(*codes.shape[:-1], codes.shape[-1] // per_byte, per_byte)
    shifts = (np.arange(per_byte, dtype=np.uint8) * bits).astype(np.uint8)
    return np.bitwise_or.reduce(grouped << shifts, axis=-1).astype(np.uint8)


class Tile:
    """Packed records of one tile for H kv-heads: ``records`` is uint8 [H, record_bytes].

    The constructor checks the shape only (records as kvarn wrote them); use ``Tile.from_records``
    for records from elsewhere, which also checks every stored scale."""

    def __init__(self, records: np.ndarray, preset: PresetLike, head_dim: int, squeeze: bool = False) -> None:
        self._preset = get_preset(preset)
        self._head_dim = check_head_dim(head_dim)
        rec_bytes = self.preset.record_bytes(self.head_dim)
        if not isinstance(records, np.ndarray) or records.dtype != np.uint8:
            raise TypeError("records: expected a uint8 numpy array")
        if records.ndim != 2 or records.shape[1] != rec_bytes or records.shape[0] == 0:
            raise ValueError(
                f"records: expected shape [H, {rec_bytes}] (H >= 1) for {self.preset.name} with head_dim "
                f"{self.head_dim}, got {records.shape}"
            )
        if not isinstance(squeeze, (bool, np.bool_)):
            raise TypeError(f"squeeze: expected a bool, got {type(squeeze).__name__}")
        if squeeze and records.shape[0] != 1:
            raise ValueError(f"squeeze: a 2-D tile has one head, got {records.shape[0]}")
        self._records = np.ascontiguousarray(records)
        self._squeeze = bool(squeeze)

    # Read-only: native calls size their reads from preset and head_dim, so they must keep
    # describing records (the bytes themselves may be edited in place; from_records validates).
    @property
    def preset(self) -> Preset:
        """The quantisation format (a kvarn.Preset)."""
        return self._preset

    @property
    def head_dim(self) -> int:
        """Channels per token (the records were written for it)."""
        return self._head_dim

    @property
    def records(self) -> np.ndarray:
        """uint8 [H, record_bytes], SPEC §6 records."""
        return self._records

    @property
    def squeeze(self) -> bool:
        """Whether the tile came from 2-D k, v."""
        return self._squeeze

    # ---- fields --------------------------------------------------------------
    @property
    def num_heads(self) -> int:
        """KV heads: one record each."""
        return self.records.shape[0]

    @property
    def group(self) -> int:
        """Tokens in the tile (the preset's group)."""
        return self.preset.group

    @property
    def nbytes(self) -> int:
        """Bytes of the records."""
        return self.records.nbytes

    def fields(self) -> dict[str, np.ndarray]:
        """Views of each record field: packed codes (uint8) and fp16 scale vectors, per head."""
        return _field_views(self.records, self.preset, self.head_dim)

    def k_codes(self) -> np.ndarray:
        """Unpacked key codes [H, D, G] (rows = channels)."""
        return unpack_codes(self.fields()["k_codes"], self.preset.kbits)

    def v_codes(self) -> np.ndarray:
        """Unpacked value codes [H, G, D] (rows = tokens)."""
        return unpack_codes(self.fields()["v_codes"], self.preset.vbits)

    # ---- serialisation -------------------------------------------------------
    def to_bytes(self) -> bytes:
        """A 20-byte header (magic, version, bits, group, head_dim, heads, flags) and the records."""
        header = _HEADER.pack(
            _MAGIC, _VERSION, self.preset.kbits, self.preset.vbits, self.preset.group, self.head_dim, self.num_heads,
            _FLAG_SQUEEZE if self.squeeze else 0,
        )
        return header + self.records.tobytes()

    @classmethod
    def from_bytes(cls, data: bytes | bytearray | memoryview, preset: PresetLike | None = None) -> Tile:
        """Reads to_bytes() output (this version's or version 1's); checks header, length, preset
        and that every scale is finite."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(f"data: expected bytes, got {type(data).__name__}")
        data = bytes(data)
        if len(data) < _HEADER_V1.size:
            raise ValueError(f"data: {len(data)} bytes is shorter than the {_HEADER_V1.size}-byte tile header")
        magic, version = data[:8], data[8]
        if magic != _MAGIC:
            raise ValueError("data: not a kvarn tile (bad magic)")
        if version == 1:
            header, flags = _HEADER_V1, 0
            _, _, kbits, vbits, group, head_dim, num_heads = header.unpack_from(data)
        elif version == _VERSION:
            header = _HEADER
            if len(data) < header.size:
                raise ValueError(f"data: {len(data)} bytes is shorter than the {header.size}-byte tile header")
            _, _, kbits, vbits, group, head_dim, num_heads, flags = header.unpack_from(data)
        else:
            raise ValueError(f"data: unsupported tile format version {version}")
        if kbits not in SUPPORTED_BITS or vbits not in SUPPORTED_BITS or group not in SUPPORTED_GROUPS:
            raise ValueError(f"data: header names an unknown format k{kbits}v{vbits}_g{group}")
        matches = [p for p in PRESETS.values() if (p.kbits, p.vbits, p.group) == (kbits, vbits, group)]
        stored = matches[0] if matches else Preset(f"k{kbits}v{vbits}_g{group}", kbits, vbits, group)
        if preset is not None:
            wanted = get_preset(preset)
            if (wanted.kbits, wanted.vbits, wanted.group) != (kbits, vbits, group):
                raise ValueError(f"preset: data holds {stored.describe()}, not {wanted.describe()}")
            stored = wanted
        try:
            check_head_dim(head_dim)
        except ValueError:
            raise ValueError(f"data: header names unsupported head_dim {head_dim}") from None
        if num_heads < 1:
            raise ValueError("data: header names zero heads")
        squeeze = bool(flags & _FLAG_SQUEEZE)
        if flags & ~_FLAG_SQUEEZE or (squeeze and num_heads != 1):
            raise ValueError(f"data: header flags {flags:#x} are not valid for {num_heads} head(s)")
        rec_bytes = stored.record_bytes(head_dim)
        expected = header.size + num_heads * rec_bytes
        if len(data) != expected:
            raise ValueError(f"data: expected {expected} bytes for {num_heads} head(s) of {stored.name}, got {len(data)}")
        records = np.frombuffer(data, dtype=np.uint8, offset=header.size).reshape(num_heads, rec_bytes).copy()
        return cls.from_records(records, stored, head_dim, squeeze=squeeze, argname="data")

    @classmethod
    def from_records(cls, records: ArrayLike, preset: PresetLike, head_dim: int, squeeze: bool = False,
                     argname: str = "records") -> Tile:
        """Wraps raw SPEC §6 records (e.g. written by the CUDA store kernel), validating their scales;
        errors name ``argname``."""
        tile = cls(records, preset, head_dim, squeeze=squeeze)
        for name, view in tile.fields().items():
            if view.dtype == np.float16:
                vals = view.astype(np.float32)
                if not np.isfinite(vals).all():
                    raise ValueError(f"{argname}: corrupt tile record: field {name} holds NaN or Inf")
                if name in ("kt", "vc") and not (vals > 0).all():
                    raise ValueError(f"{argname}: corrupt tile record: field {name} must be positive")
                # r·scale (SPEC §5): never negative (fp16 may round it to 0); the integer value sums
                # assume non-negative weights p·va.
                if name in ("ka", "va") and not (vals >= 0).all():
                    raise ValueError(f"{argname}: corrupt tile record: field {name} must not be negative")
        return tile

    def __repr__(self) -> str:
        return f"Tile(preset={self.preset.label()}, heads={self.num_heads}, head_dim={self.head_dim}, nbytes={self.nbytes})"


def quantize_tile(k: ArrayLike, v: ArrayLike, preset: PresetLike = "k4v2_g128", *, iters: int = SINKHORN_ITERS,
                  num_threads: int | None = None) -> Tile:
    """Quantises one tile of keys and values.

    k, v: [G, D] or [H, G, D], float16, bfloat16, float32 or float64, G the preset's group size.
    Returns a Tile holding one SPEC §6 record per head.
    """
    p = get_preset(preset)
    k = as_float_array(k, "k", ndim=(2, 3), fp16_range=True)
    v = as_float_array(v, "v", ndim=(2, 3), fp16_range=True)
    if k.shape != v.shape:
        raise ValueError(f"v: shape {v.shape} does not match k's {k.shape}")
    squeeze = k.ndim == 2
    k3 = k[None] if squeeze else k
    v3 = v[None] if squeeze else v
    if k3.shape[1] != p.group:
        raise ValueError(f"k: a {p.name} tile holds {p.group} tokens, got {k3.shape[1]} (shape {k.shape})")
    if k3.shape[0] == 0:
        raise ValueError("k: needs at least one head")
    head_dim = check_head_dim(k3.shape[2], "k.shape[-1]")
    iters = check_iters(iters)
    records = quantize_tiles_native(
        np.ascontiguousarray(k3, dtype=np.float32), np.ascontiguousarray(v3, dtype=np.float32), p, iters, num_threads,
        describe=(lambda i: "the tile") if squeeze else (lambda i: f"head {i}"),
    )
    return Tile(records, p, head_dim, squeeze=squeeze)


def dequantize_tile(tile: Tile) -> tuple[np.ndarray, np.ndarray]:
    """Returns (k̂, v̂) float32 in the original (unrotated) frame, shaped like quantize_tile's input."""
    if not isinstance(tile, Tile):
        raise TypeError(f"tile: expected a kvarn.Tile, got {type(tile).__name__}")
    k, v = dequantize_records_native(tile.records, tile.preset, tile.head_dim)
    # Tile() takes records as they are (from_records validates them): a NaN or Inf scale must not
    # come back as NaN values.
    if not (np.isfinite(k).all() and np.isfinite(v).all()):
        raise ValueError("tile: corrupt record: its scales decode to NaN or Inf (Tile.from_records names the field)")
    if tile.squeeze:
        return k[0], v[0]
    return k, v
