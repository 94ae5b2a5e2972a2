"""posenc.lab.curves and posenc.lab.sweeps: the curves, the sweeps and their pure maths."""

import dataclasses
import math

import pytest
import torch

import posenc
from posenc.lab import PRESETS, Lab, curves, sweeps

# the smoke preset, cut further: two schemes, a few steps (the numbers are not the point)
CONFIG = dataclasses.replace(
    PRESETS["smoke"],
    schemes=("rope", "alibi"),
    steps=5,
    eval_tokens=64,
    rope_bases=(100.0, 1000.0),
    alibi_slope_scales=(0.5, 1.0),
    yarn_betas=(32.0, 4.0),
    wide_heads=2,
)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


@pytest.fixture(scope="module")
def lab():
    return Lab(CONFIG)


FIELDS = {
    "positions": {"scheme", "factor", "length", "start", "loss", "floor"},
    "sliding": {"scheme", "factor", "length", "window", "loss", "floor", "eval_se"},
    "rope_base": {"base", "head_dim", "method", "factor", "length", "loss", "floor", "excess",
                  "eval_se"},
    "alibi_slopes": {"scale", "factor", "length", "loss", "floor", "excess", "eval_se"},
    "yarn_sweep": {"method", "beta_fast", "factor", "length", "loss", "floor", "excess",
                   "eval_se"},
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(FIELDS))
def test_every_experiment_returns_tidy_rows_with_its_fields(lab, name):
    experiments = {**curves.EXPERIMENTS, **sweeps.EXPERIMENTS}
    assert set(experiments) == set(FIELDS)
    assert set(curves.DESCRIPTIONS) | set(sweeps.DESCRIPTIONS) == set(FIELDS)
    rows = experiments[name](lab)
    assert rows
    for row in rows:
        assert set(row) == FIELDS[name]
        for key in ("loss", "floor", "excess", "eval_se"):
            if key in row:
                assert math.isfinite(row[key]) and row[key] == round(row[key], 4)
        assert row["loss"] > 0 and row["floor"] > 0


def test_row_counts_cover_every_setting(lab):
    c = CONFIG
    L, factors = c.train_len, c.eval_factors
    width = max(1, L // 4)
    pos = curves.positions(lab)
    assert len(pos) == len(c.schemes) * sum(f * L // width for f in factors)
    slide = curves.sliding(lab)
    assert len(slide) == len(c.schemes) * len(factors) * 2
    base = sweeps.rope_base(lab)
    assert {(r["base"], r["head_dim"]) for r in base} == {
        (b, c.d_model // h) for b in c.rope_bases for h in (c.heads, c.wide_heads)
    }
    assert len(base) == 4 * len(factors) * len(c.rope_bases) * 2
    yarn = sweeps.yarn_sweep(lab)
    assert len(yarn) == (len(c.yarn_betas) + 1) * sum(f > 1 for f in factors)


def test_positions_bins_average_the_per_position_loss(lab):
    # the bins' mean (every bin has the same width here) is the extrapolation loss at f L
    c = CONFIG
    model, _ = lab.model("lm", "rope")
    n = c.eval_factors[-1] * c.train_len
    rows = [r for r in curves.positions(lab) if r["scheme"] == "rope" and r["length"] == n]
    whole = lab.lm_loss(model, n).mean().item()
    assert abs(sum(r["loss"] for r in rows) / len(rows) - whole) < 1e-3
    assert [r["start"] for r in rows] == list(range(0, n, max(1, c.train_len // 4)))


def test_sliding_with_stride_one_window_is_the_nonoverlapping_evaluation():
    lab = Lab(dataclasses.replace(CONFIG, sliding_stride=1.0))
    rows = curves.sliding(lab)
    for r in [r for r in rows if r["window"] == "sliding"]:
        twin = next(
            s for s in rows
            if s["window"] == "nonoverlapping" and s["scheme"] == r["scheme"]
            and s["length"] == r["length"]
        )  # fmt: skip
        same = ("loss", "eval_se", "floor")
        assert [r[k] for k in same] == [twin[k] for k in same]


def test_sliding_differs_from_nonoverlapping_with_a_short_stride(lab):
    # a real difference: with stride n/4 most tokens are scored with more context
    rows = curves.sliding(lab)
    longer = [r for r in rows if r["factor"] > 1]
    pairs = {(r["scheme"], r["length"], r["window"]): r["loss"] for r in longer}
    assert any(pairs[(s, n, "sliding")] != pairs[(s, n, "nonoverlapping")] for s, n, _ in pairs)


@pytest.mark.parametrize(
    "total,length,stride", [(16, 4, 1), (16, 4, 3), (16, 4, 4), (10, 4, 3), (7, 7, 2), (33, 8, 5)]
)
def test_window_plan_scores_every_position_once_with_enough_context(total, length, stride):
    plan = curves.window_plan(total, length, stride)
    scored = []
    for k, (start, first) in enumerate(plan):
        assert 0 <= start and start + length <= total
        for p in range(start + first, start + length):
            scored.append(p)
            if k > 0:  # after the first window: at least length - stride tokens before p
                assert p - start >= length - stride
    assert scored == list(range(total))


def test_window_plan_rejects_bad_strides():
    with pytest.raises(ValueError, match="stride"):
        curves.window_plan(16, 4, 0)
    with pytest.raises(ValueError, match="stride"):
        curves.window_plan(16, 4, 5)
    with pytest.raises(ValueError, match="length"):
        curves.window_plan(4, 8, 1)


def test_a_variant_equal_to_the_configuration_reuses_the_extrapolation_model(lab):
    c = CONFIG
    rope, _ = lab.model("lm", "rope")
    alibi, _ = lab.model("lm", "alibi")
    assert sweeps._variant(lab, rope_base=c.rope_base, heads=c.heads) == {}
    assert sweeps._variant(lab, alibi_slope_scale=1.0) == {}
    before = len(lab._models)
    sweeps.rope_base(lab)
    sweeps.alibi_slopes(lab)
    # new models: every (base, heads) but the configuration's, every scale but 1
    added = len(c.rope_bases) * 2 - 1 + len(c.alibi_slope_scales) - 1
    assert len(lab._models) - before <= added
    assert lab.model("lm", "rope")[0] is rope and lab.model("lm", "alibi")[0] is alibi
    keys = set(lab._models)
    assert ("lm", "rope", "input", ("rope_base", c.rope_base)) not in keys
    assert ("lm", "alibi", "input", ("alibi_slope_scale", 1.0)) not in keys
    assert ("lm", "rope", "input", ("rope_base", 1000.0)) in keys
    # the standard model's rows are those of the extrapolation model, scored plainly
    plain = next(
        r for r in sweeps.rope_base(lab)
        if r["base"] == c.rope_base and r["head_dim"] == c.d_model // c.heads
        and r["method"] == "none" and r["factor"] == 2
    )  # fmt: skip
    ext = next(r for r in posenc.lab.EXPERIMENTS["extrapolation"](lab)
               if r["scheme"] == "rope" and r["factor"] == 2)  # fmt: skip
    assert (plain["loss"], plain["eval_se"]) == (ext["loss"], ext["eval_se"])


# ------------------------------------------------------------------ pure maths


def _unseen_brute_force(head_dim, base, L, factor):
    """Angles accumulated position by position (float64), not from theta * (L - 1)."""
    count = 0
    for i in range(head_dim // 2):
        theta = base ** (-2.0 * i / head_dim)
        angle, seen_max, leaves = 0.0, 0.0, False
        for p in range(int(factor * L)):
            if p < L:
                seen_max = max(seen_max, angle)
            elif angle > seen_max:
                leaves = True
            angle += theta
        if seen_max < 2 * math.pi and leaves:
            count += 1
    return count


@pytest.mark.parametrize(
    "head_dim,base,L,factor",
    [(16, 100.0, 32, 4), (16, 100.0, 32, 1), (16, 10000.0, 32, 16), (64, 100.0, 32, 2),
     (8, 10.0, 8, 4), (128, 500000.0, 64, 2), (32, 1000.0, 128, 8)],
)  # fmt: skip
def test_unseen_angle_pairs_against_a_loop_over_positions(head_dim, base, L, factor):
    assert sweeps.unseen_angle_pairs(head_dim, base, L, factor) == _unseen_brute_force(
        head_dim, base, L, factor
    )


def test_unseen_angle_pairs_at_the_lab_settings():
    # by hand: pair i turns 31 * 100**(-i/8) / (2 pi) times over 31 positions:
    # 4.93, 2.77, 1.56, 0.88, 0.49, ... so pairs 3..7 never complete a turn below L = 32
    assert sweeps.unseen_angle_pairs(16, 100.0, 32, 4) == 5
    # and modulo 2 pi too: each of them has, at distance L, an angle past the arc it saw
    theta = 100.0 ** (-torch.arange(8, dtype=torch.float64) / 8)
    beyond = (theta * 32) % (2 * math.pi) > theta * 31
    assert beyond[3:].all() and not beyond[:3].any()
    with pytest.raises(ValueError, match="head_dim"):
        sweeps.unseen_angle_pairs(15, 100.0, 32, 4)
    with pytest.raises(ValueError, match="factor"):
        sweeps.unseen_angle_pairs(16, 100.0, 32, 0.5)


def test_yarn_split_at_the_lab_settings():
    # by hand (the paper's code): the ramp's index range is
    # [floor(16 ln(32 / (32 * 2 pi)) / (2 ln 100)), ceil(16 ln(32 / (1 * 2 pi)) / (2 ln 100))]
    # = [floor(-3.19), ceil(2.83)] -> [0, 3]; keep_i = 1 - clamp(i / 3, 0, 1) and a pair
    # is divided by 1 / ((1 - keep) / 4 + keep): 1, 4/3, 2, then 4 for pairs 3..7
    split = sweeps.yarn_split(16, 100.0, 32, 4)
    golden = torch.tensor([1.0, 4 / 3, 2.0, 4.0, 4.0, 4.0, 4.0, 4.0], dtype=torch.float64)
    torch.testing.assert_close(split, golden, rtol=1e-12, atol=0)


def test_yarn_split_keeps_fast_pairs_and_interpolates_slow_ones():
    # the paper's regime (a Llama-like head): pairs making more than beta_fast turns over L
    # are kept, those making fewer than beta_slow are divided by the factor
    dim, base, L, s = 128, 10000.0, 4096, 8.0
    split = sweeps.yarn_split(dim, base, L, s, 32.0, 1.0)
    for i in range(dim // 2):
        turns = L * base ** (-2.0 * i / dim) / (2 * math.pi)
        if turns > 32 * base ** (2.0 / dim):  # one index beyond the ramp's rounded start
            assert split[i].item() == pytest.approx(1.0, abs=1e-12)
        elif turns < 1 / base ** (2.0 / dim):  # one index beyond the ramp's rounded end
            assert split[i].item() == pytest.approx(s, rel=1e-12)
        else:
            assert 1.0 <= split[i].item() <= s


def test_yarn_split_with_tiny_betas_is_plain_rope():
    # every pair makes more than beta_fast turns: every pair is kept (slowest: 0.09 turns)
    split = sweeps.yarn_split(16, 100.0, 32, 4, beta_fast=0.05, beta_slow=0.01)
    torch.testing.assert_close(split, torch.ones(8, dtype=torch.float64), rtol=1e-12, atol=0)


def test_yarn_split_with_huge_betas_keeps_every_pair_as_the_reference_code_does():
    # Every pair makes fewer than beta_slow turns, so the paper's formula would divide all
    # of them (PI).  The paper's code (and transformers) ramps over indices with the start
    # clamped to 0 and the end below it: the ramp is inverted and every pair is kept.
    split = sweeps.yarn_split(16, 100.0, 32, 4, beta_fast=1e6, beta_slow=1e5)
    torch.testing.assert_close(split, torch.ones(8, dtype=torch.float64), rtol=1e-12, atol=0)


def test_yarn_split_ignores_beta_fast_above_the_fastest_pairs_turns():
    # at L = 32 the fastest pair (omega_0 = 1) makes 32 / (2 pi) = 5.09 turns whatever the
    # base and head dimension: every beta_fast above that clamps the ramp's start to pair 0
    for dim, base in ((16, 100.0), (64, 100.0), (16, 10000.0)):
        at_32 = sweeps.yarn_split(dim, base, 32, 4, beta_fast=32.0)
        assert torch.equal(at_32, sweeps.yarn_split(dim, base, 32, 4, beta_fast=5.2))
        assert at_32[0].item() == 1.0  # pair 0 kept, though it makes fewer than 32 turns
    # below it the ramp starts later: pair 1 (2.86 turns over L) is kept
    low = sweeps.yarn_split(16, 100.0, 32, 4, beta_fast=2.0)
    assert low[1].item() == 1.0 and sweeps.yarn_split(16, 100.0, 32, 4)[1].item() > 1.3
