"""A hypothesis state machine for kvarn.cuda.PagedKVCache against a model of plain fp16 tokens.

test_cuda.py checks each of PagedKVCache's operations in chosen scenarios; this file lets hypothesis
interleave them: sequences added and freed (slots and pages reused), batched appends of drawn lengths
and dtypes to any subset of the live sequences in any layer, truncation (to lengths it accepts, through
the truncation_point recipe, and to lengths it must refuse), plans made and used while or after the
lengths they were made for change, and appends it must refuse (a NaN, a sequence past max_seq_len, the
pool out of pages) with the cache left exactly as it was, multi-token steps (append_attend) taken or
refused alike, and forks (a sequence starting as a copy of another, sharing its pages).

The model keeps, per sequence and layer, every token the cache was given, rounded to fp16 as the cache
stores it, and the pages each sequence holds (a page per tile that some layer of the sequence still
uses; a fork holds its parent's, and a sequence storing into a tile whose page another holds takes a new
one, as the cache copies it). After every step, for every live sequence and layer:
- length() and free_pages are the model's;
- records(), and to_cpu()'s sink and tail, equal byte for byte those of a fresh kvarn.KVCache (the CPU
  path, with the same preset and sink) given the model's tokens in one append: the GPU store kernel
  writes the CPU quantiser's bytes, whatever the chunking of the appends, the truncations and the pages
  the records landed on;
and attend's outputs (one query per sequence, GQA drawn) pass test_cuda.check_attention (float64 attention over the
content, which the invariant has just equated with the CPU cache's: within REL_TOL, or 4x the CPU float path's error).
Skips, with the reason printed, where there is no CUDA build, no GPU or no torch (CI).
"""
import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

import kvarn
import kvarn.cuda as kc

sys.path.insert(0, os.path.dirname(__file__))
from test_cache_stateful import expect  # noqa: E402
from test_cuda import check_against_cpu, check_attention  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

REASON = kc.unavailable_reason() or (None if torch is not None else "torch is not installed (device tensors)")

PRESETS = ["k4v2_g128", "k4v4_g64", "k2v2_g128"]
LAYERS = 2
MAX_SEQS = 3
MAX_SEQ_LEN = 600
IDX = st.integers(0, 7)  # picks a live sequence / plan, modulo how many there are
SEEDS = st.integers(0, 2**32 - 1)
# Token counts that end on, cross or stop short of tile boundaries (G 64 / 128, sinks 0 / 37 / G).
COUNTS = st.sampled_from([1, 1, 2, 17, 63, 64, 65, 127, 128, 129, 200, 300])
DTYPES = st.sampled_from(["float16", "float32", "bfloat16"])
STEP_COUNTS = st.sampled_from([1, 2, 3, 5, 17, 64, 65, 129])  # append_attend's tokens per sequence


def tokens(seed, B, T, H, D, dtype):
    """(device k, device v [B, T, H, D] in dtype, host fp16 k, v [B, H, T, D]: what the cache stores)."""
    rng = np.random.default_rng(seed)
    k = rng.standard_normal((B, T, H, D)).astype(np.float32)
    k[..., rng.choice(D, size=4, replace=False)] *= 8.0  # a few large key channels, as real keys have
    v = rng.standard_normal((B, T, H, D)).astype(np.float32)
    out = []
    for x in (k, v):
        t = torch.from_numpy(x).cuda().to(getattr(torch, dtype))
        # bf16 -> fp32 is exact, fp32 -> fp16 rounds to nearest even as numpy does.
        out.append((t, t.float().cpu().numpy().astype(np.float16).transpose(0, 2, 1, 3)))
    return out[0][0], out[1][0], out[0][1], out[1][1]


def cut_point(length, n, sink, group):
    """The model's truncation point: length, unless it falls inside a quantised tile (one whose G tokens
    are all present among the n), then that tile's start."""
    if length <= sink:
        return length
    tile, into = divmod(length - sink, group)
    return length - into if into and tile < max(n - sink, 0) // group else length


class PagedMachine(RuleBasedStateMachine):
    @initialize(preset=st.sampled_from(PRESETS), head_dim=st.sampled_from([64, 128]), hk=st.sampled_from([1, 2]),
                sink=st.sampled_from(["none", "odd", "one tile"]), num_pages=st.integers(2, 10))
    def setup(self, preset, head_dim, hk, sink, num_pages):
        self.preset = kvarn.PRESETS[preset]
        G = self.G = self.preset.group
        self.sink = {"none": 0, "odd": 37, "one tile": G}[sink]
        self.H, self.D, self.num_pages = hk, head_dim, num_pages
        self.cache = kc.PagedKVCache(hk, head_dim, preset, num_layers=LAYERS, max_seqs=MAX_SEQS,
                                     max_seq_len=MAX_SEQ_LEN, num_pages=num_pages, sink_tokens=self.sink)
        self.k, self.v = {}, {}  # seq id -> per layer fp16 [H, n, D]
        self.plans = []  # (plan, seq ids, layer, lengths when made)
        self.refs = {}  # (seq, layer) -> CPU KVCache of the model's tokens, rebuilt when they change
        self.pages = {}  # seq id -> the model's ids of the pages it holds, tile order (a fork shares its parent's)
        self.page_ids = 0
        # Always a live sequence (free adds one when it frees the last): with none, only add_sequence is enabled and
        # hypothesis gave up on about half its draws (s88c: 2,231 given up beside 2,000 run).
        self.add_sequence()

    # ---- the model -------------------------------------------------------------------------------
    def n(self, seq, layer):
        return self.k[seq][layer].shape[1]

    def tiles(self, n):
        return max(n - self.sink, 0) // self.G

    def pages_held(self, seq):
        return max(self.tiles(self.n(seq, layer)) for layer in range(LAYERS))

    def free_pages(self):
        return self.num_pages - len(set().union(*self.pages.values()))

    def store(self, chosen, layer, T, pages):
        """The pages (the model's, or a copy) after T tokens land in the chosen sequences' layer, in order: a tile
        no layer has takes a new page, one whose page another sequence holds too a new one (the cache's copy);
        returns how many were taken."""
        taken = 0
        for s in chosen:
            held = pages[s]
            for ti in range(self.tiles(self.n(s, layer)), self.tiles(self.n(s, layer) + T)):
                if ti == len(held) or sum(held[ti] in p for p in pages.values()) > 1:
                    self.page_ids += 1
                    held[ti:ti + 1] = [self.page_ids]
                    taken += 1
        return taken

    def cut_pages(self, seq):
        """After a truncation: the pages of the tiles no layer holds any more are let go."""
        del self.pages[seq][self.pages_held(seq):]

    def ref(self, seq, layer):
        if (seq, layer) not in self.refs:
            cpu = kvarn.KVCache(self.H, self.D, self.preset, sink_tokens=self.sink)
            cpu.append(self.k[seq][layer], self.v[seq][layer])
            self.refs[(seq, layer)] = cpu
        return self.refs[(seq, layer)]

    def set_tokens(self, seq, layer, k, v):
        self.k[seq][layer], self.v[seq][layer] = k, v
        self.refs.pop((seq, layer), None)

    def live(self):
        return sorted(self.k)

    def pick(self, i):
        seqs = self.live()
        return seqs[i % len(seqs)]

    # ---- rules --------------------------------------------------------------------------------------
    @precondition(lambda self: len(self.k) < MAX_SEQS)
    @rule()
    def add_sequence(self):
        seq = self.cache.add_sequence()
        expect(seq not in self.k, f"add_sequence gave {seq}, which is live")
        empty = np.zeros((self.H, 0, self.D), np.float16)
        self.k[seq], self.v[seq] = [empty] * LAYERS, [empty] * LAYERS
        self.pages[seq] = []
        for layer in range(LAYERS):
            self.refs.pop((seq, layer), None)

    @precondition(lambda self: 0 < len(self.k) < MAX_SEQS)
    @rule(i=IDX)
    def fork(self, i):
        parent = self.pick(i)
        seq = self.cache.fork(parent)
        expect(seq not in self.k, f"fork gave {seq}, which is live")
        self.k[seq], self.v[seq], self.pages[seq] = list(self.k[parent]), list(self.v[parent]), list(self.pages[parent])
        for layer in range(LAYERS):
            self.refs.pop((seq, layer), None)

    @precondition(lambda self: self.k)
    @rule(i=IDX)
    def free(self, i):
        seq = self.pick(i)
        self.cache.free(seq)
        del self.k[seq], self.v[seq], self.pages[seq]
        for layer in range(LAYERS):
            self.refs.pop((seq, layer), None)
        if not self.k:  # the next request arrives (see setup): the freed slot and every page are reused at once
            self.add_sequence()

    @precondition(lambda self: self.k)
    @rule(i=IDX, mask=st.integers(1, 7), layer=st.sampled_from([0, 1, "every"]), T=COUNTS, seed=SEEDS,
          dtype=DTYPES, bad=st.sampled_from([None] * 6 + ["nan", "inf"]))
    def append(self, i, mask, layer, T, seed, dtype, bad):
        """T tokens to each drawn sequence, in one layer or in every layer in turn (a model's step)."""
        seqs = self.live()
        chosen = [s for j, s in enumerate(seqs) if mask >> ((i + j) % 3) & 1] or [self.pick(i)]
        for lay in range(LAYERS) if layer == "every" else [layer]:
            self.append_one_layer(chosen, lay, T, seed + lay, dtype, bad)

    def refusal(self, chosen, layer, T, nan_in):
        """(error type, message pattern) of an append of T tokens to the chosen sequences in one layer, with a NaN in
        the array named nan_in (or none), that the cache must refuse; None if it must take it. Checked in this order:
        the lengths and the pages on the host, then the values on the GPU."""
        if any(self.n(s, layer) + T > MAX_SEQ_LEN for s in chosen):
            return ValueError, "max_seq_len"
        if self.store(chosen, layer, T, {s: list(p) for s, p in self.pages.items()}) > self.free_pages():
            return RuntimeError, "out of pages"
        return (ValueError, f"^{nan_in}: contains NaN or Inf") if nan_in else None

    def append_one_layer(self, chosen, layer, T, seed, dtype, bad):
        k, v, k16, v16 = tokens(seed, len(chosen), T, self.H, self.D, dtype)
        if bad:
            at = np.random.default_rng(seed).integers(0, [len(chosen), T, self.H, self.D])
            (k if seed % 2 else v)[tuple(at)] = float(bad)
        refusal = self.refusal(chosen, layer, T, bad and ("k" if seed % 2 else "v"))
        if refusal:
            with pytest.raises(refusal[0], match=refusal[1]):
                self.cache.append(chosen, k, v, layer=layer)
            return  # the invariants check that nothing changed
        self.cache.append(chosen, k, v, layer=layer)
        self.store(chosen, layer, T, self.pages)
        for b, s in enumerate(chosen):
            self.set_tokens(s, layer, np.concatenate([self.k[s][layer], k16[b]], axis=1),
                            np.concatenate([self.v[s][layer], v16[b]], axis=1))

    @precondition(lambda self: self.k)
    @rule(i=IDX, mask=st.integers(1, 7), layer=st.integers(0, LAYERS - 1), n=STEP_COUNTS, gqa=st.sampled_from([1, 3]),
          seed=SEEDS, dtype=DTYPES, bad=st.sampled_from([None] * 6 + ["q", "k", "v"]))
    def append_attend(self, i, mask, layer, n, gqa, seed, dtype, bad):
        """A multi-token step: the tokens land as append() would put them, the step is refused as append() is
        (the lengths and pages on the host first, then NaN in q, k or v), and each token's output is within
        check_attention's bound of attention over the model's tokens up to it (a CPU cache of them)."""
        seqs = self.live()
        chosen = [s for j, s in enumerate(seqs) if mask >> ((i + j) % 3) & 1] or [self.pick(i)]
        k, v, k16, v16 = tokens(seed, len(chosen), n, self.H, self.D, dtype)
        rng = np.random.default_rng(seed + 1)
        q = torch.from_numpy(rng.standard_normal((len(chosen), n, self.H * gqa, self.D)).astype(np.float32))
        q = q.cuda().to(getattr(torch, dtype))
        if bad:
            x = {"q": q, "k": k, "v": v}[bad]
            x[tuple(rng.integers(0, x.shape))] = float("nan")
        refusal = self.refusal(chosen, layer, n, bad)
        if refusal:
            with pytest.raises(refusal[0], match=refusal[1]):
                self.cache.append_attend(q, chosen, k, v, layer=layer)
            return  # the invariants check that nothing changed
        out = torch.empty_like(q, dtype=torch.float32)  # not q's dtype: no output rounding
        self.cache.append_attend(q, chosen, k, v, layer=layer, out=out)
        out = out.cpu().numpy()
        q32 = q.float().cpu().numpy()
        self.store(chosen, layer, n, self.pages)  # before set_tokens: it reads the lengths before the step
        checked = set(range(n)) if n <= 5 else {0, 1, n - 1, *rng.integers(0, n, 4).tolist()}
        for b, s in enumerate(chosen):
            cpu = kvarn.KVCache(self.H, self.D, self.preset, sink_tokens=self.sink)
            if self.n(s, layer):
                cpu.append(self.k[s][layer], self.v[s][layer])
            for t in range(n):
                cpu.append(k16[b][:, t : t + 1], v16[b][:, t : t + 1])
                if t in checked:
                    check_against_cpu(cpu, q32[b, t], out[b, t], 1 / np.sqrt(self.D), (s, layer, t))
            self.set_tokens(s, layer, np.concatenate([self.k[s][layer], k16[b]], axis=1),
                            np.concatenate([self.v[s][layer], v16[b]], axis=1))

    @precondition(lambda self: self.k)
    @rule(i=IDX, layer=st.sampled_from([None, None, 0, 1]), frac=st.floats(0, 1), reappend=st.booleans())
    def truncate(self, i, layer, frac, reappend):
        seq = self.pick(i)
        layers = range(LAYERS) if layer is None else [layer]
        n_min = min(self.n(seq, lay) for lay in layers)
        length = int(round(frac * n_min))
        points = {lay: cut_point(length, self.n(seq, lay), self.sink, self.G) for lay in layers}
        for lay in layers:
            got = self.cache.truncation_point(seq, length, layer=lay)
            expect(got == points[lay], f"truncation_point({length}) in layer {lay}: {got}, model {points[lay]}")
        if any(p != length for p in points.values()):
            with pytest.raises(ValueError, match="cuts the quantised tile"):
                self.cache.truncate(seq, length, layer=layer)
            if layer is None:
                return  # the invariants check that nothing changed
            # The recipe: cut at the point, append the kept tokens again.
            point, k16, v16 = points[layer], self.k[seq][layer], self.v[seq][layer]
            self.cache.truncate(seq, point, layer=layer)
            self.set_tokens(seq, layer, k16[:, :point], v16[:, :point])
            self.cut_pages(seq)
            if reappend and length > point:
                dev = [torch.from_numpy(np.ascontiguousarray(x[:, point:length].transpose(1, 0, 2)[None])).cuda()
                       for x in (k16, v16)]
                self.cache.append([seq], *dev, layer=layer)
                self.store([seq], layer, length - point, self.pages)
                self.set_tokens(seq, layer, k16[:, :length], v16[:, :length])
            return
        self.cache.truncate(seq, length, layer=layer)
        for lay in layers:
            self.set_tokens(seq, lay, self.k[seq][lay][:, :length], self.v[seq][lay][:, :length])
        self.cut_pages(seq)

    @precondition(lambda self: any(x.shape[1] for ks in self.k.values() for x in ks))
    @rule(i=IDX, mask=st.integers(1, 7), layer=st.integers(0, LAYERS - 1), gqa=st.sampled_from([1, 3, 4]),
          seed=SEEDS, use=st.sampled_from(["now", "plan", "plan"]))
    def attend(self, i, mask, layer, gqa, seed, use):
        seqs = self.live()
        nonempty = [s for s in seqs if self.n(s, layer)]
        chosen = [s for j, s in enumerate(seqs) if mask >> ((i + j) % 3) & 1 and self.n(s, layer)] or nonempty[:1]
        rng = np.random.default_rng(seed)
        if not chosen:  # this layer is empty in every sequence: attend must refuse
            q = rng.standard_normal((1, self.H * gqa, self.D)).astype(np.float32)
            with pytest.raises(ValueError, match="is empty"):
                self.cache.attend(torch.from_numpy(q).cuda(), [self.pick(i)], layer=layer)
            return
        q = rng.standard_normal((len(chosen), self.H * gqa, self.D)).astype(np.float32)
        out = self.cache.attend(torch.from_numpy(q).cuda(), chosen, layer=layer).cpu().numpy()
        check_attention(self.cache, chosen, q, out, 1 / np.sqrt(self.D), layer)
        if use == "plan":
            plan = self.cache.plan(chosen, layer=layer)
            again = self.cache.attend(torch.from_numpy(q).cuda(), plan=plan).cpu().numpy()
            expect(np.array_equal(again, out), "attend with a fresh plan differs from attend with seq_ids")
            self.plans = self.plans[-3:] + [(plan, chosen, layer, [self.n(s, layer) for s in chosen])]

    @precondition(lambda self: self.plans)
    @rule(j=IDX, seed=SEEDS)
    def attend_with_an_old_plan(self, j, seed):
        """Valid while its sequences are live and hold the lengths it was made for; refused otherwise."""
        plan, seqs, layer, lengths = self.plans[j % len(self.plans)]
        q = np.random.default_rng(seed).standard_normal((len(seqs), self.H, self.D)).astype(np.float32)
        valid = all(s in self.k and self.n(s, layer) == n for s, n in zip(seqs, lengths))
        if not valid:
            with pytest.raises(ValueError, match="^plan: "):
                self.cache.attend(torch.from_numpy(q).cuda(), plan=plan)
            return
        out = self.cache.attend(torch.from_numpy(q).cuda(), plan=plan).cpu().numpy()
        now = self.cache.attend(torch.from_numpy(q).cuda(), seqs, layer=layer).cpu().numpy()
        expect(np.array_equal(out, now), "attend with a still-valid plan differs from attend with seq_ids")
        check_attention(self.cache, seqs, q, out, 1 / np.sqrt(self.D), layer)

    # ---- invariants ---------------------------------------------------------------------------------
    @invariant()
    def content_is_the_models(self):
        if not hasattr(self, "cache"):
            return
        expect(self.cache.free_pages == self.free_pages(),
               f"free_pages {self.cache.free_pages}, model {self.free_pages()}")
        for s in self.live():
            for layer in range(LAYERS):
                n = self.n(s, layer)
                expect(self.cache.length(s, layer) == n, f"sequence {s} layer {layer}: {self.cache.length(s, layer)}"
                       f" tokens, model {n}")
                ref = self.ref(s, layer)
                got = self.cache.to_cpu(s, layer)
                expect((got.sink_len, got.num_tiles, got.tail_len) == (ref.sink_len, ref.num_tiles, ref.tail_len),
                       f"sequence {s} layer {layer}: sizes {(got.sink_len, got.num_tiles, got.tail_len)}, CPU cache "
                       f"{(ref.sink_len, ref.num_tiles, ref.tail_len)}")
                expect(np.array_equal(self.cache.records(s, layer), ref.records),
                       f"sequence {s} layer {layer}: records differ from the CPU cache's")
                gp, rp = got.to_parts(), ref.to_parts()
                for name in ("sink_k", "sink_v", "tail_k", "tail_v"):
                    expect(np.array_equal(gp[name].view(np.uint16), rp[name].view(np.uint16)),
                           f"sequence {s} layer {layer}: {name} differs from the model's tokens")


TestPagedKVCache = PagedMachine.TestCase
TestPagedKVCache.settings = settings(max_examples=int(os.environ.get("KVARN_CUDA_STATEFUL_EXAMPLES", "40")),
                                     stateful_step_count=30, deadline=None,
                                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
TestPagedKVCache = pytest.mark.skipif(REASON is not None, reason=f"GPU tests skipped: {REASON}")(TestPagedKVCache)


@pytest.mark.skipif(torch is None, reason="torch is not installed (the stand-in's tensors)")
def test_the_machine_against_a_cpu_stand_in():
    """Where there is no GPU (CI): this machine's own model and expectations (page sharing and copies on write,
    refusals, truncation points, each output's bound) run against a CPU stand-in for PagedKVCache, one
    kvarn.KVCache per sequence and layer with the GPU cache's refusal order and page accounting
    (benchmarks/results/zen4_2c_s88/cuda_stateful_shim.py), in a subprocess: the stand-in replaces
    kvarn.cuda.PagedKVCache for the whole process. 60 examples, derandomised. Not a test of the GPU path."""
    shim = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks", "results", "zen4_2c_s88",
                        "cuda_stateful_shim.py")
    r = subprocess.run([sys.executable, shim, "60", "--derandomize"], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0 and "60 examples: no failure" in r.stdout, r.stdout[-3000:] + r.stderr[-3000:]
    assert "forks" in r.stdout and "steps" in r.stdout, r.stdout  # the rules ran
