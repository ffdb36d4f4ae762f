"""KVarNCache(config, device="cuda"): the transformers Cache whose layers keep their cache on a GPU, one
kvarn.cuda.PagedKVCache per layer (KVarNCudaLayer).

Two kinds of tests, on a tiny random Llama (head_dim 64; the k4v2_g64 preset with a 64-token sink, so that tiles
complete within a few dozen steps):
- Stand-in tests (no GPU; they run in CI): kvarn.cuda.PagedKVCache is replaced by HostPaged, which holds each
  sequence in a kvarn.KVCache and attends it with kvarn.append_attend_batch, the host cache's own call. The GPU
  layer's code (prefill without left padding, one step per forward, the step undone when a later layer refuses,
  beam search's forks and frees, crops, copies) must then give exactly the host cache's scores and tokens.
- GPU tests (skipped, with the reason printed, where there is no CUDA build or GPU): the real kernels on a model on
  the GPU, against the host cache on the same model (scores within the kernels' tolerance, the same tokens).
"""
from __future__ import annotations

import copy
import importlib.util
import types

import numpy as np
import pytest

_MISSING = [m for m in ("torch", "transformers") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"needs torch and transformers (missing: {', '.join(_MISSING)}): pip install -e '.[eval]'",
                allow_module_level=True)

import torch  # noqa: E402

import kvarn  # noqa: E402
import kvarn.cuda as kc  # noqa: E402
from kvarn.integrations.transformers import KVarNCache, KVarNCudaLayer, cache_kwargs  # noqa: E402

PRESET, SINK = "k4v2_g64", 64


def tiny_model(layers=3, device="cpu", seed=0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=64, vocab_size=300, max_position_embeddings=4096,
                      pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(cfg).eval().to(device)
    # a random model's logits are nearly flat: larger weights make its greedy choices clear
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    return model


def prompts(lengths, seed=1, device="cpu"):
    """Left-padded ids and mask of random prompts of these lengths (ids 3..299)."""
    g = torch.Generator().manual_seed(seed)
    n = max(lengths)
    ids = torch.zeros(len(lengths), n, dtype=torch.long)
    mask = torch.zeros(len(lengths), n, dtype=torch.long)
    for b, m in enumerate(lengths):
        ids[b, n - m:] = torch.randint(3, 300, (m,), generator=g)
        mask[b, n - m:] = 1
    return ids.to(device), mask.to(device)


def generate(model, cache, ids, mask, n_new, **kw):
    with torch.no_grad():
        out = model.generate(ids, attention_mask=mask, max_new_tokens=n_new, min_new_tokens=n_new,
                             do_sample=False, **cache_kwargs(model, cache), pad_token_id=0, output_scores=True,
                             return_dict_in_generate=True, **kw)
    return out.sequences, torch.stack(out.scores)


# ---- the stand-in ---------------------------------------------------------------------------------
class HostPaged:
    """The PagedKVCache methods KVarNCudaLayer calls, over one kvarn.KVCache per sequence (CPU tensors), with the
    GPU cache's refusals for slots and length."""

    def __init__(self, num_kv_heads, head_dim, preset, *, num_layers, max_seqs, max_seq_len, sink_tokens, device):
        assert num_layers == 1 and device == 0
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        self.max_seqs, self.max_seq_len = max_seqs, max_seq_len
        self.preset, self.sink_tokens, self.device = kvarn.KVCache(1, 64, preset).preset, sink_tokens, device
        self.seqs: dict[int, kvarn.KVCache] = {}
        self.calls = []

    def add_sequence(self):
        free = sorted(set(range(self.max_seqs)) - set(self.seqs))
        if not free:
            raise RuntimeError("all slots in use")
        self.seqs[free[0]] = kvarn.KVCache(self.num_kv_heads, self.head_dim, self.preset, self.sink_tokens)
        return free[0]

    def free(self, s):
        del self.seqs[s]

    def fork(self, s):
        new = self.add_sequence()
        self.seqs[new] = self.seqs[s].copy()
        return new

    def length(self, s):
        return len(self.seqs[s])

    def truncation_point(self, s, n):
        return self.seqs[s].truncation_point(n)

    def truncate(self, s, n):
        self.seqs[s].truncate(n)

    def _room(self, seq_ids, n):
        for s in seq_ids:
            if len(self.seqs[s]) + n > self.max_seq_len:
                raise ValueError(f"k: sequence {s} would hold {len(self.seqs[s]) + n} tokens; "
                                 f"max_seq_len={self.max_seq_len}")

    def append(self, seq_ids, k, v):  # k, v [B, T, Hk, D]
        self._room(seq_ids, k.shape[1])
        for b, s in enumerate(seq_ids):
            self.seqs[s].append(k[b].transpose(0, 1).numpy(), v[b].transpose(0, 1).numpy())

    # q [B, n, Hq, D]; k, v [B, n, Hk, D]
    def append_attend(self, q, seq_ids, k, v, *, scale, validate=True, flags=None):
        self._room(seq_ids, k.shape[1])
        self.calls.append("validate" if validate else "flags" if flags is not None else "unchecked")
        if flags is not None:  # the GPU's deferred checks: bits, and the step lands (here: nothing a KVCache refuses)
            bits = sum(bit for x, bit in ((q, 1 << 8), (k, FLAGS.FLAG_K_NONFINITE), (v, FLAGS.FLAG_V_NONFINITE))
                       if not torch.isfinite(x).all())
            if bits:
                flags.bitwise_or_(bits)
                return torch.zeros(q.shape, dtype=q.dtype)
        out = kvarn.append_attend_batch(q.float().numpy(), [self.seqs[s] for s in seq_ids],
                                        k.transpose(1, 2).numpy(), v.transpose(1, 2).numpy(), scale=scale)
        return torch.from_numpy(out).to(q.dtype)

    def checkpoint(self, seq_ids, n):
        return {s: self.seqs[s].checkpoint() for s in seq_ids}

    def rollback(self, point):
        for s, c in point.items():
            self.seqs[s].rollback(c)

    def to_cpu(self, s):
        return self.seqs[s].copy()

    def load_cpu(self, s, cache):
        self.seqs[s] = cache.copy()


# the CUDA module's flag bits (native/cuda: KVARN_FLAG_*), for kvarn.cuda.flags_error
FLAGS = types.SimpleNamespace(FLAG_K_NONFINITE=1, FLAG_V_NONFINITE=2, FLAG_K_RANGE=4, FLAG_V_RANGE=8,
                              FLAG_K_SCALE_OVERFLOW=16, FLAG_KEY_NORM=32, FLAG_V_SCALE_OVERFLOW=64)


@pytest.fixture
def stand_in(monkeypatch):
    """The GPU layers on HostPaged: a "GPU" that serves every head_dim, CPU tensors counting as cuda:0's."""
    monkeypatch.setattr(kc, "PagedKVCache", HostPaged)
    monkeypatch.setattr(kc, "unavailable_reason", lambda device=None: None)
    monkeypatch.setattr(kc, "_cuda", types.SimpleNamespace(format_supported=lambda *a: True, get_device=lambda: (0, 0),
                                                           **vars(FLAGS)))

    def on_cpu(self, x, name):
        if not x.is_cpu:
            raise ValueError(f"{name}: stand-in tensors are on the CPU")

    monkeypatch.setattr(KVarNCudaLayer, "_check_device", on_cpu)


def rows_content(cache):
    """Per KVarN layer: each row's (length, sink, records, tail) from its stand-in KVCache."""
    out = []
    for layer in cache.kvarn_layers:
        out.append([(len(r), {k: np.array(x) for k, x in r.paged.seqs[r.seq].to_parts().items()
                              if isinstance(x, np.ndarray)}) for r in layer.caches])
    return out


def same_content(a, b):
    assert len(a) == len(b)
    for la, lb in zip(a, b):
        assert [n for n, _ in la] == [n for n, _ in lb]
        for (_, pa), (_, pb) in zip(la, lb):
            assert pa.keys() == pb.keys()
            for key in pa:
                np.testing.assert_array_equal(pa[key], pb[key], err_msg=key)


def test_stand_in_generates_what_the_host_cache_generates(stand_in):
    """Greedy decoding of a left-padded batch (rows of 100 and 83 tokens, 70 new: each row completes a tile while
    decoding): the GPU layers' scores equal the host cache's bit for bit, and so do the tokens."""
    model = tiny_model()
    ids, mask = prompts([100, 83])
    host = generate(model, KVarNCache(model.config, PRESET, SINK), ids, mask, 70)
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda")
    gpu = generate(model, cache, ids, mask, 70)
    assert all(isinstance(layer, KVarNCudaLayer) for layer in cache.kvarn_layers)
    torch.testing.assert_close(gpu[1], host[1], rtol=0, atol=0)
    assert torch.equal(gpu[0], host[0])
    rows = cache.kvarn_layers[0].caches
    assert [len(r) for r in rows] == [100 + 69, 83 + 69]  # no padding stored; the last token is never fed back
    assert cache.get_seq_length() == 100 + 69
    assert cache.kvarn_layers[0].paged.max_seqs == 2 and cache.kvarn_layers[0].paged.max_seq_len == 4096


def test_stand_in_beam_search_and_sampled_sequences(stand_in):
    """Beam search (rows reordered every step: freed, kept and forked) and several sequences per prompt give the
    host cache's results exactly."""
    model = tiny_model()
    ids, mask = prompts([90, 75], seed=3)
    for kw in (dict(num_beams=3, num_return_sequences=2), dict(num_beams=2, length_penalty=0.0)):
        host = generate(model, KVarNCache(model.config, PRESET, SINK), ids, mask, 50, **kw)
        gpu = generate(model, KVarNCache(model.config, PRESET, SINK, device="cuda"), ids, mask, 50, **kw)
        assert torch.equal(gpu[0], host[0]), kw
        torch.testing.assert_close(gpu[1], host[1], rtol=0, atol=0)


def test_stand_in_reorder_forks_and_frees(stand_in):
    """Row changes keep each row's sequence on its first use, fork it on later ones, and free the rows left out
    (before forking: the pool has only max_batch_size slots)."""
    model = tiny_model(layers=1)
    ids, mask = prompts([70, 70, 70], seed=4)
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda")
    generate(model, cache, ids, mask, 2)
    layer = cache.kvarn_layers[0]
    seqs = [r.seq for r in layer.caches]
    before = rows_content(cache)[0]
    cache.reorder_cache(torch.tensor([2, 2, 0]))
    assert [r.seq for r in layer.caches][:2] == [seqs[2], 1] and layer.caches[2].seq == seqs[0]
    assert set(layer.paged.seqs) == {0, 1, 2}
    after = rows_content(cache)[0]
    same_content([[before[2], before[2], before[0]]], [after])
    with pytest.raises(ValueError, match="beam_idx: a batch of 4 rows is more than the 3"):
        cache.reorder_cache(torch.tensor([0, 1, 2, 2]))
    with pytest.raises(ValueError, match="repeats: a batch of 6 rows is more than the 3"):
        cache.batch_repeat_interleave(2)
    same_content([after], rows_content(cache))  # refused: unchanged


def test_stand_in_refused_step_is_undone_in_every_layer(stand_in):
    """A decode step whose second layer's keys hold NaN is refused after the forward's last layer (the checks run on
    the GPU, read once per forward); every layer, each of which had stored the step (completing a tile with it), is
    rolled back exactly, and decoding then goes on as if the refused step had never come."""
    model = tiny_model()
    ids, mask = prompts([127], seed=5)  # the step's token is the 128th: it completes the first tile after the sink
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda")
    reference = KVarNCache(model.config, PRESET, SINK, device="cuda")
    with torch.no_grad():
        model(ids, attention_mask=mask, **cache_kwargs(model, cache))
        model(ids, attention_mask=mask, **cache_kwargs(model, reference))
    before = rows_content(cache)
    poison = model.model.layers[1].self_attn.k_proj.register_forward_hook(lambda m, i, o: o * float("nan"))
    step = torch.tensor([[7]])
    full_mask = torch.ones(1, 128, dtype=torch.long)
    try:
        with torch.no_grad(), pytest.raises(ValueError, match="this step's k: contains NaN or Inf .found by the GPU "
                                                               "layers' checks after the forward's last layer"):
            model(step, attention_mask=full_mask, **cache_kwargs(model, cache))
    finally:
        poison.remove()
    # each decode step was checked on the "GPU" (deferred), none by a wait per layer
    assert {c for layer in cache.kvarn_layers for c in layer.paged.calls} == {"flags"}
    assert int(cache._journal.gpu_flags[0]) == 0  # zeroed for the next forward
    same_content(before, rows_content(cache))
    assert cache.get_seq_length() == 127
    with torch.no_grad():
        a = model(step, attention_mask=full_mask, **cache_kwargs(model, cache)).logits
        b = model(step, attention_mask=full_mask, **cache_kwargs(model, reference)).logits
    assert torch.equal(a, b)
    same_content(rows_content(reference), rows_content(cache))
    assert len(cache.kvarn_layers[0].caches[0]) == 128


def test_stand_in_crop_and_copy(stand_in):
    """crop inside the fp16 tail truncates each row; into a quantised tile it is refused without a crop window,
    with every layer unchanged; a deepcopy holds the same tokens in pools of its own and goes on alike."""
    model = tiny_model(layers=2)
    ids, mask = prompts([140, 135], seed=6)
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda")
    with torch.no_grad():
        model(ids, attention_mask=mask, **cache_kwargs(model, cache))
    twin = copy.deepcopy(cache)
    assert twin.kvarn_layers[0].paged is not cache.kvarn_layers[0].paged
    same_content(rows_content(cache), rows_content(twin))
    cache.crop(-5)
    assert [len(r) for r in cache.kvarn_layers[1].caches] == [135, 130]
    kept = rows_content(cache)
    with pytest.raises(NotImplementedError, match=r"cuts a quantised tile of batch row 0, and its tokens are not in "
                       r"the crop window \(0 tokens\)"):
        cache.crop(-10)  # row 0 would cut its tile of tokens 64..127
    same_content(kept, rows_content(cache))
    step, m = torch.tensor([[9], [11]]), torch.cat([mask, torch.ones(2, 1, dtype=torch.long)], 1)
    with torch.no_grad():
        a = model(step, attention_mask=m, **cache_kwargs(model, twin)).logits
    twin2 = copy.deepcopy(twin)
    with torch.no_grad():
        m2 = torch.cat([m, torch.ones(2, 1, dtype=torch.long)], 1)
        b = model(step, attention_mask=m2, **cache_kwargs(model, twin2)).logits
        c = model(step, attention_mask=m2, **cache_kwargs(model, twin)).logits
    assert torch.equal(b, c) and not torch.equal(a, b)
    assert twin.get_seq_length() == 142 and cache.get_seq_length() == 135


def test_stand_in_crop_window_serves_assisted_decoding(stand_in):
    """With crop_window, the GPU layers keep each row's last tokens in a ring (on the GPU; here the stand-in's CPU
    tensors): prompt-lookup decoding (drafts verified in multi-token steps, rejected tokens cropped, often inside a
    tile quantised by the step) gives the host cache's tokens and scores exactly, and so do crops into a quantised
    tile, beam search's row changes and a refused step with the ring rolled back."""
    model = tiny_model()
    ids = torch.randint(3, 40, (1, 150), generator=torch.Generator().manual_seed(8))  # repetitive: drafts get found
    mask = torch.ones_like(ids)
    kw = dict(prompt_lookup_num_tokens=6)
    host_cache = KVarNCache(model.config, PRESET, SINK, crop_window=128)
    gpu_cache = KVarNCache(model.config, PRESET, SINK, crop_window=128, device="cuda", max_batch_size=2)
    host = generate(model, host_cache, ids, mask, 60, **kw)
    gpu = generate(model, gpu_cache, ids, mask, 60, **kw)
    assert torch.equal(gpu[0], host[0])
    torch.testing.assert_close(gpu[1], host[1], rtol=0, atol=0)
    assert gpu_cache.kvarn_layers[0].is_croppable
    # a crop into the tile of tokens 128..191: the ring gives its kept tokens back
    n = gpu_cache.get_seq_length()
    assert n > 192 + 10
    for cache in (host_cache, gpu_cache):
        cache.crop(-(n - 150))
    same_content(rows_content(gpu_cache), [[(len(c), {k: np.array(x) for k, x in c.to_parts().items()
                                                       if isinstance(x, np.ndarray)}) for c in layer.caches]
                                           for layer in host_cache.kvarn_layers])
    step = torch.tensor([[17]])
    with torch.no_grad():
        a = model(step, **cache_kwargs(model, host_cache)).logits
        b = model(step, **cache_kwargs(model, gpu_cache)).logits
    assert torch.equal(a, b)
    for cache in (host_cache, gpu_cache):  # keep 100: tile 64..127 is cut, and the ring starts after its start
        with pytest.raises(NotImplementedError, match="not in the crop window .128 tokens."):
            cache.crop(-51)
    # rows repeated (their rings too), then a refused step: rings and caches back as they were
    gpu_cache.batch_repeat_interleave(2)
    layer = gpu_cache.kvarn_layers[0]
    assert torch.equal(layer._ring_k[0], layer._ring_k[1]) and layer._ring_k.shape[0] == 2
    ring = layer._ring_k.clone(), list(layer._ring_from)
    before = rows_content(gpu_cache)
    poison = model.model.layers[1].self_attn.v_proj.register_forward_hook(lambda m, i, o: o * float("inf"))
    try:
        with torch.no_grad(), pytest.raises(ValueError, match="this step's v: contains NaN or Inf"):
            model(torch.tensor([[5, 6, 7], [8, 9, 10]]), **cache_kwargs(model, gpu_cache))
    finally:
        poison.remove()
    same_content(before, rows_content(gpu_cache))
    assert torch.equal(layer._ring_k, ring[0]) and layer._ring_from == ring[1]


def test_stand_in_sizes_are_enforced(stand_in):
    """max_batch_size and max_cache_len bound the pools: a prompt batch or a step beyond them is refused, the step
    leaving every layer as it was; reset() keeps the pools for a prompt that fits."""
    model = tiny_model(layers=2)
    ids, mask = prompts([60, 60, 60], seed=7)
    with torch.no_grad(), pytest.raises(ValueError, match="key_states: batch 3 is more than max_batch_size=2"):
        small = KVarNCache(model.config, PRESET, SINK, device="cuda", max_batch_size=2)
        model(ids, attention_mask=mask, **cache_kwargs(model, small))
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda", max_cache_len=61)
    with torch.no_grad():
        model(ids, attention_mask=mask, **cache_kwargs(model, cache))
        step = torch.tensor([[5], [5], [5]])
        model(step, attention_mask=torch.ones(3, 61, dtype=torch.long), **cache_kwargs(model, cache))
        before = rows_content(cache)
        with pytest.raises(ValueError, match="max_seq_len=61"):
            model(step, attention_mask=torch.ones(3, 62, dtype=torch.long), **cache_kwargs(model, cache))
    same_content(before, rows_content(cache))
    pool = cache.kvarn_layers[0].paged
    cache.reset()
    assert pool.seqs == {}
    with torch.no_grad():
        model(ids[:2], attention_mask=mask[:2], **cache_kwargs(model, cache))
    assert cache.kvarn_layers[0].paged is pool and len(pool.seqs) == 2


def test_device_options_are_checked(stand_in):
    """Each device option's bad value is named; options the GPU cache does not serve are refused when the cache
    is built, not at the first forward."""
    cfg = tiny_model(layers=1).config
    for bad, error, match in (
            ("cpu", ValueError, "device: 'cpu'; expected a CUDA device"),
            ("gpu:0", ValueError, "device: 'gpu:0' is not a device"),
            (1.5, TypeError, "device: expected 'cuda', 'cuda:N', a torch.device, an int or None, got float"),
            (True, TypeError, "got bool")):
        with pytest.raises(error, match=match):
            KVarNCache(cfg, device=bad)
    with pytest.raises(ValueError, match="quantize_on: 'next' is not served by the GPU cache"):
        KVarNCache(cfg, quantize_on="next", device="cuda")
    with pytest.raises(ValueError, match="crop_window: 64 tokens cannot hold a quantised tile of 128"):
        KVarNCache(cfg, crop_window=64, device="cuda")
    with pytest.raises(ValueError, match="max_cache_len"):
        KVarNCache(cfg, device="cuda", max_cache_len=0)
    with pytest.raises(ValueError, match="max_batch_size: sizes the pools of a GPU cache"):
        KVarNCache(cfg, max_batch_size=4)
    assert KVarNCache(cfg, device=torch.device("cuda", 0)).kvarn_layers[0].max_cache_len == 4096


def test_device_options_without_a_gpu():
    """Where kvarn's CUDA path cannot run (CI: no GPU), device="cuda" is refused with the reason, before the
    config is switched to kvarn attention; a head_dim the kernels do not serve is named."""
    from transformers import LlamaConfig

    reason = kc.unavailable_reason()
    cfg = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=16, vocab_size=100)
    if reason is not None:
        before = getattr(cfg, "_attn_implementation", None)
        with pytest.raises(RuntimeError, match="device: 'cuda': " + reason[:30].replace("(", r"\(")):
            KVarNCache(cfg, device="cuda")
        assert getattr(cfg, "_attn_implementation", None) == before
    else:
        with pytest.raises(ValueError, match="config: layer 0's head_dim 16 with preset .* is not served by kvarn's"):
            KVarNCache(cfg, device="cuda")


# ---- GPU -------------------------------------------------------------------------------------------
gpu = pytest.mark.skipif(kc.unavailable_reason() is not None or not torch.cuda.is_available(),
                         reason=f"no GPU for kvarn's CUDA path: {kc.unavailable_reason()}")


@gpu
def test_gpu_generates_what_the_host_cache_generates():
    """On the GPU (float32): greedy decoding of a left-padded batch with the cache on the GPU gives the host cache's
    150 tokens (the same model on the GPU, its cache on the host), with scores within the kernels' tolerance, and
    nbytes counts what each row holds."""
    model = tiny_model(device="cuda")
    ids, mask = prompts([300, 211], device="cuda")
    host = generate(model, KVarNCache(model.config, PRESET, SINK), ids, mask, 150)
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda")
    gpu_out = generate(model, cache, ids, mask, 150)
    assert cache.kvarn_layers[0].caches[0].paged.__class__ is kc.PagedKVCache
    assert torch.equal(gpu_out[0], host[0])
    finite = host[1].isfinite()  # generate sets some scores to -inf (min_new_tokens: the eos token)
    assert torch.equal(finite, gpu_out[1].isfinite())
    error = (gpu_out[1] - host[1])[finite].abs().amax() / host[1][finite].abs().amax()
    print(f"float32: scores within {float(error):.2e} of the largest")
    assert error <= 2e-3
    # nbytes: the bytes of what each row holds, as its host copy's parts (records, fp16 sink and tail)
    parts = [layer.paged.to_cpu(row.seq).to_parts() for layer in cache.kvarn_layers for row in layer.caches]
    assert cache.nbytes == sum(x.nbytes for p in parts for x in p.values() if isinstance(x, np.ndarray))


@gpu
def test_gpu_bfloat16_model_follows_the_host_cache():
    """On the GPU, a bfloat16 model: fed the same 150 tokens after a left-padded prompt batch (teacher-forced: a
    bfloat16 model's near-ties flip greedy tokens, after which free-running outputs part ways), the GPU cache's
    logits stay within bfloat16's rounding of the host cache's and pick the same argmax at nearly every step."""
    model = tiny_model(device="cuda").to(torch.bfloat16)
    ids, mask = prompts([300, 211], device="cuda")
    fed = torch.randint(3, 300, (2, 150), generator=torch.Generator().manual_seed(9)).cuda()
    logits = []
    for cache in (KVarNCache(model.config, PRESET, SINK), KVarNCache(model.config, PRESET, SINK, device="cuda")):
        steps, m = [], mask
        with torch.no_grad():
            model(ids, attention_mask=m, **cache_kwargs(model, cache))
            for i in range(fed.shape[1]):
                m = torch.cat([m, torch.ones_like(m[:, :1])], 1)
                out = model(fed[:, i : i + 1], attention_mask=m, **cache_kwargs(model, cache))
                steps.append(out.logits[:, -1].float())
        logits.append(torch.stack(steps))
        assert [len(r) for r in cache.kvarn_layers[0].caches] == [450, 361]  # the cache took every token
    host, gpu_logits = logits
    error = (gpu_logits - host).norm(dim=-1) / host.norm(dim=-1)
    agree = (gpu_logits.argmax(-1) == host.argmax(-1)).float().mean()
    print(f"bfloat16: logits relative L2 median {float(error.median()):.2e}, max {float(error.max()):.2e}; "
          f"argmax agrees at {100 * float(agree):.1f} % of 300")
    assert error.median() <= 2e-2 and error.max() <= 1e-1 and agree >= 0.95


@gpu
def test_gpu_headline_shape_follows_the_host_cache():
    """On the GPU, the shape of Llama-3-8B's attention (Hq 32, Hk 8, head_dim 128) with the default preset
    (k4v2_g128, a 128-token sink): teacher-forced over 100 steps after a 400-token prompt, the GPU cache's logits
    are the host cache's within the kernels' tolerance, with the same argmax at every step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=512, intermediate_size=512, num_hidden_layers=2, num_attention_heads=32,
                      num_key_value_heads=8, head_dim=128, vocab_size=300, max_position_embeddings=4096)
    model = LlamaForCausalLM(cfg).eval().cuda()
    with torch.no_grad():
        model.lm_head.weight.mul_(8)
    ids = torch.randint(3, 300, (1, 400), generator=torch.Generator().manual_seed(2)).cuda()
    fed = torch.randint(3, 300, (1, 100), generator=torch.Generator().manual_seed(3)).cuda()
    logits = []
    for cache in (KVarNCache(model.config), KVarNCache(model.config, device="cuda")):
        with torch.no_grad():
            model(ids, **cache_kwargs(model, cache))
            logits.append(torch.cat([model(fed[:, i : i + 1], **cache_kwargs(model, cache)).logits[:, -1]
                                     for i in range(100)]))
        assert len(cache.kvarn_layers[1].caches[0]) == 500  # the cache took every token
    error = (logits[1] - logits[0]).norm(dim=-1) / logits[0].norm(dim=-1)
    print(f"Hq 32 / Hk 8 / head_dim 128: logits relative L2 median {float(error.median()):.2e}, max "
          f"{float(error.max()):.2e}")
    assert error.max() <= 2e-3 and torch.equal(logits[1].argmax(-1), logits[0].argmax(-1))


@gpu
def test_gpu_beam_search_and_refused_step():
    """On the GPU: beam search (forks and frees every step) follows the host cache; a step refused by a later layer
    (NaN keys) is rolled back in every layer, across a tile completed by the step, byte for byte."""
    model = tiny_model(device="cuda")
    ids, mask = prompts([150, 140], seed=3, device="cuda")
    kw = dict(num_beams=3, num_return_sequences=2)
    host = generate(model, KVarNCache(model.config, PRESET, SINK), ids, mask, 60, **kw)
    gpu_out = generate(model, KVarNCache(model.config, PRESET, SINK, device="cuda"), ids, mask, 60, **kw)
    assert torch.equal(gpu_out[0], host[0])

    ids, mask = prompts([127], seed=5, device="cuda")
    cache = KVarNCache(model.config, PRESET, SINK, device="cuda")
    with torch.no_grad():
        model(ids, attention_mask=mask, **cache_kwargs(model, cache))
    layers = cache.kvarn_layers

    def content():
        return [layer.paged.to_cpu(layer.caches[0].seq).to_parts() for layer in layers]

    before = content()
    poison = model.model.layers[2].self_attn.k_proj.register_forward_hook(lambda m, i, o: o * float("nan"))
    step, full = torch.tensor([[7]], device="cuda"), torch.ones(1, 128, dtype=torch.long, device="cuda")
    try:
        with torch.no_grad(), pytest.raises(ValueError, match="NaN"):
            model(step, attention_mask=full, **cache_kwargs(model, cache))
    finally:
        poison.remove()
    for a, b in zip(before, content()):
        for key in a:
            if isinstance(a[key], np.ndarray):
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
    with torch.no_grad():
        model(step, attention_mask=full, **cache_kwargs(model, cache))
    assert len(layers[0].caches[0]) == 128 and layers[0].paged.length(layers[0].caches[0].seq) == 128


@gpu
def test_gpu_prompt_lookup_decoding_with_a_crop_window():
    """On the GPU (float32): prompt-lookup decoding with a crop window (its ring on the GPU) gives the host cache's
    tokens, and a crop into a quantised tile leaves the cache what the host cache holds, byte for byte."""
    model = tiny_model(device="cuda")
    ids = torch.randint(3, 40, (1, 150), generator=torch.Generator().manual_seed(8)).cuda()
    mask = torch.ones_like(ids)
    caches = [KVarNCache(model.config, PRESET, SINK, crop_window=128),
              KVarNCache(model.config, PRESET, SINK, crop_window=128, device="cuda")]
    host, gpu_out = (generate(model, c, ids, mask, 60, prompt_lookup_num_tokens=6) for c in caches)
    assert torch.equal(gpu_out[0], host[0])
    n = caches[1].get_seq_length()
    for c in caches:
        c.crop(-(n - 150))
    for hl, gl in zip(caches[0].kvarn_layers, caches[1].kvarn_layers):
        a, b = hl.caches[0].to_parts(), gl.paged.to_cpu(gl.caches[0].seq).to_parts()
        for key in a:
            if isinstance(a[key], np.ndarray):
                np.testing.assert_array_equal(a[key], b[key], err_msg=key)
