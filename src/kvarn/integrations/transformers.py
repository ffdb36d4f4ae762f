"""A Hugging Face transformers ``Cache`` backed by kvarn, with native decode attention.

    from kvarn.integrations.transformers import KVarNCache
    cache = KVarNCache(model.config, preset="k4v2_g128")
    out = model.generate(ids, cache=cache, max_new_tokens=64)   # past_key_values=cache: the older name, until 6.0

How it works
- ``KVarNCache(config)`` registers an attention function named ``"kvarn"`` with transformers'
  ``AttentionInterface`` (its mask builder is sdpa's) and switches ``config`` to it, so every
  attention module that shares this config (all of them, in the Llama family) routes through it.
  Where the cache is not a KVarN one, the function is plain sdpa, so later calls without a
  KVarNCache run sdpa whatever the model used before (eager-only features such as
  ``output_attentions`` then return nothing); ``restore_attention(model.config)`` switches the
  config back to its previous implementation.
- Prefill on an empty cache: the layer appends the prompt's post-RoPE K/V to one
  ``kvarn.KVCache`` per batch row (full tiles get quantised at once) and hands the full-precision
  K/V back, so the prompt attends exactly as without the cache.
- Every later step (decode, or a continued prompt): the layer keeps the new K/V aside and tags the
  returned key tensor; the attention function then, token by token, appends the token to the
  kvarn cache and calls ``kvarn.attend_batch`` over the packed codes. No dequantised copy of the
  cache is ever made (transformers' own QuantizedCache dequantises the whole cache every step).
  By default the packed cache lives in host memory and the attention runs on the CPU whatever the
  model's device: a model on a GPU copies each layer's K/V and query to the host, and the output back,
  every step.
- ``KVarNCache(config, device="cuda")`` keeps the cache on the model's GPU instead: one
  ``kvarn.cuda.PagedKVCache`` per layer, prefill appended per row (without its left padding) and
  quantised there, and each later step one ``append_attend`` per layer over the whole batch (q, k, v as
  transposed views of the model's tensors; no host copies), which runs kvarn's CUDA kernels. A step
  refused by a later layer is undone with ``PagedKVCache.checkpoint``/``rollback``; beam search and
  ``num_return_sequences`` free the rows left out and ``fork`` repeated ones (pages shared). Its pools
  are allocated at the first forward (``max_batch_size`` rows of ``max_cache_len`` tokens); a crop window
  is a ring of fp16 tokens on the GPU; ``quantize_on="fill"`` only, and head_dim 64, 128 or 256.
- Sliding-window layers (Gemma 3's local layers) keep transformers' full-precision
  ``DynamicSlidingWindowLayer``: they hold at most ``sliding_window`` tokens, and kvarn's attention
  has no window. A config with no full-attention layer at all (nothing to compress: one with
  ``sliding_window`` and no ``layer_types``, as Mistral-7B-v0.1's, makes every layer sliding) or with
  logit soft-capping is refused when the cache is built.

Batch rows can be reordered, repeated and selected (beam search, ``num_return_sequences``): a
row that appears twice gets a copy of its ``kvarn.KVCache`` (which shares its records until it completes a
tile: O(one tile) per copy, not O(context)). Left-padded batches (what
``generate`` builds for prompts of different lengths with ``padding_side="left"``) work: a row's
padding positions are left out of its ``kvarn.KVCache`` at prefill, and later steps check that
the mask hides exactly those. Assisted and prompt-lookup decoding roll rejected draft tokens
back with ``crop``: inside the fp16 tail that always works; a cut inside a tile quantised
meanwhile needs ``KVarNCache(..., crop_window=2 * group)`` (an fp16 copy of each row's last
tokens), which restores exactly the cache that never held the removed tokens. Limits: other
padding (right padding, padding in a later chunk) raises ``NotImplementedError``, and so does a
crop the window cannot serve.
Errors: a step one layer rejects (NaN or beyond-fp16 K/V, a bad query, any refusal of kvarn's) leaves
the whole cache as it was before the forward, every batch row included: the layers before it in the
same forward, sliding-window ones too, are rolled back (each layer keeps its state from before the
step until the forward's last layer has run: while a step grows the packed buffers, the old ones live
that long). A forward stopped by something else (an interrupt, an error in the
model's own code) cannot be undone that way: a cache whose layers then hold different numbers of
tokens, or a layer left holding a step its attention never took (interrupted between a layer's cache
update and its attention), refuses the next forward, crop and batch reordering with a RuntimeError
until ``reset()``; so does a refusal that comes after the last layer has stored the step (attention run
twice over the last layer's update), whose step cannot be undone any more. Crop and batch reordering check every layer before changing any. Under
``torch.compile`` the cache update and the attention run uncompiled (graph breaks).
A forward whose attention does not run through ``"kvarn"`` would attend a decode step over its own
token only. If the cache's config is not switched to ``"kvarn"`` (``restore_attention``), the first
layer refuses the forward; if it is but the running model's is not (another instance of the model),
the next KVarN layer finds the previous one's step untaken and raises, dropping that step (a step left
untaken by a model's last full-attention layer is refused at the next forward).
``copy.deepcopy(cache)`` copies the stored tokens but shares the model's config.
Gradients: decode attention goes through numpy and kvarn's kernels, which autograd cannot follow, so a
decode step with grad enabled and a query, key or value that requires grad raises a RuntimeError
(``generate`` runs under ``torch.no_grad()``; wrap direct forwards in ``torch.no_grad()`` or
``torch.inference_mode()``). Prefill attends over its own K/V through sdpa and stays differentiable;
what it stores is a detached copy.
Threads: kvarn's decode calls use ``kvarn.set_num_threads`` (default: every core), next to torch's own
pool. On a machine with few cores, short contexts can decode faster with ``kvarn.set_num_threads(1)``
(inside SmolLM2 on a 2-core Xeon, a layer's call at 1K tokens took 66-70 µs on one thread against 90-97 µs on
two: waking kvarn's helper for a call that comes alone costs more than the helper brings - it often ran on the
caller's own CPU and took over the work while the caller waited, also with torch's OpenMP workers asleep
(OMP_WAIT_POLICY=PASSIVE); at 8K the two were about even, 212-245 against 227-240 µs over two days' runs;
benchmarks/RESULTS.md §5).
Measured end to end: ``benchmarks/bench_generate.py``.
Needs torch and transformers >= 5.24, < 6: the ``transformers`` extra (``pip install "kvarn[transformers]"``;
the ``eval`` extra pins torch 2.13.0 and bounds the rest; the published numbers were measured with
transformers 5.24.0).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import os
import sys
import threading
import weakref
from typing import TYPE_CHECKING

import numpy as np

try:
    import torch
    from transformers import AttentionInterface
    from transformers.cache_utils import Cache, CacheLayerMixin, DynamicSlidingWindowLayer
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask
except ImportError as e:  # torch or transformers missing, or a transformers without these names
    raise ImportError(f"kvarn.integrations.transformers needs torch and transformers >= 5.24, < 6 ({e}): "
                      "pip install 'kvarn[transformers]'") from e

import kvarn
from .._ops import check_head_dim as kvarn_check_head_dim
from .._ops import append_attend_chunks, check_positive_int, check_scale, check_step_queries, get_preset

if TYPE_CHECKING:  # annotations only
    from .._ops import PresetLike

ATTN_IMPLEMENTATION = "kvarn"
_TAG = "_kvarn_layer"  # attribute set on a key tensor whose attention kvarn must do
_PREFILL_TAG = "_kvarn_prefill"  # ...on a prompt's key tensor: attention as usual, then store it
_MASK_CHECKED = "_kvarn_mask_checked"  # on a mask tensor: (keys, left pads) it was found to allow
_JOURNAL_TAG = "_kvarn_journal"  # on a sliding layer's key tensor: the cache's step journal

# An optional replacement for the whole attention computation, used by the evaluation
# (pseudo-decode) and the sample capture: fn(module, query, key, value, mask, scaling) -> [B, q, Hq, D].
_override = contextvars.ContextVar("kvarn_attention_override", default=None)


@torch.compiler.disable  # numpy and native calls: torch.compile must run them as they are, not trace them
def kvarn_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """The ``"kvarn"`` attention function (transformers' AttentionInterface signature).

    query [B, Hq, q, D]; returns ([B, q, Hq, D], None) like sdpa_attention_forward.
    """
    layer = getattr(key, _TAG, None)
    prefill = getattr(key, _PREFILL_TAG, None)
    if kwargs.get("s_aux") is not None:  # sdpa_attention_forward would swallow it: wrong outputs, no error
        _refuse(layer or prefill, "this model's attention adds learned attention sinks (s_aux), which neither kvarn "
                "attention nor the sdpa attention it runs for prompts has; use the model's own cache and attention "
                "(kvarn.integrations.transformers.restore_attention(model))", getattr(key, _JOURNAL_TAG, None))
    if layer is not None:
        # The window this call passes decides (a full layer may pass None while its module still carries the
        # model's window, as EXAONE 4's do); a module attribute only where no window is passed.
        window = kwargs["sliding_window"] if "sliding_window" in kwargs else getattr(module, "sliding_window", None)
        if kwargs.get("softcap") is not None or window:
            _refuse(layer, "kvarn attention has no logit soft-capping or sliding window")
        if dropout:  # a model in training mode with attention dropout: sdpa's prompt pass applies it, kvarn could not
            _refuse(layer, f"kvarn attention has no attention dropout (the model passes {dropout}: training mode); "
                    "call model.eval() to generate")
        if layer._pending is None:
            _refuse(layer, _TWICE)
        return layer.attend_pending(query, attention_mask, scaling), None
    if prefill is not None and prefill._prefill is None:
        _refuse(prefill, _TWICE)
    fn = _override.get()
    if fn is not None:
        out = fn(module, query, key, value, attention_mask, scaling)
    else:
        out = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                     **kwargs)[0]
    if prefill is not None:
        prefill.store_prefill(attention_mask)
    journal = getattr(key, _JOURNAL_TAG, None)
    if journal is not None:  # a sliding layer's attention ran
        journal.took()
    return out, None


_TWICE = ("this model ran attention twice over one layer's cache update (layers sharing K/V, as Gemma3n's or "
          "Gemma4's num_kv_shared_layers, or differential attention); KVarNCache stores each update once and "
          "does not support that")


def _refuse(layer, why: str, journal=None):
    """Raises NotImplementedError; a KVarN layer with a step kept aside drops it (a prompt empties the layer,
    as before it), so that the cache refuses nothing else later for this; the layers before it in the
    forward are rolled back (through the layer, or the journal a sliding layer's keys carry)."""
    error = NotImplementedError(f"KVarNCache: {why}")
    if journal is not None:
        journal.rollback()
    if layer is not None:
        if layer._prefill is not None:
            layer._empty()
        layer._pending = None
        layer._fail(error)
    raise error


def register() -> str:
    """Registers the ``"kvarn"`` attention function and mask builder (idempotent); returns the name."""
    AttentionInterface.register(ATTN_IMPLEMENTATION, kvarn_attention)
    AttentionMaskInterface.register(ATTN_IMPLEMENTATION, sdpa_mask)
    return ATTN_IMPLEMENTATION


# What use_kvarn_attention replaced, per config: id(config) -> (weak reference, previous implementation).
# Not an attribute of the config, which save_pretrained would write into config.json; configs define __eq__
# (no WeakKeyDictionary), and the weak reference's callback drops the entry with its config.
_previous_attn: dict = {}
_previous_attn_lock = threading.RLock()  # reentrant: a collection inside a locked section runs forget


def _remember_previous(config, previous) -> None:
    key = id(config)

    def forget(_ref, key=key):
        with _previous_attn_lock:
            entry = _previous_attn.get(key)
            if entry is not None and entry[0] is _ref:
                del _previous_attn[key]

    with _previous_attn_lock:
        _previous_attn[key] = (weakref.ref(config, forget), previous)


def _entry(config):
    """config's (weak reference, previous implementation), or None (an id reused by another object too)."""
    entry = _previous_attn.get(id(config))
    return entry if entry is not None and entry[0]() is config else None


def _has_previous(config) -> bool:
    return _entry(config) is not None


def _pop_previous(config):
    """(True, previous implementation) once per use_kvarn_attention; (False, None) if nothing is remembered."""
    with _previous_attn_lock:
        entry = _entry(config)
        if entry is None:
            return False, None
        del _previous_attn[id(config)]
    return True, entry[1]


def use_kvarn_attention(model_or_config) -> None:
    """Routes a model's (or config's) attention through ``kvarn_attention``; the previous
    implementation is remembered (outside the config) for ``restore_attention``."""
    register()
    config = getattr(model_or_config, "config", model_or_config)
    previous = getattr(config, "_attn_implementation", None)
    if previous != ATTN_IMPLEMENTATION:
        _remember_previous(config, previous)
    if hasattr(model_or_config, "set_attn_implementation"):
        model_or_config.set_attn_implementation(ATTN_IMPLEMENTATION)
    else:
        model_or_config._attn_implementation = ATTN_IMPLEMENTATION


def restore_attention(model_or_config) -> None:
    """Undoes ``use_kvarn_attention`` (which building a KVarNCache does): the model's attention
    implementation goes back to what it was, e.g. for eager-only features. A KVarNCache built on
    this config refuses to run until it is switched to ``"kvarn"`` again. A copy of a switched model
    (``copy.deepcopy``) goes back to ``"sdpa"`` (``"eager"`` where the model has no sdpa): what its
    original replaced is remembered for the original config object only, never written into it."""
    config = getattr(model_or_config, "config", model_or_config)
    if not _has_previous(config) and hasattr(config, "get_text_config"):
        text = config.get_text_config()  # a multimodal model's: KVarNCache switched its language model's config
        switched = getattr(text, "_attn_implementation", None) == ATTN_IMPLEMENTATION
        if text is not config and (_has_previous(text) or (switched and getattr(
                config, "_attn_implementation", None) != ATTN_IMPLEMENTATION)):
            config = model_or_config = text
    if getattr(config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
        return
    found, previous = _pop_previous(config)
    if not found:
        previous = "sdpa"
    if hasattr(model_or_config, "set_attn_implementation") and previous is not None:
        try:
            model_or_config.set_attn_implementation(previous)
        except ValueError:  # a copy's guess: this model has no sdpa
            if found:
                raise
            model_or_config.set_attn_implementation("eager")
    else:
        config._attn_implementation = previous


@contextlib.contextmanager
def attention_override(fn):
    """Within the block, every non-KVarN attention call is ``fn(module, query, key, value, mask, scaling)``
    (returning [B, q, Hq, D]) instead of sdpa. The model must use the ``"kvarn"`` implementation."""
    token = _override.set(fn)
    try:
        yield
    finally:
        _override.reset(token)


def cache_kwargs(model, cache) -> dict:
    """{name: cache} for ``model(...)``: transformers 5.x renamed the forward's ``past_key_values``
    to ``cache`` (the old name warns, and goes in 5.40)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {"cache" if "cache" in params else "past_key_values": cache}


_FLOAT_TENSOR_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _check_tensor(x, name: str, ndim: int = 4) -> None:
    """A float torch tensor of ndim dimensions (kvarn's core refuses other dtypes too: an int, bool or
    complex tensor cast to float32 would lose its values silently)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in _FLOAT_TENSOR_DTYPES:
        raise TypeError(f"{name}: dtype {x.dtype} is not supported; use float16, bfloat16, float32 or float64")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected a {ndim}-D tensor [batch, heads, tokens, head_dim], got shape "
                         f"{tuple(x.shape)}")


def _to_numpy(x: torch.Tensor, keep_f16: bool = False) -> np.ndarray:
    """x as a numpy array: a float32 CPU tensor (and with keep_f16 a float16 one: K/V, which the caches
    store as fp16 anyway) without a copy or a cast; anything else as float32."""
    if x.is_cpu and not x.requires_grad and (x.dtype is torch.float32 or (keep_f16 and x.dtype is torch.float16)):
        return x.numpy()
    return x.detach().to("cpu", torch.float32).numpy()


def _visible_keys(attention_mask, batch: int, n_keys: int, n_queries: int = 1) -> np.ndarray:
    """[batch, n_queries, n_keys] bool: the keys each of the last n_queries queries of each row may attend
    (None: all). A mask that differs between heads is refused: kvarn attention applies none."""
    if attention_mask is None:
        return np.ones((batch, n_queries, n_keys), bool)
    if attention_mask.dim() != 4 or attention_mask.shape[-1] != n_keys or attention_mask.shape[-2] < n_queries:
        raise NotImplementedError("KVarNCache: unsupported attention mask layout")
    rows = attention_mask[:, :, attention_mask.shape[-2] - n_queries :, :]
    visible = (rows if rows.dtype == torch.bool else rows == 0).cpu().numpy()
    if visible.shape[1] > 1 and not (visible == visible[:, :1]).all():
        raise NotImplementedError("KVarNCache: the attention mask differs between heads; kvarn attention has no mask, "
                                  "so only left-padded, causal masks are supported")
    return np.broadcast_to(visible[:, 0], (batch, n_queries, n_keys))


def _left_padding(visible: np.ndarray) -> list[int]:
    """Per row, the number of hidden keys, which must all come first (left padding)."""
    pads = []
    for b, row in enumerate(visible):
        p = int(len(row) - row.sum())
        if p == len(row):
            raise NotImplementedError(
                f"KVarNCache: batch row {b}'s keys are all padding here ({p}): an empty prompt, or a chunked prefill "
                "whose first chunk the row's left padding fills (use a prefill_chunk_size longer than the longest "
                "padding)"
            )
        if row[:p].any() or not row[p:].all():
            raise NotImplementedError(
                f"KVarNCache: batch row {b}'s mask is not left padding followed by the sequence; kvarn "
                "attention has no mask, so only left-padded prompts are supported"
            )
        pads.append(p)
    return pads


def _restore_attributes(obj, saved: dict) -> None:
    obj.__dict__.clear()
    obj.__dict__.update(saved)


class _StepJournal:
    """What the current forward stored, layer by layer, as undo functions: a step one layer rejects is
    undone in the layers before it too, so a rejected step leaves the whole cache as it was. A forward
    starts it (KVarNCache.update of layer 0) and its last layer's attention releases it; crop, row changes
    and reset() stop it (its entries would no longer fit). Layers driven directly, not through
    KVarNCache.update, record nothing."""

    def __init__(self, layers: int = 0, late_refusal=None, gpu_flags=None):
        self.undo = []
        self.active = self.released = False
        self.layers = layers  # when this many layers have taken the step (attention run), the forward is done
        self.taken = 0
        self.late_refusal = late_refusal  # a refusal after the release: nothing left to undo (see KVarNCache)
        # GPU layers' deferred checks: [an int32 CUDA tensor their steps OR flag bits into, or None], read once
        # the last layer has taken the step (one synchronisation per forward instead of one per layer)
        self.gpu_flags = gpu_flags

    def __deepcopy__(self, memo):  # a copied cache starts between forwards: nothing to undo
        import copy

        return _StepJournal(self.layers, self.late_refusal, copy.deepcopy(self.gpu_flags, memo))

    def __reduce__(self):  # pickled the same way (checkpoints do not pickle)
        return _StepJournal, (self.layers, self.late_refusal, self.gpu_flags)

    def start(self) -> None:
        self.undo.clear()
        self.active, self.taken = True, 0
        self.released = False

    def add(self, fn) -> None:
        if self.active:
            self.undo.append(fn)

    def took(self) -> None:
        """A layer's attention ran over the step. After the last one nothing is left to undo: the checkpoints
        (old packed buffers) and snapshots (a sliding window's previous K/V) are released."""
        if self.active:
            self.taken += 1
            if self.taken >= self.layers:
                self._check_gpu_flags()
                self.clear()
                self.released = True

    def _check_gpu_flags(self) -> None:
        """Raises, with the forward undone in every layer, if a GPU layer's checks flagged its step (NaN/Inf or
        beyond-fp16 K/V or queries, a tile whose scales overflow fp16, keys beyond the kernels' norm bound)."""
        flags = self.gpu_flags[0] if self.gpu_flags else None
        if flags is None:
            return
        bits = int(flags.item())  # waits for the forward's GPU work so far
        if bits:
            from .. import cuda as kvarn_cuda

            flags.zero_()
            error = ValueError(f"KVarNCache: this step's {kvarn_cuda.flags_error(bits, query='query')} (found by "
                               "the GPU layers' checks after the forward's last layer; the step was undone in every "
                               "layer)")
            self.rollback(str(error))
            raise error

    def clear(self) -> None:
        self.undo.clear()
        self.active = False
        self.released = False

    def rollback(self, why: str = "") -> None:
        if self.released:  # every layer had stored the step: it stays, and the cache is
            self.late_refusal = why or "a refusal after the forward's last layer"  # refused until reset()
        while self.undo:
            self.undo.pop()()


class KVarNLayer(CacheLayerMixin):
    """One attention layer's cache: one ``kvarn.KVCache`` per batch row.

    crop_window > 0 keeps each row's last ``crop_window`` tokens in fp16 besides the cache (a
    ring), so that ``crop`` can cut inside a quantised tile: it truncates the row's cache to the
    tile's start and appends the kept tokens again, which gives exactly the cache that never held
    the removed tokens. Any crop of up to ``crop_window - group`` tokens works.
    """

    is_sliding = False
    is_compileable = False

    def __init__(self, preset: PresetLike = kvarn.DEFAULT_PRESET, sink_tokens: int | None = None,
                 quantize_on: str = "fill", crop_window: int = 0, max_cache_len: int | None = None) -> None:
        super().__init__()
        # Validates preset, sink_tokens and quantize_on now rather than at the first forward.
        # The Preset itself: a custom one's name alone could not be resolved again.
        self.preset = kvarn.KVCache(1, 64, preset, sink_tokens, quantize_on=quantize_on).preset
        self.sink_tokens = sink_tokens
        self.quantize_on = quantize_on
        self.crop_window = check_positive_int(crop_window, "crop_window", 0)
        # Tokens each row's KVCache has room for from the first forward (KVCache.reserve); None: it grows as needed.
        self.max_cache_len = None if max_cache_len is None else check_positive_int(max_cache_len, "max_cache_len")
        if 0 < self.crop_window <= self.preset.group:
            raise ValueError(
                f"crop_window: {crop_window} tokens cannot hold a quantised tile of {self.preset.group} and the tail "
                "after it, so only some crops into the tile could be served (assisted decoding would fail part-way; "
                f"crops inside the fp16 tail need no window); it must exceed the group: {2 * self.preset.group} "
                f"serves any crop of up to {self.preset.group} tokens")
        self.caches: list[kvarn.KVCache] = []
        self.pads: list[int] = []  # per row: left-padding positions, not stored in its cache
        self.cumulative_length = 0
        self._pending = None
        self._prefill = None
        self._ring_k = self._ring_v = None  # [B, Hk, crop_window, D] fp16: slot p % crop_window <- position p
        self._ring_from: list[int] = []  # per row: the first cache position still in the ring
        # Shared by the layers of one KVarNCache: the last error a layer rejected a step with, for
        # KVarNCache's message when a forward that failed part-way left the layers at different lengths.
        self._failure = [None]
        self._journal: _StepJournal | None = None  # KVarNCache's, shared by its layers (None: standalone)

    @property
    def is_croppable(self) -> bool:
        """transformers asks this before assisted decoding: only with a crop window can every
        rollback it needs be done."""
        return self.crop_window > 0

    def _remember(self, b: int, start: int, k: np.ndarray, v: np.ndarray, saved: list | None = None) -> None:
        """Copies the last of the tokens k, v [Hk, n, D] stored at row b's positions start.. into its crop ring
        (what they overwrite goes to ``saved``, for _restore_ring)."""
        W = self.crop_window
        if W:
            n = k.shape[1]
            keep = min(n, W)
            slots = np.arange(start + n - keep, start + n) % W
            if saved is not None:
                saved.append((b, slots, self._ring_k[b][:, slots], self._ring_v[b][:, slots], self._ring_from[b]))
            self._ring_k[b][:, slots] = k[:, n - keep :]
            self._ring_v[b][:, slots] = v[:, n - keep :]
            self._ring_from[b] = max(self._ring_from[b], start + n - W)

    def _fail(self, error: BaseException) -> None:
        """Records a rejected step and undoes what the layers before this one stored of it."""
        self._failure[0] = f"{type(error).__name__}: {error}"
        if self._journal is not None:
            self._journal.rollback(self._failure[0])

    def _restore_ring(self, saved: list) -> None:
        for b, slots, old_k, old_v, old_from in reversed(saved):
            self._ring_k[b][:, slots] = old_k
            self._ring_v[b][:, slots] = old_v
            self._ring_from[b] = old_from

    def _undo_step(self, checkpoints, n: int, ring_saved: list) -> None:
        """attend_pending's step undone: every row back to its checkpoint, the ring as it was."""
        for c, checkpoint in zip(self.caches, checkpoints):
            c.rollback(checkpoint)
        self._restore_ring(ring_saved)
        self.cumulative_length -= n

    def _empty(self) -> None:
        self.caches, self.pads, self.cumulative_length, self._pending, self._prefill = [], [], 0, None, None
        self._ring_k = self._ring_v = None
        self._ring_from = []
        self.is_initialized = False

    @staticmethod
    def _row_error(b: int, error: ValueError) -> ValueError:
        return ValueError(f"KVarNCache: batch row {b}'s key/value states: {error}")

    def lazy_initialization(self, key_states, value_states) -> None:
        B, Hk, _, D = key_states.shape
        self.device, self.dtype = key_states.device, key_states.dtype
        caches = [kvarn.KVCache(Hk, D, self.preset, self.sink_tokens, quantize_on=self.quantize_on) for _ in range(B)]
        if self.max_cache_len is not None:
            try:
                for cache in caches:
                    cache.reserve(self.max_cache_len)
            except MemoryError as e:  # KVCache.reserve names its own argument; the user gave max_cache_len
                raise MemoryError(f"max_cache_len: {self.max_cache_len} tokens for each of {B} rows: {e}") from None
        self.caches = caches
        if self.crop_window:
            self._ring_k = np.zeros((B, Hk, self.crop_window, D), np.float16)
            self._ring_v = np.zeros_like(self._ring_k)
            self._ring_from = [0] * B
        self.is_initialized = True

    def update(self, key_states, value_states, *args, **kwargs):
        # Before any state changes: a rejected step leaves nothing stashed that later forwards would refuse,
        # and the layers before this one give back what they stored of it (_fail), as for any refused step.
        try:
            self._check_step(key_states, value_states)
        except (TypeError, ValueError) as error:
            self._fail(error)
            raise
        if not self.is_initialized:
            try:
                self.lazy_initialization(key_states, value_states)
            except BaseException as error:  # a GPU pool that cannot be allocated, say
                self._fail(error)
                raise
        if self._pending is not None or self._prefill is not None:
            raise RuntimeError("KVarNCache: the previous step's attention never ran; is attn_implementation 'kvarn'?")
        if self.cumulative_length == 0:
            # Prefill: the prompt attends over its own full-precision K/V; the attention function
            # then stores it (store_prefill), leaving out the padding its mask hides. The tokens
            # count (cumulative_length) once stored: an interrupt before that leaves the layer empty.
            self._prefill = (key_states, value_states)
            setattr(key_states, _PREFILL_TAG, self)
            return key_states, value_states
        self._pending = (key_states, value_states)
        setattr(key_states, _TAG, self)
        return key_states, value_states

    def _check_step(self, key_states, value_states) -> None:
        _check_tensor(key_states, "key_states")
        _check_tensor(value_states, "value_states")
        if value_states.shape != key_states.shape:
            raise ValueError(f"value_states: shape {tuple(value_states.shape)} does not match key_states' "
                             f"{tuple(key_states.shape)}")
        if not self.is_initialized:
            return
        if key_states.shape[0] != len(self.caches):
            raise ValueError(f"key_states: batch {key_states.shape[0]} differs from the cache's {len(self.caches)}")
        if self.caches and (key_states.shape[1], key_states.shape[3]) != (
                self.caches[0].num_kv_heads, self.caches[0].head_dim):
            raise ValueError(f"key_states: shape {tuple(key_states.shape)} does not match the cache's "
                             f"[batch, {self.caches[0].num_kv_heads}, tokens, {self.caches[0].head_dim}]")

    def store_prefill(self, attention_mask) -> None:
        """Appends the prompt's K/V to each row's cache, without the row's left padding."""
        key_states, value_states = self._prefill
        self._prefill = None
        B, _, n, _ = key_states.shape
        try:
            pads = _left_padding(_visible_keys(attention_mask, B, n)[:, -1])
            self._store_prompt(key_states, value_states, pads)
        except BaseException as e:
            self._empty()  # the layer is empty again, as before the prompt
            self._fail(e)
            raise
        self.pads = pads
        self.cumulative_length = n
        if self._journal is not None:
            self._journal.add(self._empty)
            self._journal.took()

    def _store_prompt(self, key_states, value_states, pads) -> None:
        k, v = _to_numpy(key_states, keep_f16=True), _to_numpy(value_states, keep_f16=True)
        for b, c in enumerate(self.caches):
            try:
                c.append(k[b, :, pads[b] :], v[b, :, pads[b] :])
            except ValueError as e:
                raise self._row_error(b, e) from e
            self._remember(b, 0, k[b, :, pads[b] :], v[b, :, pads[b] :])

    def attend_pending(self, query, attention_mask, scaling) -> torch.Tensor:
        """Appends the kept-aside tokens one at a time, each followed by kvarn decode attention."""
        key_states, value_states = self._take_pending(query, attention_mask)
        B, Hq, n, D = query.shape
        k, v, q = _to_numpy(key_states, keep_f16=True), _to_numpy(value_states, keep_f16=True), _to_numpy(query)
        out = np.empty((B, n, Hq, D), np.float32)  # and torch.from_numpy below: torch.empty + numpy() cost ~4 us more
        # A rejected token (NaN, a tile whose scales overflow fp16, a bad query) must not leave some rows
        # holding it: every row returns to its checkpoint, exactly (also across a tile quantised since).
        before = [c.checkpoint() for c in self.caches]
        try:
            # kvarn.append_attend_batch without its checks of the caches, which this layer made alike (heads,
            # head_dim): per layer and step they cost more than the query's. The step's tokens are attended
            # as if appended one at a time, in chunks that complete no tile (one native call each).
            scale = check_scale(scaling, D)
            qs = check_step_queries(q, self.caches[0].num_kv_heads, D, scale)
            append_attend_chunks(qs, self.caches, k, v, scale, None, out, self._row_error)
        except BaseException as e:
            for c, checkpoint in zip(self.caches, before):
                c.rollback(checkpoint)
            self._fail(e)
            raise
        journal = self._journal if self._journal is not None and self._journal.active else None
        ring_saved = [] if journal is not None else None
        if self.crop_window:
            for b, c in enumerate(self.caches):
                self._remember(b, len(c) - n, k[b], v[b], ring_saved)
        self.cumulative_length += n
        if journal is not None:  # the checkpoints live until every layer has taken the step
            journal.add(functools.partial(self._undo_step, before, n, ring_saved))
            journal.took()
        out_tensor = torch.from_numpy(out)
        if query.dtype is torch.float32 and query.is_cpu:
            return out_tensor
        return out_tensor.to(device=query.device, dtype=query.dtype)

    def _take_pending(self, query, attention_mask):
        """The step kept aside by update, once the query, the grad mode and the mask are found fit for kvarn
        attention (else raises, with this layer as before the step and the layers before it undone)."""
        if self._pending is None:
            raise RuntimeError("KVarNCache: attention called without new tokens")
        key_states, value_states = self._pending
        self._pending = None
        if torch.is_grad_enabled() and any(x.requires_grad for x in (query, key_states, value_states)):
            error = RuntimeError(
                "KVarNCache: kvarn decode attention is not differentiable; run under torch.no_grad() or "
                "torch.inference_mode() (it runs through numpy and kvarn's kernels: gradients would skip it)"
            )
            self._fail(error)  # this layer is as before the step; the ones before it stored it
            raise error
        try:
            _check_tensor(query, "query")
            if (query.shape[0], query.shape[2], query.shape[3]) != (
                    key_states.shape[0], key_states.shape[2], key_states.shape[3]):
                raise ValueError(f"query: shape {tuple(query.shape)} does not match this step's key_states "
                                 f"{tuple(key_states.shape)} (batch, tokens and head_dim must agree)")
        except (TypeError, ValueError) as error:
            self._fail(error)  # this layer is as before the step
            raise
        B, Hq, n, D = query.shape
        # The mask must hide exactly the prompt's left padding, and each of the step's tokens must see the
        # ones before it and none after (the tokens are appended one at a time, each attending the cache so
        # far): a tree or other custom mask over a multi-token step would be ignored. No mask (an unpadded
        # batch's step) means causal: right when no row was padded. Every layer of a forward gets the same
        # mask tensor: the first layer's verdict is tagged on it and the others reuse it.
        verdict = (self.cumulative_length + n, tuple(self.pads))
        if (attention_mask is None and any(self.pads)) or (
                attention_mask is not None and getattr(attention_mask, _MASK_CHECKED, None) != verdict):
            try:
                visible = _visible_keys(attention_mask, B, self.cumulative_length + n, n)
            except NotImplementedError as error:
                self._fail(error)
                raise
            keys = np.arange(self.cumulative_length + n)
            last_seen = self.cumulative_length + np.arange(n)[:, None]  # query i sees keys up to its own
            for b, p in enumerate(self.pads):
                if visible[b, -1, :p].any() or not visible[b, -1, p:].all():
                    why = "padding after the prompt is not supported (kvarn attention has no mask)"
                elif not np.array_equal(visible[b], (keys >= p) & (keys <= last_seen)):
                    why = (f"the mask over this step's {n} tokens is not causal (a tree or other custom mask); kvarn "
                           "attention appends them one at a time, each seeing the cache and the tokens before it")
                else:
                    continue
                error = NotImplementedError(f"KVarNCache: batch row {b}: {why}")
                self._fail(error)  # sliding layers before this one may have stored the step
                raise error
            if attention_mask is not None:
                setattr(attention_mask, _MASK_CHECKED, verdict)
        return key_states, value_states

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.cumulative_length + query_length, 0

    def get_seq_length(self) -> int:
        return self.cumulative_length

    def get_max_length(self) -> int:
        return -1

    @property
    def nbytes(self) -> int:
        ring = self._ring_k.nbytes + self._ring_v.nbytes if self._ring_k is not None else 0
        return sum(c.nbytes for c in self.caches) + ring

    def reset(self) -> None:
        self._empty()
        self._failure[0] = None  # Cache.reset() resets every layer: no earlier rejection to report
        if self._journal is not None:
            self._journal.clear()
            self._journal.late_refusal = None

    def offload(self):  # the packed cache stays where it lives (host memory, or a GPU layer's own GPU)
        pass

    def prefetch(self):
        pass

    def _rows(self, rows, what: str) -> list[int]:
        """rows (integer indices, or a boolean mask over the batch, as torch indexing reads it) as a
        list of batch rows; raises, changing nothing, unless it selects rows of this batch."""
        wrong_type = f"{what}: expected integer batch rows or a boolean mask, got "
        if isinstance(rows, torch.Tensor):
            rows = rows.detach().cpu().numpy()
        elif isinstance(rows, (str, bytes)):
            raise TypeError(wrong_type + type(rows).__name__)
        rows = np.asarray(rows)
        if rows.ndim != 1:
            raise ValueError(f"{what}: expected a 1-D index of batch rows, got shape {rows.shape}")
        if rows.dtype == bool:
            if len(rows) != len(self.caches):
                raise ValueError(f"{what}: a boolean mask of {len(rows)} for a batch of {len(self.caches)}")
            rows = np.flatnonzero(rows)
        elif rows.size and not np.issubdtype(rows.dtype, np.integer):
            raise TypeError(wrong_type + f"dtype {rows.dtype}")
        rows = [int(r) for r in rows]
        if not rows:
            raise ValueError(f"{what}: selects no batch rows")
        if any(not 0 <= r < len(self.caches) for r in rows):
            raise ValueError(f"{what}: batch rows {rows} out of range for a batch of {len(self.caches)}")
        return rows

    def _take_rows(self, rows: list[int]) -> None:
        """The batch becomes caches[rows[0]], caches[rows[1]], ... (rows checked by _rows): an old row's
        first use takes its cache object, later uses take copies (each row must own its cache: appends mutate)."""
        taken, caches = set(), []
        for r in rows:
            caches.append(self.caches[r] if r not in taken else self.caches[r].copy())
            taken.add(r)
        self.caches = caches
        self.pads = [self.pads[r] for r in rows]
        if self._ring_k is not None:  # fancy indexing copies: every row owns its ring
            self._ring_k, self._ring_v = self._ring_k[rows], self._ring_v[rows]
            self._ring_from = [self._ring_from[r] for r in rows]

    # Row changes in two steps (KVarNCache checks every layer before changing any): the plan raises
    # and changes nothing; None: nothing to do (the layer holds no tokens).
    def _rows_plan(self, rows, what: str):
        return self._rows(rows, what) if self.cumulative_length else None

    def _repeat_plan(self, repeats):
        repeats = check_positive_int(repeats, "repeats")
        if not self.cumulative_length:
            return None
        return [b for b in range(len(self.caches)) for _ in range(int(repeats))]

    def _apply_rows(self, plan) -> None:
        if plan is not None:
            self._take_rows(plan)

    def reorder_cache(self, beam_idx) -> None:
        """Beam search: row i continues beam beam_idx[i]."""
        self._apply_rows(self._rows_plan(beam_idx, "beam_idx"))

    def crop(self, tokens_to_remove: int) -> None:
        """Removes the last ``-tokens_to_remove`` tokens of every row (transformers' convention: a
        negative count). Cuts inside a quantised tile need the crop window; a crop that cannot be
        done exactly raises NotImplementedError and changes nothing."""
        self._apply_crop(self._crop_plan(tokens_to_remove))

    def _crop_plan(self, tokens_to_remove):
        """crop's checks (raising, changing nothing): (tokens removed, [(kept, truncation point)] per row), or None."""
        if isinstance(tokens_to_remove, bool) or not isinstance(tokens_to_remove, (int, np.integer)):
            raise TypeError(f"tokens_to_remove: expected an int, got {type(tokens_to_remove).__name__}")
        if tokens_to_remove > 0:
            raise ValueError(f"tokens_to_remove: expected a negative count of tokens to remove, got {tokens_to_remove}")
        r = -int(tokens_to_remove)
        if r == 0 or not self.caches:
            return None
        if r > min(len(c) for c in self.caches):
            raise ValueError(f"tokens_to_remove: {r} tokens is more than a batch row holds")
        plan = []
        for b, c in enumerate(self.caches):  # check every row before changing any
            keep = len(c) - r
            point = c.truncation_point(keep)
            if point < keep and (not self.crop_window or point < self._ring_from[b]):
                raise NotImplementedError(
                    f"KVarNCache: crop({tokens_to_remove}) cuts a quantised tile of batch row {b}, and its tokens are "
                    f"not in the crop window ({self.crop_window} tokens); use KVarNCache(..., crop_window=W) with "
                    f"W >= {r} + the tile size"
                )
            plan.append((keep, point))
        return r, plan

    def _apply_crop(self, crop_plan) -> None:
        if crop_plan is None:
            return
        r, plan = crop_plan
        W = self.crop_window
        for b, (keep, point) in enumerate(plan):
            c = self.caches[b]
            c.truncate(point)
            if point < keep:
                slots = np.arange(point, keep) % W
                c.append(self._ring_k[b][:, slots], self._ring_v[b][:, slots])
            if W:
                self._ring_from[b] = min(self._ring_from[b], keep)
        self.cumulative_length -= r

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._apply_rows(self._repeat_plan(repeats))

    def batch_select_indices(self, indices) -> None:
        self._apply_rows(self._rows_plan(indices, "indices"))


class _PagedRow:
    """One batch row of a GPU layer: a sequence of the layer's ``kvarn.cuda.PagedKVCache``, with the members
    of ``kvarn.KVCache`` that the layer code shared with host rows reads (length, heads, head_dim, cut points,
    bytes)."""

    __slots__ = ("paged", "seq")

    def __init__(self, paged, seq: int) -> None:
        self.paged, self.seq = paged, seq

    def __len__(self) -> int:
        return self.paged.length(self.seq)

    num_kv_heads = property(lambda self: self.paged.num_kv_heads)
    head_dim = property(lambda self: self.paged.head_dim)

    def truncation_point(self, length: int) -> int:
        return self.paged.truncation_point(self.seq, length)

    @property
    def nbytes(self) -> int:
        """Bytes its tokens occupy: records of the completed tiles (a page a fork shares counts in each row, as
        a shared records buffer does on the host) and fp16 K and V of the sink and tail."""
        p, n = self.paged, len(self)
        tiles = int(p._tile_counts(n))
        return tiles * p.num_kv_heads * p.record_bytes + (n - tiles * p.preset.group) * p.num_kv_heads * p.head_dim * 4


class KVarNCudaLayer(KVarNLayer):
    """One attention layer's cache on a GPU: one ``kvarn.cuda.PagedKVCache`` (a layer of its own, a sequence per
    batch row). Prefill appends each row's prompt without its left padding; each later step is one
    ``append_attend`` over the batch (q, k and v as transposed views of the model's tensors, no copies), after a
    ``checkpoint`` that undoes it if a later layer refuses the forward. Row changes (beam search,
    ``num_return_sequences``) free the rows left out and ``fork`` repeated ones (pages shared, not copied).
    The pool is allocated at the first forward for ``max_batch_size`` rows (default: that forward's batch) of
    ``max_cache_len`` tokens. crop_window > 0 keeps each row's last tokens in an fp16 ring on the GPU, as the host
    layer's: crop then cuts inside a quantised tile by truncating to its start and appending the kept tokens again."""

    def __init__(self, preset: PresetLike = kvarn.DEFAULT_PRESET, sink_tokens: int | None = None, crop_window: int = 0,
                 *, device: int, max_batch_size: int | None = None, max_cache_len: int = 32768) -> None:
        super().__init__(preset, sink_tokens, crop_window=crop_window)
        self.device_index = device
        self.max_batch_size = max_batch_size
        self.max_cache_len = max_cache_len
        self.paged = None  # kept across reset() for the next prompt when it fits
        self._torch_device = torch.device("cuda", device)
        self._flags = [None]  # KVarNCache's holder of the flags tensor its GPU layers share (see _StepJournal)

    def _check_step(self, key_states, value_states) -> None:
        super()._check_step(key_states, value_states)
        for name, x in (("key_states", key_states), ("value_states", value_states)):
            self._check_device(x, name)
            if x.dtype is torch.float64:
                raise TypeError(f"{name}: dtype float64 is not served by kvarn's CUDA kernels; use bfloat16, float16 "
                                "or float32")
        if not self.is_initialized and self.max_batch_size and key_states.shape[0] > self.max_batch_size:
            raise ValueError(f"key_states: batch {key_states.shape[0]} is more than "
                             f"max_batch_size={self.max_batch_size}")

    def _check_device(self, x, name: str) -> None:
        if x.device != self._torch_device:
            raise ValueError(f"{name}: on {x.device}, but this KVarNCache keeps its cache on cuda:{self.device_index} "
                             "(KVarNCache(..., device=...)); move the model there, or build the cache for the model's "
                             "device")

    def lazy_initialization(self, key_states, value_states) -> None:
        from .. import cuda as kvarn_cuda

        B, Hk, _, D = key_states.shape
        self.device, self.dtype = key_states.device, key_states.dtype
        p = self.paged
        if p is None or (p.num_kv_heads, p.head_dim) != (Hk, D) or p.max_seqs < B:
            rows = self.max_batch_size or B  # (_check_step refused B > max_batch_size)
            self.paged = None  # the old pool goes first: both may not fit
            self.paged = kvarn_cuda.PagedKVCache(Hk, D, self.preset, num_layers=1, max_seqs=rows,
                                                 max_seq_len=self.max_cache_len, sink_tokens=self.sink_tokens,
                                                 device=self.device_index)
        self.caches = [_PagedRow(self.paged, self.paged.add_sequence()) for _ in range(B)]
        if self._flags[0] is None:
            self._flags[0] = torch.zeros(1, dtype=torch.int32, device=key_states.device)
        if self.crop_window:  # on the GPU: slot p % crop_window <- position p, as the host ring
            self._ring_k = torch.zeros((B, Hk, self.crop_window, D), dtype=torch.float16, device=key_states.device)
            self._ring_v = torch.zeros_like(self._ring_k)
            self._ring_from = [0] * B
        self.is_initialized = True

    def _empty(self) -> None:
        for row in self.caches:
            row.paged.free(row.seq)
        super()._empty()

    def _store_prompt(self, key_states, value_states, pads) -> None:
        for b, row in enumerate(self.caches):
            try:  # [1, T, Hk, D] views of the row's tokens
                self.paged.append([row.seq], key_states[b : b + 1, :, pads[b] :].transpose(1, 2),
                                  value_states[b : b + 1, :, pads[b] :].transpose(1, 2))
            except ValueError as e:
                raise self._row_error(b, e) from e
        if self.crop_window:
            self._remember_step([0] * len(self.caches), key_states, value_states, pads)

    def attend_pending(self, query, attention_mask, scaling) -> torch.Tensor:
        """One append_attend of the kept-aside tokens over every row: token i attends the cache and the step's
        tokens up to its own, as if appended one at a time."""
        key_states, value_states = self._take_pending(query, attention_mask)
        seqs = [row.seq for row in self.caches]
        n = query.shape[2]
        try:
            scale = check_scale(scaling, query.shape[3])
            self._check_device(query, "query")
            journal = self._journal if self._journal is not None and self._journal.active else None
            # the undo of this step, should a later layer refuse the forward (copies nothing for one token)
            point = self.paged.checkpoint(seqs, n) if journal is not None else None
            # Within a KVarNCache's forward the checks run on the GPU into the shared flags, read once after the
            # last layer (which undoes the step everywhere if they found anything): a wait per layer cost the
            # overlap of host and GPU work. Alone, the step is checked here (a refused one undoes itself).
            deferred = journal is not None and journal.gpu_flags is self._flags
            out = self.paged.append_attend(query.transpose(1, 2), seqs, key_states.transpose(1, 2),
                                           value_states.transpose(1, 2), scale=scale, validate=not deferred,
                                           flags=self._flags[0] if deferred else None)
        except BaseException as e:
            self._fail(e)
            raise
        ring_saved = self._remember_step([len(row) - n for row in self.caches], key_states, value_states) \
            if self.crop_window else None
        self.cumulative_length += n
        if journal is not None:  # the checkpoint lives until every layer has taken the step
            journal.add(functools.partial(self._rollback_step, point, n, ring_saved))
            journal.took()
        return out

    def _rollback_step(self, point, n: int, ring_saved) -> None:
        self.paged.rollback(point)
        if ring_saved is not None:
            index, old_k, old_v, old_from = ring_saved
            self._ring_k[index], self._ring_v[index] = old_k, old_v
            self._ring_from = old_from
        self.cumulative_length -= n

    def _remember_step(self, starts, key_states, value_states, pads=None):
        """Copies each row's last (up to crop_window) tokens of key/value_states [B, Hk, n, D] (after its left
        padding, pads) into the ring, row b's first one at position starts[b]; returns what it overwrote (for
        _rollback_step). One gather and one scatter per buffer: every row's slots at once."""
        W, n = self.crop_window, key_states.shape[2]
        old_from = list(self._ring_from)
        rows, slots, cols = [], [], []
        for b, start in enumerate(starts):
            pad = pads[b] if pads else 0
            first = max(pad, n - W)  # the tokens that stay in the window: cache positions start + (first - pad) ..
            rows += [b] * (n - first)
            slots += ((start + np.arange(first - pad, n - pad)) % W).tolist()
            cols += range(first, n)
            self._ring_from[b] = max(self._ring_from[b], start + n - pad - W)
        device = self._ring_k.device
        r, c, t = (torch.as_tensor(x, dtype=torch.long).to(device, non_blocking=True) for x in (rows, slots, cols))
        index = (r, slice(None), c)
        saved = (index, self._ring_k[index].clone(), self._ring_v[index].clone(), old_from)
        self._ring_k[index] = key_states[r, :, t].to(torch.float16)
        self._ring_v[index] = value_states[r, :, t].to(torch.float16)
        return saved

    def _rows_plan(self, rows, what: str):
        plan = super()._rows_plan(rows, what)
        return self._check_batch(plan, what)

    def _repeat_plan(self, repeats):
        return self._check_batch(super()._repeat_plan(repeats), "repeats")

    def _check_batch(self, plan, what: str):
        if plan is not None and len(plan) > self.paged.max_seqs:
            raise ValueError(f"{what}: a batch of {len(plan)} rows is more than the {self.paged.max_seqs} this cache "
                             "was allocated for (KVarNCache(..., max_batch_size=...))")
        return plan

    def _take_rows(self, rows: list[int]) -> None:
        """The batch becomes rows rows[0], rows[1], ...: the rows left out are freed first (their slots serve the
        forks), an old row's first use keeps its sequence, later uses fork it."""
        keep = set(rows)
        for b, row in enumerate(self.caches):
            if b not in keep:
                self.paged.free(row.seq)
        taken, caches = set(), []
        for r in rows:
            row = self.caches[r]
            caches.append(row if r not in taken else _PagedRow(self.paged, self.paged.fork(row.seq)))
            taken.add(r)
        self.caches = caches
        self.pads = [self.pads[r] for r in rows]
        if self._ring_k is not None:  # indexing copies: every row owns its ring
            self._ring_k, self._ring_v = self._ring_k[rows], self._ring_v[rows]
            self._ring_from = [self._ring_from[r] for r in rows]

    def _apply_crop(self, crop_plan) -> None:
        if crop_plan is None:
            return
        r, plan = crop_plan
        W = self.crop_window
        for b, (row, (keep, point)) in enumerate(zip(self.caches, plan)):
            self.paged.truncate(row.seq, point)
            if point < keep:  # a cut inside a quantised tile (_crop_plan checked the ring holds its tokens)
                slots = torch.as_tensor(np.arange(point, keep) % W, device=self._ring_k.device)
                self.paged.append([row.seq], self._ring_k[b][:, slots].transpose(0, 1)[None],
                                  self._ring_v[b][:, slots].transpose(0, 1)[None])
            if W:
                self._ring_from[b] = min(self._ring_from[b], keep)
        self.cumulative_length -= r

    def __deepcopy__(self, memo):
        """A copy with a pool of its own holding the same tokens (each row through the host: to_cpu, load_cpu)."""
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.items():
            if name not in ("paged", "caches"):
                setattr(new, name, copy.deepcopy(value, memo))
        new.paged, new.caches = None, []
        p = self.paged
        if p is not None:
            new.paged = type(p)(p.num_kv_heads, p.head_dim, p.preset, num_layers=1, max_seqs=p.max_seqs,
                                max_seq_len=p.max_seq_len, sink_tokens=p.sink_tokens, device=p.device)
            for row in self.caches:
                seq = new.paged.add_sequence()
                if len(row):
                    new.paged.load_cpu(seq, p.to_cpu(row.seq))
                new.caches.append(_PagedRow(new.paged, seq))
        return new


@functools.lru_cache(maxsize=None)
def _model_class_support(config_type):
    """For the causal-LM class transformers builds for this config type: (class name, whether its attention goes
    through transformers' attention interface, whether it adds learned attention sinks), or None where the auto
    mapping has no class or its source cannot be read. The interface question is transformers' own rule
    (``_can_set_attn_implementation``: the attention modules of the class's file look the interface up; a file
    with none, a wrapper or a subclass, counts as yes). The sinks one: that file (transformers' own) passes
    ``s_aux``."""
    try:
        from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING

        cls = MODEL_FOR_CAUSAL_LM_MAPPING[config_type]
        interface = bool(cls._can_set_attn_implementation())
        # Only transformers' own files are read for this: any other text may mention it (the attention call's
        # guard below catches sinks in models defined elsewhere, at the first forward).
        sinks = cls.__module__.startswith("transformers.models.") and "s_aux" in inspect.getsource(
            sys.modules[cls.__module__])
    except Exception:  # not in the mapping, an older transformers, no source file: nothing to go on
        return None
    return cls.__name__, interface, sinks


def _config_values(config, name, default=None) -> list:
    """Every value an attribute takes over the layers: the config-wide one, or one per layer where the config
    sets it per layer (transformers 5.25's ``per_layer_config``: Gemma 4's head_dim, or any config built with
    it), whose config-wide read raises."""
    if name in (getattr(config, "per_layer_attributes", None) or ()):
        return [getattr(layer, name, default) for layer in config.per_layer_config]
    return [getattr(config, name, default)]


def _layer_value(config, name, index: int, default=None):
    """The attribute for one layer (see _config_values)."""
    if name in (getattr(config, "per_layer_attributes", None) or ()):
        return getattr(config.per_layer_config[index], name, default)
    return getattr(config, name, default)


def _layer_head_dim(config, index: int):
    """A layer's head_dim: its own, else hidden_size // num_attention_heads (None where neither says)."""
    head_dim = _layer_value(config, "head_dim", index)
    hidden, heads = _layer_value(config, "hidden_size", index), _layer_value(config, "num_attention_heads", index)
    if not isinstance(head_dim, int) and isinstance(hidden, int) and isinstance(heads, int) and heads:
        head_dim = hidden // heads
    return head_dim


def _check_model_support(config, text_config) -> None:
    # ALiBi's position bias reaches attention as an additive mask: refused by name, before the rules below (the
    # interface one held Falcon back until transformers 5.25 ported it; after that its first forward was refused
    # for a mask that "is not left padding", which did not say why).
    if any(v is True for v in _config_values(text_config, "alibi", False)):
        raise NotImplementedError("config: alibi=True: ALiBi adds a position bias to the attention scores, which kvarn "
                                  "attention (scores with neither bias nor mask) cannot apply; use the model's own cache")
    answers = [a for a in {id(c): _model_class_support(type(c)) for c in (config, text_config)}.values() if a]
    # A wrapper's class may say nothing useful about its text model's: refused only if no class says yes.
    if answers and not any(interface for _, interface, _ in answers):
        raise NotImplementedError(
            f"config: {answers[0][0]} computes attention in its own code, not through transformers' attention "
            "interface, so kvarn attention cannot take its place; use the model's own cache")
    for name, _, sinks in answers:
        if sinks:
            raise NotImplementedError(
                f"config: {name} adds learned attention sinks (s_aux) to its attention, which neither kvarn "
                "attention nor the sdpa attention it runs for prompts has; use the model's own cache")
    # Attention that reshapes or re-projects the K/V after the cache update (refused at the first forward
    # otherwise, by a message that must list every possible cause): named here, before anything changes.
    lora = next((v for v in _config_values(text_config, "kv_lora_rank") if v), None)
    if lora:
        raise NotImplementedError(f"config: multi-head latent attention (kv_lora_rank={lora}) re-projects the cached "
                                  "K/V after the cache update, which KVarNCache does not support; use the model's "
                                  "own cache")
    if getattr(text_config, "model_type", None) == "jetmoe":
        raise NotImplementedError("config: JetMoE's mixture of attention heads reshapes the cached K/V after the cache "
                                  "update, which KVarNCache does not support; use the model's own cache")
    shared = next((v for v in _config_values(text_config, "num_kv_shared_layers") if v), None)
    if shared:
        raise NotImplementedError(f"config: num_kv_shared_layers={shared}: layers that reuse another layer's K/V "
                                  "are not supported by KVarNCache")


def _physical_memory():
    """This machine's memory in bytes, or None where the OS does not say."""
    try:
        size = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no os.sysconf (Windows) or no such name
        return None
    return size if size > 0 else None


def _check_crop_ring(crop_window: int, group: int, layer_dims) -> None:
    """Refuses a crop window whose fp16 ring (allocated whole at the first forward, K and V of every kv-head and
    channel per KVarN layer; layer_dims: (kv_heads, head_dim) of each) cannot fit this machine's memory even for one
    batch row: numpy's MemoryError came mid-generate. Unknown dimensions count at their least (one head, head_dim
    16), so what works is never refused."""
    memory = _physical_memory()
    if not crop_window or memory is None:
        return
    dims = [(kv_heads if isinstance(kv_heads, int) and kv_heads > 0 else 1,
             head_dim if isinstance(head_dim, int) and head_dim > 0 else 16) for kv_heads, head_dim in layer_dims]
    per_token = sum(2 * 2 * kv_heads * head_dim for kv_heads, head_dim in dims)
    n = len(dims)
    shape = (f"{dims[0][0]} kv-heads x {dims[0][1]} channels" if len(set(dims)) == 1
             else "each layer's kv-heads x channels")
    if crop_window * per_token > memory:
        raise ValueError(
            f"crop_window: {crop_window} tokens need a {crop_window * per_token / 2**30:,.1f} GiB fp16 ring per batch "
            f"row ({per_token} bytes a token: K and V of {shape} in {n} layer{'s' * (n != 1)}), more than this machine's {memory / 2**30:,.1f} GiB of memory: at "
            f"most {memory // per_token} tokens fit; {2 * group} serves any crop of up to {group} tokens")


def _gpu_options(device, max_batch_size, max_cache_len, config, preset, quantize_on, head_dims):
    """KVarNCudaLayer's keyword arguments for KVarNCache's device options (None: a host cache), checked: a
    visible GPU that kvarn's CUDA module serves, and layers it serves."""
    if device is None:
        if max_batch_size is not None:
            raise ValueError("max_batch_size: sizes the pools of a GPU cache (device='cuda'); the host cache grows as "
                             "needed")
        return None
    if isinstance(device, bool) or not isinstance(device, (int, np.integer, str, torch.device)):
        raise TypeError(f"device: expected 'cuda', 'cuda:N', a torch.device, an int or None, got "
                        f"{type(device).__name__}")
    try:
        where = torch.device("cuda", int(device)) if isinstance(device, (int, np.integer)) else torch.device(device)
    except (RuntimeError, ValueError) as e:
        raise ValueError(f"device: {device!r} is not a device ({e})") from None
    if where.type != "cuda":
        raise ValueError(f"device: {device!r}; expected a CUDA device ('cuda', 'cuda:N'), or None for the host cache")
    from .. import cuda as kvarn_cuda

    reason = kvarn_cuda.unavailable_reason(where.index)
    if reason is not None:
        raise RuntimeError(f"device: {device!r}: {reason}")
    index = where.index
    if index is None:
        rc, index = kvarn_cuda._cuda.get_device()
        kvarn_cuda._check(rc, "device")
    if quantize_on != "fill":
        raise ValueError(f"quantize_on: {quantize_on!r} is not served by the GPU cache (its tiles are quantised as "
                         "they fill); use 'fill', or device=None")
    p = get_preset(preset)
    for i, head_dim in head_dims.items():
        if isinstance(head_dim, int) and (head_dim not in kvarn_cuda.GPU_HEAD_DIMS
                                          or not kvarn_cuda._cuda.format_supported(p.kbits, p.vbits, p.group, head_dim)):
            raise ValueError(f"config: layer {i}'s head_dim {head_dim} with preset {p.describe()} is not served by "
                             f"kvarn's CUDA kernels (head_dim {', '.join(map(str, kvarn_cuda.GPU_HEAD_DIMS))}); use "
                             "device=None")
    if max_batch_size is not None:
        max_batch_size = check_positive_int(max_batch_size, "max_batch_size")
    if max_cache_len is None:
        limit = getattr(config, "max_position_embeddings", None)
        max_cache_len = min(limit, 32768) if isinstance(limit, int) and limit > 0 else 32768
    else:
        max_cache_len = check_positive_int(max_cache_len, "max_cache_len")
    return dict(device=int(index), max_batch_size=max_batch_size, max_cache_len=max_cache_len)


class KVarNCache(Cache):
    """A transformers ``Cache`` storing every full-attention layer's K/V as a KVarN cache.

    config: the model's config (``model.config``); it is switched to the ``"kvarn"`` attention
    implementation. preset: a kvarn preset (default k4v2_g128). sink_tokens: tokens kept in
    fp16 at the start (default one tile). quantize_on: "fill" (SPEC §7, default) or "next" (a
    full tile stays exact until the next token, so each token reads its own tile exact); see
    kvarn.KVCache. crop_window: fp16 tokens kept per row besides the cache so that ``crop`` can
    roll back into a quantised tile (assisted / prompt-lookup decoding); 0 (default) keeps none,
    and assisted decoding then refuses the cache. ``2 * group`` allows any crop of up to ``group``
    tokens, at ``crop_window`` fp16 tokens of memory per row and layer (counted in ``nbytes``); that
    ring is allocated whole at the first forward, so a window whose ring for one batch row exceeds this
    machine's memory is refused here (ValueError naming the largest that fits).

    device: None (default) keeps the packed cache in host memory and runs attention on the CPU whatever the
    model's device; ``"cuda"``, ``"cuda:N"`` (a torch.device or an index) keeps it on that GPU, one
    ``kvarn.cuda.PagedKVCache`` per layer, and runs kvarn's CUDA kernels there (the model must run on that GPU;
    quantize_on "fill" only; a crop window's ring lives on that GPU too). Its pools are allocated at the first
    forward for ``max_batch_size`` rows (default: that forward's batch) of ``max_cache_len`` tokens each (default:
    the model's max_position_embeddings, at most 32768); a step beyond either is refused with the cache unchanged.
    On the host, ``max_cache_len`` (default None: none) is room each row's cache reserves at the first forward
    (``kvarn.KVCache.reserve``), so that decoding up to that length never grows its records buffer; longer rows
    grow as usual.
    """

    def __init__(self, config, preset: PresetLike = kvarn.DEFAULT_PRESET, sink_tokens: int | None = None,
                 quantize_on: str = "fill", crop_window: int = 0, *, device=None, max_batch_size: int | None = None,
                 max_cache_len: int | None = None) -> None:
        outer = config
        if not hasattr(config, "num_hidden_layers") and hasattr(config, "get_text_config"):
            config = config.get_text_config()  # a multimodal model's: its language model's attention is cached
        if not hasattr(config, "num_hidden_layers"):
            raise TypeError(f"config: expected a transformers model config, got {type(outer).__name__}")
        if getattr(outer, "is_encoder_decoder", False):
            raise NotImplementedError(
                f"config: {type(outer).__name__} is an encoder-decoder model; KVarNCache caches a decoder-only "
                "model's self-attention (no cross-attention cache): use the model's own cache")
        text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
        cross = getattr(text_config, "cross_attention_layers", None)
        if cross:
            raise NotImplementedError(
                f"config: {type(text_config).__name__} has cross-attention layers ({list(cross)}); KVarNCache caches "
                "self-attention only: use the model's own cache")
        _check_model_support(outer, text_config)
        n_layers = getattr(text_config, "num_hidden_layers", None)
        layer_types = getattr(text_config, "layer_types", None)
        if not layer_types and isinstance(n_layers, int):  # as transformers infers them: a window or chunk applies
            layer_types = [("sliding_attention" if _layer_value(text_config, "sliding_window", i) is not None
                            else "chunked_attention" if _layer_value(text_config, "attention_chunk_size", i) is not None
                            else "full_attention") for i in range(n_layers)]
        layer_types = list(layer_types or [])
        # The layers kvarn stores (types that do not fit the layer count are refused below).
        full = [i for i, t in enumerate(layer_types) if t == "full_attention" and (not isinstance(n_layers, int)
                                                                                   or i < n_layers)]
        head_dims = {i: _layer_head_dim(text_config, i) for i in full}
        for head_dim in dict.fromkeys(head_dims.values()):
            if isinstance(head_dim, int):
                try:
                    kvarn_check_head_dim(head_dim)
                except ValueError as e:
                    raise ValueError(f"config: {e}") from None
        softcap = next((v for v in _config_values(text_config, "attn_logit_softcapping") if v), None)
        if softcap:
            raise NotImplementedError(
                f"config: attention logit soft-capping (attn_logit_softcapping={softcap}) is not supported by kvarn attention"
            )
        if not layer_types:
            raise ValueError(f"config: no attention layers (num_hidden_layers={n_layers}); nothing to cache")
        if isinstance(n_layers, int) and len(layer_types) != n_layers:
            raise ValueError(f"config: {len(layer_types)} layer_types for num_hidden_layers={n_layers}")
        gpu = _gpu_options(device, max_batch_size, max_cache_len, text_config, preset, quantize_on, head_dims)
        layers = []
        for i, t in enumerate(layer_types):
            if t == "full_attention":
                layers.append(KVarNLayer(preset, sink_tokens, quantize_on, crop_window, max_cache_len) if gpu is None
                              else KVarNCudaLayer(preset, sink_tokens, crop_window, **gpu))
            elif t in ("sliding_attention", "chunked_attention"):
                window = _layer_value(text_config, "sliding_window" if t == "sliding_attention" else "attention_chunk_size", i)
                layers.append(DynamicSlidingWindowLayer(sliding_window=window))
            else:
                raise NotImplementedError(f"config: layer type {t!r} is not supported by KVarNCache")
        if not any(isinstance(layer, KVarNLayer) for layer in layers):
            raise NotImplementedError(
                f"config: every attention layer is {layer_types[0]!r} (sliding_window="
                f"{_layer_value(text_config, 'sliding_window', 0)}, attention_chunk_size="
                f"{_layer_value(text_config, 'attention_chunk_size', 0)}); kvarn attention has no window, so a "
                "KVarNCache would compress nothing: use the model's own cache"
            )
        kvarn_layers = [layer for layer in layers if isinstance(layer, KVarNLayer)]
        if gpu is None:  # host memory (a GPU cache's ring goes on its GPU, whose allocator refuses what it lacks)
            _check_crop_ring(kvarn_layers[0].crop_window, kvarn_layers[0].preset.group,
                             [(_layer_value(text_config, "num_key_value_heads", i), head_dims.get(i)) for i in full])
        super().__init__(layers=layers)
        self._failure = [None]
        self._journal = _StepJournal(len(layers), gpu_flags=[None] if gpu is not None else None)
        # Per layer index: the index of the last KVarN layer before it (None: none), whose step the
        # attention must have taken by the time this layer's update comes.
        self._previous_kvarn: list[int | None] = []
        last = None
        for i, layer in enumerate(layers):
            self._previous_kvarn.append(last)
            if isinstance(layer, KVarNLayer):
                layer._failure = self._failure
                layer._journal = self._journal
                if isinstance(layer, KVarNCudaLayer):
                    layer._flags = self._journal.gpu_flags
                last = i
        # The Preset itself: a custom one's name alone could not be resolved again.
        self.preset = kvarn.KVCache(1, 64, preset, sink_tokens, quantize_on=quantize_on).preset
        self.quantize_on = quantize_on
        self.config = config
        use_kvarn_attention(config)

    def __deepcopy__(self, memo):
        """A copy whose layers hold copies of the stored tokens (each row's kvarn.KVCache copies itself)
        but which shares the model's config: the attention implementation it checks is the model's, not
        a private copy's that would still say "kvarn" after ``restore_attention``. (Where the same deepcopy
        copies the config too, e.g. ``copy.deepcopy((model, cache))`` with the model first, the copy uses
        that copy.)"""
        import copy

        new = object.__new__(type(self))
        memo[id(self)] = new
        for name, value in self.__dict__.copy().items():  # a snapshot, as KVCache.copy reads one
            if name != "config":
                setattr(new, name, copy.deepcopy(value, memo))
        new.config = memo.get(id(self.config), self.config)
        return new

    def _check_consistent(self) -> None:
        """Refuses a cache whose layers hold different numbers of tokens: a forward that failed (or was
        interrupted) part-way stored its tokens in the layers before the failure only. A layer that
        rejects a step restores itself, so a failure in the first layer leaves nothing to refuse. Also
        refuses a layer still holding a step its attention never took (interrupted in between)."""
        lengths = [layer.get_seq_length() for layer in self.layers]
        why = f" (the last rejected step: {self._failure[0]})" if self._failure[0] else ""
        fix = "call reset() on the cache (or start a new one) before using it again"
        if self._journal.late_refusal:
            raise RuntimeError(
                "KVarNCache: a forward was refused after this cache's last layer had stored the step, which cannot "
                f"be undone: {self._journal.late_refusal}; {fix}")
        if min(lengths) != max(lengths):
            raise RuntimeError(
                f"KVarNCache: its layers hold {min(lengths)} to {max(lengths)} tokens: an earlier forward failed or "
                f"was interrupted part-way, or ran a model with fewer layers than this cache's config{why}; {fix}"
            )
        untaken = [i for i, layer in enumerate(self.layers)
                   if isinstance(layer, KVarNLayer) and (layer._pending is not None or layer._prefill is not None)]
        if untaken:
            raise RuntimeError(
                f"KVarNCache: layer {untaken[0]} holds a step whose attention never ran (not stored): an earlier "
                f"forward failed or was interrupted part-way, or its attention was not {ATTN_IMPLEMENTATION!r}{why}; "
                f"{fix}"
            )

    def _check_previous_step_taken(self, layer_idx: int) -> None:
        """Before layer layer_idx's update: the last KVarN layer before it must have had its step taken by
        kvarn attention. If not, this forward's attention does not run through "kvarn" (a model whose config
        is not this cache's, e.g. another instance of the checkpoint): that layer attended a decode step over
        its own token only. Its untaken step is dropped (the layer is as before the step) and this raises."""
        i = self._previous_kvarn[layer_idx]  # update checked the index
        if i is None:
            return
        layer = self.layers[i]
        if layer._pending is None and layer._prefill is None:
            return
        if layer._prefill is not None:
            layer._empty()  # empty again, as before the prompt
        layer._pending = None
        if getattr(self.config, "_attn_implementation", None) != ATTN_IMPLEMENTATION:
            why = (f"this cache's config no longer uses it (now "
                   f"{getattr(self.config, '_attn_implementation', None)!r}: restore_attention or "
                   "set_attn_implementation switched it); switch it back with "
                   "kvarn.integrations.transformers.use_kvarn_attention(model)")
        else:
            why = ("the model running this forward is not the one this cache was built on (its config is another; "
                   "build the cache on this model's config, KVarNCache(model.config)), or its attention does not "
                   "receive the K/V this cache returned (a model that reshapes, repeats or re-projects them after "
                   "the cache update: not supported)")
        error = RuntimeError(f"KVarNCache: layer {i}'s attention did not run through kvarn: {why}")
        layer._fail(error)
        raise error

    @torch.compiler.disable  # see kvarn_attention
    def update(self, key_states, value_states, layer_idx: int, *args, **kwargs):
        # An index as transformers' layers pass it: -1 or True would address another layer and skip the
        # new-forward checks below.
        layer_idx = check_positive_int(layer_idx, "layer_idx", 0)
        if layer_idx >= len(self.layers):
            # Its layers 0..L-1 have taken the step already (the journal was released at the last one's
            # attention): the cache keeps it and refuses every later forward until reset().
            why = (f"layer_idx {layer_idx}: the model running this forward has more layers than this cache's config "
                   f"({len(self.layers)}); build the cache on this model's config, KVarNCache(model.config)")
            self._journal.rollback(why)
            raise ValueError(f"KVarNCache: {why}")
        if layer_idx == 0:  # a new forward, before any layer (a sliding one too) stores its tokens
            self._check_consistent()
            self._journal.start()  # the previous forward's step stays
            flags = self._journal.gpu_flags
            if flags and flags[0] is not None:  # bits a forward stopped part-way may have left
                flags[0].zero_()
        if self.config._attn_implementation != ATTN_IMPLEMENTATION:
            self._journal.rollback()
            raise RuntimeError(
                f"KVarNCache: the model's attn_implementation is {self.config._attn_implementation!r}, "
                f"expected {ATTN_IMPLEMENTATION!r}; do not change it while this cache is in use (switch it back "
                "with kvarn.integrations.transformers.use_kvarn_attention(model))"
            )
        self._check_previous_step_taken(layer_idx)
        layer = self.layers[layer_idx]
        if isinstance(layer, KVarNLayer):
            return super().update(key_states, value_states, layer_idx, *args, **kwargs)
        self._journal.add(functools.partial(_restore_attributes, layer, dict(layer.__dict__)))  # they replace
        keys, values = super().update(key_states, value_states, layer_idx, *args, **kwargs)  # their tensors
        setattr(keys, _JOURNAL_TAG, self._journal)  # a refusal at this layer's attention undoes the forward
        return keys, values

    def _change_every_layer(self, plan, apply, other) -> None:
        """Checks the cache and every KVarN layer's part (plan(layer) raises, changing nothing), then changes
        the other layers (other(layer); restored if one raises) and last the KVarN layers (apply(layer, p))."""
        self._check_consistent()
        plans = [(layer, plan(layer)) for layer in self.kvarn_layers]
        others = [layer for layer in self.layers if not isinstance(layer, KVarNLayer)]
        saved = [dict(layer.__dict__) for layer in others]  # transformers' layers replace their tensors
        try:
            for layer in others:
                other(layer)
        except BaseException:
            for layer, state in zip(others, saved):
                _restore_attributes(layer, state)
            raise
        for layer, p in plans:
            apply(layer, p)
        self._journal.clear()  # its undo entries no longer fit the rows and lengths

    def crop(self, tokens_to_remove: int) -> None:
        self._change_every_layer(lambda layer: layer._crop_plan(tokens_to_remove),
                                 lambda layer, plan: layer._apply_crop(plan),  # a GPU layer's own
                                 lambda layer: layer.crop(tokens_to_remove))

    def reorder_cache(self, beam_idx) -> None:
        self._change_every_layer(lambda layer: layer._rows_plan(beam_idx, "beam_idx"), KVarNLayer._apply_rows,
                                 lambda layer: layer.reorder_cache(beam_idx))

    def batch_repeat_interleave(self, repeats: int) -> None:
        self._change_every_layer(lambda layer: layer._repeat_plan(repeats), KVarNLayer._apply_rows,
                                 lambda layer: layer.batch_repeat_interleave(repeats))

    def batch_select_indices(self, indices) -> None:
        self._change_every_layer(lambda layer: layer._rows_plan(indices, "indices"), KVarNLayer._apply_rows,
                                 lambda layer: layer.batch_select_indices(indices))

    @property
    def kvarn_layers(self) -> list[KVarNLayer]:
        return [layer for layer in self.layers if isinstance(layer, KVarNLayer)]

    @property
    def nbytes(self) -> int:
        """Bytes of the KVarN-compressed layers (packed tiles plus fp16 sink and tail)."""
        return sum(layer.nbytes for layer in self.kvarn_layers)

    @property
    def compression_ratio(self) -> float:
        """fp16 bytes of the same tokens / nbytes, over the KVarN layers."""
        fp16 = sum(len(c) * 4 * c.num_kv_heads * c.head_dim for layer in self.kvarn_layers for c in layer.caches)
        return fp16 / self.nbytes if self.nbytes else 1.0
