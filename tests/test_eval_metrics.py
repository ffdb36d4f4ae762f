"""`kvarn eval`'s arithmetic without a model: the metrics (KL direction, perplexity, top-1), which logits rows are
scored against which tokens, the bits each method is charged, the pseudo-decode mask at a tile boundary, and the
run's arguments. A report-only mutation audit (h41) found each of these could change without a test failing."""
from __future__ import annotations

import argparse
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from kvarn import eval as kev  # noqa: E402
from kvarn.cli import build_parser  # noqa: E402


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - x.max(-1, keepdims=True) - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True))


def test_compare_logits_is_kl_of_the_reference_against_the_method():
    ref_logits = np.array([[2.0, 0.0, -1.0], [0.0, 3.0, 0.5]])
    logits = np.array([[0.5, 1.0, 0.0], [0.2, 2.0, 1.5]])
    targets = np.array([2, 0])  # neither the reference's nor the method's argmax: top-1 must not read them
    ref, m = _log_softmax(ref_logits), _log_softmax(logits)
    kl_rows = (np.exp(ref) * (ref - m)).sum(-1)  # KL(ref || method), the direction
    reverse = (np.exp(m) * (m - ref)).sum(-1)
    assert abs(kl_rows.mean() - reverse.mean()) > 1e-3  # the two directions differ on these rows
    got = kev.compare_logits(torch.tensor(ref, dtype=torch.float32), torch.tensor(logits), torch.tensor(targets))
    assert got["kl"] == pytest.approx(kl_rows.mean(), rel=1e-6)
    assert got["kl_max"] == pytest.approx(kl_rows.max(), rel=1e-6)
    nll = -m[np.arange(2), targets]
    assert got["ppl"] == pytest.approx(math.exp(nll.mean()), rel=1e-9)  # natural log, e-based perplexity
    assert got["top1"] == 0.5  # row 0: argmax 0 vs 1 (differs); row 1: 1 vs 1 (agrees)


def test_scored_rows_pair_each_position_with_the_next_token():
    ids = list(range(100, 110))
    rows, targets = kev.scored_rows(ids, 3)
    assert (rows.start, rows.stop) == (3, 9)  # positions 3..8; position 9 predicts past the window
    assert targets.tolist() == ids[4:]
    assert len(range(10)[rows]) == len(targets)


def test_decode_path_comparison_scores_row_j_against_token_j_plus_one():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 50, generator=g, dtype=torch.float64)
    ref_rows = torch.log_softmax(logits, -1).float()[:-1]
    targets = torch.arange(5)
    same_pseudo = logits + 0.3 * torch.randn(6, 50, generator=g, dtype=torch.float64)
    same = kev.decode_path_comparison(ref_rows, logits, same_pseudo, targets)
    assert same["kl_cache"] < 1e-6 < same["kl_pseudo"]  # the decode path equal to the reference: KL 0
    agree = float((logits.argmax(-1) == same_pseudo.argmax(-1)).double().mean())
    assert same["top1_cache_vs_pseudo"] == agree and same["max_abs_logit_diff"] == float((logits - same_pseudo).abs().max())
    shifted = kev.decode_path_comparison(ref_rows, torch.roll(logits, 1, 0), logits, targets)
    assert shifted["kl_cache"] > 0.1 and shifted["kl_pseudo"] < 1e-6  # rows off by one are caught


@pytest.mark.parametrize("quantize_on, own_tile_exact", [("next", True), ("fill", False)])
def test_pseudo_decode_follows_quantize_on(quantize_on, own_tile_exact):
    (m,) = [m for m in kev.build_methods(64, presets=("k4v2_g64",), baselines=False) if m.family == "kvarn"]
    args = argparse.Namespace(sink=16, quantize_on=quantize_on)
    att = kev.pseudo_decode_for(m, args, exact_prefix=5)
    assert (att.sink, att.group, att.exact_prefix, att.own_tile_exact) == (16, 64, 5, own_tile_exact)


def test_pseudo_decode_mask_quantises_the_last_full_tile():
    sink, group = 4, 8
    T = sink + 2 * group  # exactly two full tiles, no tail
    mask = kev.pseudo_decode_mask(T, sink, group)
    quantised, exact = mask[:, :T], mask[:, T:]
    last = T - 1  # the second tile's last token: under "fill" it reads its own tile quantised
    assert quantised[last, sink:T].all() and not quantised[last, :sink].any()
    assert exact[last, :sink].all() and not exact[last, sink:].any()
    own = kev.pseudo_decode_mask(T, sink, group, own_tile_exact=True)
    assert own[last, sink : sink + group].all() and not own[last, sink + group : T].any()


def test_methods_are_charged_their_stored_bits():
    methods = {m.name: m for m in kev.build_methods(128, presets=("k4v2_g128",))}
    assert methods["KVarN k4v2_g128"].bits_per_element == pytest.approx(3.375)  # SPEC §6: 13,824 bytes per record
    # TurboQuant-style: b-bit codes plus one fp16 norm per D-element vector
    assert methods["TurboQuant-style 3-bit"].bits_per_element == pytest.approx(3 + 16 / 128)
    assert methods["TurboQuant-style 4-bit"].bits_per_element == pytest.approx(4 + 16 / 128)
    # KIVI k4v2 at G = D = 128: per-channel K (scale, zero) over 128 tokens, per-token V over 128 channels
    assert methods["KIVI k4v2_g128"].bits_per_element == pytest.approx((4 + 32 / 128 + 2 + 32 / 128) / 2)


def test_eval_defaults_score_from_position_256():
    args = build_parser().parse_args(["eval"])
    assert args.eval_from == 256 and args.tokens == 2048 and args.quantize_on == "next"


def test_eval_needs_a_scored_position_that_sees_a_quantised_tile(tmp_path):
    def check(tokens):
        argv = ["eval", "--tokens", str(tokens), "--sink", "128", "--presets", "k4v2_g128", "--no-baselines",
                "--eval-from", "1", "--gen-prompts", "0", "--decode-steps", "0", "--out", str(tmp_path / str(tokens))]
        kev._check_args(build_parser().parse_args(argv))

    check(128 + 128 + 2)  # the last scored position, 256, reads the tile 128..255 quantised (under "next")
    with pytest.raises(ValueError, match="--tokens, --sink: no scored position sees a quantised tile"):
        check(128 + 128 + 1)


def test_identical_prefix_counts_the_leading_agreement_only():
    # The greedy-agreement measure the integration tests and `kvarn eval` rely on (h52: dropping its
    # break passed every test, and then the integration tests could not fail).
    assert kev.identical_prefix([1, 2, 3, 4], [1, 2, 9, 4]) == 2  # stops at the first difference
    assert kev.identical_prefix([7, 2], [1, 2]) == 0
    assert kev.identical_prefix([1, 2, 3], [1, 2, 3]) == 3
    assert kev.identical_prefix([1, 2, 3], [1, 2]) == 2  # the shorter list bounds it
    assert kev.identical_prefix([], [1]) == 0
