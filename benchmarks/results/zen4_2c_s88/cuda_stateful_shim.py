"""Runs tests/test_cuda_stateful.py's state machine against a CPU stand-in for kvarn.cuda.PagedKVCache (one
kvarn.KVCache per sequence and layer, the same refusals in the same order), to check the machine's own model and
expectations where there is no GPU. Not a test of the GPU path: the stand-in's records are the CPU's by construction.
    PYTHONPATH=<site> python cuda_stateful_shim.py [examples]     (needs torch, CPU build)
Prints how often each refusal was expected and how many attention outputs were checked. Under pytest (from the
forty-ninth session), for hypothesis's statistics (how many draws it gave up on):
    KVARN_SHIM_EXAMPLES=2000 PYTHONPATH=<site> python -m pytest --hypothesis-show-statistics cuda_stateful_shim.py
KVARN_SHIM_TESTS=<dir> runs another copy of tests/ (e.g. an older test_cuda_stateful.py) against the stand-in."""
import collections
import os
import sys

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test

import kvarn

sys.path.insert(0, os.environ.get("KVARN_SHIM_TESTS") or
                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..", "tests"))
torch.Tensor.cuda = lambda self, *a, **k: self  # the machine's device tensors stay on the CPU
import test_cuda  # noqa: E402
import test_cuda_stateful as machine  # noqa: E402

test_cuda.REL_TOL = 2e-3  # the stand-in attends in the CPU's default int16 mode, not the GPU's arithmetic
counts = collections.Counter()


class Plan:
    def __init__(self, cache, seqs, layer):
        self.seqs, self.layer, self.lens = list(seqs), layer, [cache.length(s, layer) for s in seqs]


class StandIn:
    def __init__(self, H, D, preset, *, num_layers, max_seqs, max_seq_len, num_pages, sink_tokens):
        self.H, self.D, self.preset, self.L, self.S = H, D, kvarn.PRESETS[preset], num_layers, max_seqs
        self.max_len, self.num_pages, self.sink = max_seq_len, num_pages, sink_tokens
        self.seqs = {}
        # Pages (fifty-fourth session, for fork): per sequence the page numbers it holds, and per page how many
        # sequences hold it; a store into a tile whose page is held twice takes a new one (the GPU's copy).
        self.pages, self.holders, self.next_page = {}, collections.Counter(), 0

    def _tiles(self, n):
        return max(n - self.sink, 0) // self.preset.group

    def _held(self, s):
        return max(self._tiles(len(c)) for c in self.seqs[s])

    @property
    def free_pages(self):
        return self.num_pages - sum(1 for n in self.holders.values() if n)

    def _release(self, pages):
        for p in pages:
            self.holders[p] -= 1

    def _store(self, seqs, layer, T, apply):
        """Pages that T more tokens in the sequences' layer take (a new tile, or a copy of a shared one)."""
        need, copied = 0, collections.Counter()
        for s in seqs:
            held = self.pages[s]
            for ti in range(self._tiles(len(self.seqs[s][layer])), self._tiles(len(self.seqs[s][layer]) + T)):
                if ti < len(held) and self.holders[held[ti]] - copied[held[ti]] <= 1:
                    continue
                need += 1
                if not apply:  # counted as if taken: the holders change only when applied
                    if ti < len(held):
                        copied[held[ti]] += 1
                    continue
                self.next_page += 1
                if ti < len(held):
                    counts["shared pages copied"] += 1
                    self._release([held[ti]])
                held[ti:ti + 1] = [self.next_page]
                self.holders[self.next_page] = 1
        return need

    def add_sequence(self):
        s = min(set(range(self.S)) - set(self.seqs))
        self.seqs[s] = [kvarn.KVCache(self.H, self.D, self.preset, sink_tokens=self.sink) for _ in range(self.L)]
        self.pages[s] = []
        return s

    def fork(self, s):
        new = min(set(range(self.S)) - set(self.seqs))
        self.seqs[new] = [c.copy() for c in self.seqs[s]]
        self.pages[new] = list(self.pages[s])
        for p in self.pages[s]:
            self.holders[p] += 1
        counts["forks"] += 1
        return new

    def free(self, s):
        del self.seqs[s]
        self._release(self.pages.pop(s))

    def length(self, s, layer=0):
        return len(self.seqs[s][layer])

    def append(self, seqs, k, v, layer=0):
        k, v = k.float().numpy(), v.float().numpy()
        T = k.shape[1]
        if any(len(self.seqs[s][layer]) + T > self.max_len for s in seqs):
            raise ValueError("k: would exceed max_seq_len")
        if self._store(seqs, layer, T, False) > self.free_pages:
            raise RuntimeError("out of pages")
        for x, name in ((k, "k"), (v, "v")):
            if not np.isfinite(x).all():
                raise ValueError(f"{name}: contains NaN or Inf")
        counts["appends"] += 1
        self._store(seqs, layer, T, True)
        for b, s in enumerate(seqs):
            self.seqs[s][layer].append(k[b].transpose(1, 0, 2).astype(np.float16), v[b].transpose(1, 0, 2).astype(np.float16))

    def append_attend(self, q, seqs, k, v, layer=0, out=None):  # (fifty-third session)
        q, k, v = q.float().numpy(), k.float().numpy(), v.float().numpy()
        T = k.shape[1]
        if any(len(self.seqs[s][layer]) + T > self.max_len for s in seqs):
            raise ValueError("k: would exceed max_seq_len")
        if self._store(seqs, layer, T, False) > self.free_pages:
            raise RuntimeError("out of pages")
        for x, name in ((q, "q"), (k, "k"), (v, "v")):
            if not np.isfinite(x).all():
                raise ValueError(f"{name}: contains NaN or Inf")
        counts["steps"] += 1
        self._store(seqs, layer, T, True)
        counts["attention outputs"] += len(seqs) * T
        res = np.stack([kvarn.append_attend(q[b], self.seqs[s][layer], k[b].transpose(1, 0, 2).astype(np.float16),
                                            v[b].transpose(1, 0, 2).astype(np.float16)) for b, s in enumerate(seqs)])
        out[...] = torch.from_numpy(res)
        return out

    def truncation_point(self, s, length, layer=0):
        return self.seqs[s][layer].truncation_point(length)

    def truncate(self, s, length, layer=None):
        layers = range(self.L) if layer is None else [layer]
        if any(self.seqs[s][lay].truncation_point(length) != length for lay in layers):
            raise ValueError("length: cuts the quantised tile")
        counts["truncations"] += 1
        for lay in layers:
            self.seqs[s][lay].truncate(length)
        held = self.pages[s]
        self._release(held[self._held(s):])
        del held[self._held(s):]

    def plan(self, seqs, layer=0):
        return Plan(self, seqs, layer)

    def attend(self, q, seqs=None, layer=None, plan=None):
        if plan is not None:
            if any(s not in self.seqs or self.length(s, plan.layer) != n for s, n in zip(plan.seqs, plan.lens)):
                raise ValueError("plan: stale")
            seqs, layer = plan.seqs, plan.layer
        layer = layer or 0
        if any(self.length(s, layer) == 0 for s in seqs):
            raise ValueError("seq_ids: a sequence is empty")
        counts["attention outputs"] += len(seqs)
        q = q.numpy()
        return torch.from_numpy(np.stack([kvarn.attend(q[b], self.seqs[s][layer]) for b, s in enumerate(seqs)]))

    def records(self, s, layer=0):
        return self.seqs[s][layer].records

    def to_cpu(self, s, layer=0):
        return self.seqs[s][layer].copy()


machine.kc.PagedKVCache = StandIn
_raises = pytest.raises


def counted_raises(error, match=None):
    counts[f"refusal expected: {error.__name__} {match}"] += 1
    return _raises(error, match=match)


machine.pytest.raises = counted_raises
if __name__ == "__main__":
    examples = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    # --derandomize: the same examples every run (tests/test_cuda_stateful.py runs it so in CI, from the
    # fifty-fourth session on)
    run_state_machine_as_test(machine.PagedMachine, settings=settings(
        max_examples=examples, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck),
        derandomize="--derandomize" in sys.argv))
    for key, n in sorted(counts.items()):
        print(f"{n:6d}  {key}")
    print(f"{examples} examples: no failure")
else:  # collected by pytest
    TestStandIn = machine.PagedMachine.TestCase
    TestStandIn.pytestmark = []  # the GPU test's skip mark sits on the same class
    TestStandIn.settings = settings(max_examples=int(os.environ.get("KVARN_SHIM_EXAMPLES", "400")),
                                    stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck))
