"""The chapter's propositions, their thresholds, what the chapter states, and the rules.

This file is frozen: it was committed before any run of the confirmation seeds,
and the chapter prints its SHA-256 (:func:`frozen_hash`).  It fixes, for every
proposition, the per-seed statistic, the threshold (or margin), the kind of
test, and ``stated``: the verdict the chapter asserts (``"holds"`` or
``"fails"``), or ``None`` for a question it reports on without a stated answer.

**What was chosen when.**  The *rule* of each kind of test below was fixed in
advance.  *Which* propositions are stated, and in which direction, was chosen
after the discovery runs (seeds 0-4, ``posenc/lab/results/{full,recall}.json``)
had been seen: the discovery set chose the claims.  The confirmation set
(seeds 5-14, ``posenc/lab/results/{full,recall}-confirmation.json``) was run
after this file was committed, and decides whether each stated claim
replicates.  The recall propositions (``learns-*``, ``reach-*``) measure recall
by distance band against a window-of-L control, a measure the discovery runs
did not have: they were stated from the discovery runs' older measure and
are tested on new seeds only.  The RoPE propositions at the second budget
(``*-1200``) and the five schemes added to the runs (Shaw, Transformer-XL,
DA, FIRE, CoPE) are questions without a stated answer.

**Runs after the freeze** (each command is ``python -m posenc.lab`` with
``--jobs 2 --no-plots --out DIR``, and ``--split confirmation`` for the
confirmation set; the parts of a set are joined with ``--merge``):

* discovery, the five schemes not in its runs: ``--seeds 0-4 --schemes
  shaw,transformer_xl,da,fire,cope --experiments
  training,extrapolation,early_tokens,passkey,positions,sliding``; and the second
  budget: ``--seeds 0-4 --experiments rope_budget``;
* confirmation, the full preset: ``--seeds 5-9`` (every experiment and scheme),
  then ``--seeds 10-14 --schemes
  none,sinusoidal,learned,rope,alibi,t5,xpos,kerple --experiments
  training,extrapolation,rope_scaling,rope_budget,early_tokens,passkey,sliding,rope_base,alibi_slopes``
  (rate propositions, and effects close to their threshold, need 10 seeds);
* confirmation, the recall preset: ``--preset recall --seeds 5-9`` (every
  scheme), then ``--preset recall --seeds 10-14 --schemes
  none,sinusoidal,learned,rope,alibi,t5,xpos,kerple`` (the schemes of
  :data:`RECALL_STATED_SCHEMES`).

Every proposition is computed on whatever seeds of a set its rows exist for.

**The rules** (``alpha = 0.05``: a raw verdict "holds" or "fails" of a true
null errs with probability at most 5%; 2.5% for each direction of an effect or
a rate):

* ``kind="effect"`` (a paired loss difference: continuous, unimodal over
  seeds).  The 95% Student-t interval of the mean over seeds: **holds** when it
  lies above ``threshold``, **fails** when below, else **inconclusive** (also
  with fewer than 2 seeds, or no spread).  p-value: the two-sided one-sample
  t-test against ``threshold``.
* ``kind="equivalence"`` (a "no difference" statement): two one-sided t-tests
  (TOST) with the ``margin`` fixed here.  **holds** (equivalent) when the 90%
  t-interval lies inside ``threshold +- margin``; **fails** when the 95%
  interval lies wholly outside it; else **inconclusive**.  p-value: the TOST
  p (the larger one-sided p) for holds, twice the smaller one-sided p of
  "beyond the margin" for fails; the smaller of the two.
* ``kind="rate"`` (a bounded or bimodal outcome: an accuracy, whether a model
  learned).  Each seed passes or not by the per-seed criterion in
  ``statistic``; ``k`` of ``n`` seeds pass.  The 95% Clopper-Pearson interval
  of the pass rate: **holds** when it lies above ``threshold`` (the rate
  bar, 1/2: "on most seeds"), **fails** when below, else **inconclusive**.
  p-value: twice the exact one-sided binomial tail at ``threshold``.  With 5
  seeds no rate can hold or fail (5 of 5 gives [0.48, 1]); with 10, 9 of 10
  holds and 1 of 10 fails.

**Multiplicity.**  :func:`check` also gives every verdict after Holm's
correction within its *family*: the stated propositions of one preset
(``full``: the language, passkey and sweep experiments; ``recall``), or the
reported ones of that preset.  A verdict survives when its Holm-adjusted
p-value is below ``alpha``; otherwise it is **inconclusive** after
correction.  The raw verdict decides ``--check``; the adjusted one is shown
beside it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable
from pathlib import Path

from .experiments import curse_summary
from .stats import binomial_tail, clopper_pearson, holm, t_interval, t_test

__all__ = [
    "PROPOSITIONS", "RECALL_EXPERIMENTS", "Proposition", "check", "failures", "format_verdicts",
    "frozen_hash", "t_interval",
]  # fmt: skip

ALPHA = 0.05
#: The margin of every equivalence test on a loss difference (nats): half the
#: 0.1-nat minimum effect of "breaks".
MARGIN = 0.05
#: The minimum recall effect: accuracy above the window-of-L control on the same answers.
REACH = 0.25
#: The experiments of the recall preset (their propositions form the recall family).
RECALL_EXPERIMENTS = ("recall", "recall_answers", "recall_curve", "needle_grid")


@dataclasses.dataclass(frozen=True)
class Proposition:
    """A claim, the per-seed statistic that tests it, the rule's kind and its threshold."""

    name: str
    claim: str
    statistic: str
    # (results, seed) -> that seed's statistic (kind "rate": 1.0 if the seed passes,
    # else 0.0), or None to leave the seed out; a KeyError means no rows for that seed
    compute: Callable[[dict, int], float | None]
    threshold: float = 0.0
    stated: str | None = None
    kind: str = "effect"
    margin: float | None = None
    # the experiments whose rows it reads
    experiments: tuple[str, ...] = ()

    @property
    def preset(self) -> str:
        """``"recall"`` for a proposition on the recall preset's rows, else ``"full"``."""
        return "recall" if set(self.experiments) & set(RECALL_EXPERIMENTS) else "full"


# ------------------------------------------------------------------ lookups (per seed)


def _row(rows, seed, **keys):
    for r in rows:
        if r.get("seed", seed) == seed and all(r.get(k) == v for k, v in keys.items()):
            return r
    raise KeyError(f"no row with seed={seed} and {keys}")


def _excess(res, seed, scheme, factor):
    return _row(res["extrapolation"], seed, scheme=scheme, factor=factor)["excess"]


def _rope(res, seed, method, finetuned, factor, experiment="rope_scaling"):
    return _row(res[experiment], seed, method=method, finetuned=finetuned, factor=factor)["excess"]


def _curse(res, seed, scheme):
    rows = [r for r in res["early_tokens"] if r.get("seed", seed) == seed]
    if not rows:
        raise KeyError(f"no early_tokens rows with seed={seed}")
    return _row(curse_summary(rows), seed, scheme=scheme)


def _rho(res, seed, scheme):
    """rho of ``scheme``; NaN (so: inconclusive) when its long window gains nothing."""
    rho = _curse(res, seed, scheme)["explained"]
    return math.nan if rho is None else rho


def _passkey(res, seed, scheme):
    rows = [r for r in res["passkey"] if r.get("seed", seed) == seed and r["scheme"] == scheme]
    if not rows:
        raise KeyError(f"no passkey rows with seed={seed} and scheme={scheme}")
    long_len = max(r["length"] for r in rows)
    return [r for r in rows if r["length"] == long_len]


def _L(res):
    return min(r["length"] for r in res["passkey"])  # the passkey's own rows at L


def _growth(res, seed, scheme, factor):
    return _excess(res, seed, scheme, factor) - _excess(res, seed, scheme, 1)


def _top(res):
    return max(r["factor"] for r in res["extrapolation"])


def _sliding(res, seed, scheme, factor, window):
    return _row(res["sliding"], seed, scheme=scheme, factor=factor, window=window)["loss"]


def _base_excess(res, seed, head_dim, method, factor=4, base=None):
    """Excess of the ``rope_base`` row; ``base`` defaults to the smallest (the lab's)."""
    rows = res["rope_base"]
    base = min(r["base"] for r in rows) if base is None else base
    return _row(rows, seed, base=base, head_dim=head_dim, method=method, factor=factor)["excess"]


def _head_dim(res, pick):
    return pick(r["head_dim"] for r in res["rope_base"])


def _base_growth(res, seed, head_dim, base=None):
    return _base_excess(res, seed, head_dim, "none", 4, base) - _base_excess(
        res, seed, head_dim, "none", 1, base
    )


def _slope_excess(res, seed, scale, factor):
    return _row(res["alibi_slopes"], seed, scale=scale, factor=factor)["excess"]


def _mean(xs):
    xs = list(xs)
    return math.fsum(xs) / len(xs)


def _band(res, seed, scheme, factor, band, attention):
    return _row(res["recall"], seed, scheme=scheme, factor=factor, band=band, attention=attention)[
        "accuracy"
    ]


def _reach(scheme, band, factor):
    """1.0 when the seed's model recalls the band at context ``factor L`` at least
    :data:`REACH` better than the same model with attention limited to its last L keys."""

    def compute(res, seed):
        full = _band(res, seed, scheme, factor, band, "full")
        window = _band(res, seed, scheme, factor, band, "window")
        return 1.0 if full - window >= REACH else 0.0

    return compute


def _learns(scheme):
    def compute(res, seed):
        row = _row(res["recall"], seed, scheme=scheme, factor=0)
        if "accuracy_round1" not in row:  # the discovery runs' recall: another budget
            raise KeyError(f"no in-view rows by query round with seed={seed}")
        return float(row["learned"] == 1.0)

    return compute


# ------------------------------------------------------------------ the propositions

_E = ("extrapolation",)
_P = Proposition

PROPOSITIONS = (
    # -- train short, test long
    _P(
        "sinusoidal-breaks",
        "The sinusoidal table loses more than 0.1 nats against the floor from L to 4L.",
        "e_sin(4L) - e_sin(L)",
        lambda r, s: _growth(r, s, "sinusoidal", 4),
        0.1,
        "holds",
        experiments=_E,
    ),
    _P(
        "learned-breaks",
        "The learned table (rows past L untrained) loses more than 0.1 nats from L to 4L.",
        "e_learned(4L) - e_learned(L)",
        lambda r, s: _growth(r, s, "learned", 4),
        0.1,
        "holds",
        experiments=_E,
    ),
    _P(
        "rope-breaks",
        "Plain RoPE (base 100) loses more than 0.1 nats from L to 4L.",
        "e_rope(4L) - e_rope(L)",
        lambda r, s: _growth(r, s, "rope", 4),
        0.1,
        "holds",
        experiments=_E,
    ),
    _P(
        "alibi-breaks",
        "ALiBi loses more than 0.1 nats from L to 4L.",
        "e_alibi(4L) - e_alibi(L)",
        lambda r, s: _growth(r, s, "alibi", 4),
        0.1,
        experiments=_E,
    ),
    *(
        _P(
            f"{s_}-breaks",
            f"{s_} loses more than 0.1 nats from L to 4L.",
            f"e_{s_}(4L) - e_{s_}(L)",
            lambda r, s, s_=s_: _growth(r, s, s_, 4),
            0.1,
            experiments=_E,
        )
        for s_ in ("none", "t5", "xpos", "kerple", "shaw", "transformer_xl", "da", "fire", "cope")
    ),
    _P(
        "alibi-vs-sinusoidal",
        "Over the longest extrapolation ALiBi's excess grows at least 0.1 nats less than "
        "the sinusoidal table's.",
        "Delta_sin - Delta_alibi, Delta = e(16L) - e(L)",
        lambda r, s: _growth(r, s, "sinusoidal", _top(r)) - _growth(r, s, "alibi", _top(r)),
        0.1,
        "holds",
        experiments=_E,
    ),
    _P(
        "alibi-rope-same-4L",
        f"At 4L ALiBi's excess and RoPE's differ by less than {MARGIN} nats.",
        "e_alibi(4L) - e_rope(4L)",
        lambda r, s: _excess(r, s, "alibi", 4) - _excess(r, s, "rope", 4),
        0.0,
        "holds",
        kind="equivalence",
        margin=MARGIN,
        experiments=_E,
    ),
    _P(
        "alibi-beats-rope-16L",
        "At 16L ALiBi's excess is below RoPE's.",
        "e_rope(16L) - e_alibi(16L)",
        lambda r, s: _excess(r, s, "rope", _top(r)) - _excess(r, s, "alibi", _top(r)),
        0.0,
        "holds",
        experiments=_E,
    ),
    _P(
        "alibi-loss-falls",
        "ALiBi's loss at the longest length is below its loss at L.",
        "l_alibi(L) - l_alibi(16L)",
        lambda r, s: (
            _row(r["extrapolation"], s, scheme="alibi", factor=1)["loss"]
            - _row(r["extrapolation"], s, scheme="alibi", factor=_top(r))["loss"]
        ),
        0.0,
        "holds",
        experiments=_E,
    ),
    # -- stretching RoPE, at the lab's budget (300 steps) and at 1200 steps
    *(
        p
        for exp, tag in (("rope_scaling", ""), ("rope_budget", "-1200"))
        for p in (
            _P(
                f"pi-helps{tag}",
                "Position interpolation at test time lowers plain RoPE's excess at the longest "
                f"length{' (RoPE trained 1200 steps)' if tag else ''}.",
                "e_none(16L) - e_pi(16L), no fine-tune",
                lambda r, s, e=exp: (
                    _rope(r, s, "none", False, _top(r), e) - _rope(r, s, "pi", False, _top(r), e)
                ),
                0.0,
                None if tag else "fails",
                experiments=(exp,),
            ),
            _P(
                f"ntk-helps{tag}",
                "NTK-aware scaling at test time lowers plain RoPE's excess at the longest "
                f"length{' (RoPE trained 1200 steps)' if tag else ''}.",
                "e_none(16L) - e_ntk(16L), no fine-tune",
                lambda r, s, e=exp: (
                    _rope(r, s, "none", False, _top(r), e) - _rope(r, s, "ntk", False, _top(r), e)
                ),
                0.0,
                None if tag else "holds",
                experiments=(exp,),
            ),
            _P(
                f"yarn-beats-ntk{tag}",
                "YaRN beats NTK-aware scaling at 4L without fine-tuning (the YaRN paper's "
                f"order){' (RoPE trained 1200 steps)' if tag else ''}.",
                "e_ntk(4L) - e_yarn(4L), no fine-tune",
                lambda r, s, e=exp: (
                    _rope(r, s, "ntk", False, 4, e) - _rope(r, s, "yarn", False, 4, e)
                ),
                0.0,
                None if tag else "fails",
                experiments=(exp,),
            ),
            _P(
                f"finetune-helps{tag}",
                "A short fine-tune at 4L with PI lowers PI's excess at 4L"
                f"{' (RoPE trained 1200 steps)' if tag else ''}.",
                "e_pi(4L) - e_pi,ft(4L)",
                lambda r, s, e=exp: _rope(r, s, "pi", False, 4, e) - _rope(r, s, "pi", True, 4, e),
                0.0,
                None if tag else "holds",
                experiments=(exp,),
            ),
            _P(
                f"scaling-beyond-finetune{tag}",
                "With the same fine-tune, PI beats plain RoPE fine-tuned at 4L (the control)"
                f"{' (RoPE trained 1200 steps)' if tag else ''}.",
                "e_none,ft(4L) - e_pi,ft(4L)",
                lambda r, s, e=exp: _rope(r, s, "none", True, 4, e) - _rope(r, s, "pi", True, 4, e),
                0.0,
                None if tag else "fails",
                experiments=(exp,),
            ),
        )
    ),
    _P(
        "budget-lowers-rope-excess",
        "RoPE trained 1200 steps has a lower excess at L than trained 300 steps.",
        "e_300(L) - e_1200(L), plain RoPE",
        lambda r, s: _rope(r, s, "none", False, 1) - _rope(r, s, "none", False, 1, "rope_budget"),
        0.0,
        experiments=("rope_scaling", "rope_budget"),
    ),
    # -- the early-token curse
    _P(
        "alibi-long-window-gain",
        "For ALiBi, fresh 4L windows score better per token than fresh L windows.",
        "l_short - l_long (ALiBi)",
        lambda r, s: _curse(r, s, "alibi")["gain"],
        0.0,
        "holds",
        experiments=("early_tokens",),
    ),
    _P(
        "curse-explains-most",
        "Most (rho > 0.5) of ALiBi's long-window gain is the early-token curse.",
        "rho_alibi",
        lambda r, s: _rho(r, s, "alibi"),
        0.5,
        "holds",
        experiments=("early_tokens",),
    ),
    _P(
        "alibi-rho-above-floor",
        "ALiBi owes more of its gain to the curse than an ideal model would.",
        "rho_alibi - rho_floor",
        lambda r, s: _rho(r, s, "alibi") - _rho(r, s, "floor"),
        0.0,
        "holds",
        experiments=("early_tokens",),
    ),
    _P(
        "sinusoidal-long-window-worse",
        "For the sinusoidal table, 4L windows score worse than L windows.",
        "l_long - l_short (sinusoidal)",
        lambda r, s: -_curse(r, s, "sinusoidal")["gain"],
        0.0,
        experiments=("early_tokens",),
    ),
    # -- the passkey (accuracies: each seed passes or not)
    _P(
        "rope-cannot-retrieve-far",
        "In inputs of 8L, RoPE retrieves a value 2L or more back with accuracy below 0.5, "
        "on most seeds.",
        "seed passes: mean accuracy of RoPE over the bands >= 2L < 0.5",
        lambda r, s: float(
            _mean(x["accuracy"] for x in _passkey(r, s, "rope") if x["lo"] >= 2 * _L(r)) < 0.5
        ),
        0.5,
        "holds",
        kind="rate",
        experiments=("passkey",),
    ),
    _P(
        "alibi-retrieves-far",
        "In inputs of 8L, ALiBi retrieves at every distance band with accuracy above 0.9, "
        "on most seeds.",
        "seed passes: min accuracy of ALiBi over the bands > 0.9",
        lambda r, s: float(min(x["accuracy"] for x in _passkey(r, s, "alibi")) > 0.9),
        0.5,
        "holds",
        kind="rate",
        experiments=("passkey",),
    ),
    # -- injection
    _P(
        "every-layer-injection",
        "Adding the sinusoidal table in every layer lowers the excess at L "
        "(the input-only variant minus the every-layer one).",
        "e_input(L) - e_every(L), sinusoidal",
        lambda r, s: (
            _row(r["injection"], s, scheme="sinusoidal", inject="input", factor=1)["excess"]
            - _row(r["injection"], s, scheme="sinusoidal", inject="every", factor=1)["excess"]
        ),
        0.0,
        experiments=("injection",),
    ),
    _P(
        "every-layer-injection-same",
        f"Adding the sinusoidal table in every layer changes the excess at L by less than "
        f"{MARGIN} nats.",
        "e_input(L) - e_every(L), sinusoidal",
        lambda r, s: (
            _row(r["injection"], s, scheme="sinusoidal", inject="input", factor=1)["excess"]
            - _row(r["injection"], s, scheme="sinusoidal", inject="every", factor=1)["excess"]
        ),
        0.0,
        "holds",
        kind="equivalence",
        margin=MARGIN,
        experiments=("injection",),
    ),
    # -- sliding windows
    _P(
        "sliding-helps-at-L",
        "With windows of L, a sliding window (every token with at least 3L/4 of context) "
        "scores ALiBi better than non-overlapping windows on the same tokens.",
        "l_nonoverlapping(L) - l_sliding(L), ALiBi",
        lambda r, s: (
            _sliding(r, s, "alibi", 1, "nonoverlapping") - _sliding(r, s, "alibi", 1, "sliding")
        ),
        0.0,
        "holds",
        experiments=("sliding",),
    ),
    _P(
        "sliding-hurts-rope-far",
        "With windows of 16L, RoPE scores the same tokens worse with a sliding window "
        "(every token with at least 12L of context) than with non-overlapping windows.",
        "l_sliding(16L) - l_nonoverlapping(16L), RoPE",
        lambda r, s: (
            _sliding(r, s, "rope", _top(r), "sliding")
            - _sliding(r, s, "rope", _top(r), "nonoverlapping")
        ),
        0.0,
        "holds",
        experiments=("sliding", "extrapolation"),
    ),
    _P(
        "sliding-alibi-far",
        "With windows of 16L, ALiBi scores the same tokens better with a sliding window "
        "than with non-overlapping windows (more context helps it, a little).",
        "l_nonoverlapping(16L) - l_sliding(16L), ALiBi",
        lambda r, s: (
            _sliding(r, s, "alibi", _top(r), "nonoverlapping")
            - _sliding(r, s, "alibi", _top(r), "sliding")
        ),
        0.0,
        "holds",
        experiments=("sliding", "extrapolation"),
    ),
    # -- the RoPE base, the head dimension, YaRN
    _P(
        "ntk-beats-yarn-narrow-head",
        "At the lab's RoPE (base 100, head_dim 16) NTK-aware scaling beats YaRN at 4L "
        "without fine-tuning.",
        "e_yarn(4L) - e_ntk(4L), head_dim 16",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, min), "yarn")
            - _base_excess(r, s, _head_dim(r, min), "ntk")
        ),
        0.0,
        "holds",
        experiments=("rope_base",),
    ),
    _P(
        "wide-head-yarn-beats-ntk",
        "With one head of dimension 64 (base 100), YaRN beats NTK-aware scaling at 4L "
        "(the YaRN paper's order).",
        "e_ntk(4L) - e_yarn(4L), head_dim 64",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, max), "ntk")
            - _base_excess(r, s, _head_dim(r, max), "yarn")
        ),
        0.0,
        experiments=("rope_base",),
    ),
    _P(
        "wide-head-yarn-ntk-same",
        f"With one head of dimension 64 (base 100), YaRN and NTK-aware scaling differ at 4L "
        f"by less than {MARGIN} nats.",
        "e_ntk(4L) - e_yarn(4L), head_dim 64",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, max), "ntk")
            - _base_excess(r, s, _head_dim(r, max), "yarn")
        ),
        0.0,
        "holds",
        kind="equivalence",
        margin=MARGIN,
        experiments=("rope_base",),
    ),
    _P(
        "large-base-yarn-beats-ntk",
        "At base 10^4 (head_dim 16), YaRN beats NTK-aware scaling at 4L.",
        "e_ntk(4L) - e_yarn(4L), base 10^4",
        lambda r, s: (
            _base_excess(r, s, _head_dim(r, min), "ntk", base=10000.0)
            - _base_excess(r, s, _head_dim(r, min), "yarn", base=10000.0)
        ),
        0.0,
        "fails",
        experiments=("rope_base",),
    ),
    _P(
        "large-base-breaks-less",
        "Plain RoPE at base 10^4 grows less from L to 4L than at base 100.",
        "Delta_4L(base 100) - Delta_4L(base 10^4), head_dim 16",
        lambda r, s: (
            _base_growth(r, s, _head_dim(r, min)) - _base_growth(r, s, _head_dim(r, min), 10000.0)
        ),
        0.0,
        experiments=("rope_base",),
    ),
    _P(
        "large-base-breaks-same",
        f"Plain RoPE (head_dim 16) grows from L to 4L by the same, within {MARGIN} nats, at "
        "base 10^4 as at base 100.",
        "Delta_4L(base 100) - Delta_4L(base 10^4), head_dim 16",
        lambda r, s: (
            _base_growth(r, s, _head_dim(r, min)) - _base_growth(r, s, _head_dim(r, min), 10000.0)
        ),
        0.0,
        "holds",
        kind="equivalence",
        margin=MARGIN,
        experiments=("rope_base",),
    ),
    _P(
        "unseen-pairs-predict-breaking",
        "With one head of dimension 64, RoPE at base 10^4 (26 of 32 pairs meet unseen angles "
        "at 4L) grows more from L to 4L than at base 100 (20 pairs).",
        "Delta_4L(base 10^4) - Delta_4L(base 100), head_dim 64",
        lambda r, s: (
            _base_growth(r, s, _head_dim(r, max), 10000.0) - _base_growth(r, s, _head_dim(r, max))
        ),
        0.0,
        "fails",
        experiments=("rope_base",),
    ),
    # -- ALiBi's slopes
    _P(
        "gentle-alibi-slopes-worse",
        "ALiBi with every slope divided by 4 has a larger excess at 16L than the paper's slopes.",
        "e_(1/4)(16L) - e_1(16L)",
        lambda r, s: _slope_excess(r, s, 0.25, _top(r)) - _slope_excess(r, s, 1.0, _top(r)),
        0.0,
        "holds",
        experiments=("alibi_slopes", "extrapolation"),
    ),
    _P(
        "steep-alibi-slopes-worse",
        "ALiBi with every slope multiplied by 4 has a larger excess at 16L than the paper's "
        "slopes.",
        "e_4(16L) - e_1(16L)",
        lambda r, s: _slope_excess(r, s, 4.0, _top(r)) - _slope_excess(r, s, 1.0, _top(r)),
        0.0,
        experiments=("alibi_slopes", "extrapolation"),
    ),
    *(
        _P(
            f"alibi-slopes-x{scale:g}-same",
            f"ALiBi with every slope multiplied by {scale:g} has an excess at 16L within "
            f"{MARGIN} nats of the paper's slopes.",
            f"e_{scale:g}(16L) - e_1(16L)",
            lambda r, s, k=scale: (
                _slope_excess(r, s, k, _top(r)) - _slope_excess(r, s, 1.0, _top(r))
            ),
            0.0,
            "holds",
            kind="equivalence",
            margin=MARGIN,
            experiments=("alibi_slopes", "extrapolation"),
        )
        for scale in (0.5, 2.0, 4.0)
    ),
)

#: The schemes with stated recall claims (the recall runs of seeds 10-14 train these).
RECALL_STATED_SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "xpos",
                         "kerple")  # fmt: skip
_RECALL_SCHEMES = RECALL_STATED_SCHEMES + ("shaw", "transformer_xl", "da", "fire", "cope")
# (scheme, band, context factor) -> stated verdict; every other reach proposition is reported
_REACH_STATED = {
    ("alibi", "L-2L", 2): "holds", ("alibi", "L-2L", 8): "holds",
    ("alibi", "4L-8L", 8): "holds",
    ("kerple", "L-2L", 2): "holds", ("kerple", "L-2L", 8): "holds",
    ("kerple", "4L-8L", 8): "holds",
    ("xpos", "L-2L", 2): "holds", ("xpos", "L-2L", 8): "holds",
    ("t5", "L-2L", 2): "holds", ("t5", "L-2L", 8): "fails",
    ("none", "L-2L", 2): "holds", ("none", "L-2L", 8): "fails",
    ("sinusoidal", "L-2L", 8): "fails", ("learned", "L-2L", 8): "fails",
    ("rope:ntk", "L-2L", 8): "holds", ("rope:yarn", "L-2L", 8): "holds",
    ("rope:llama3", "L-2L", 8): "holds",
}  # fmt: skip
_RECALL = ("recall",)

PROPOSITIONS += tuple(
    _P(
        f"learns-{s_}",
        f"{s_} learns the recall task in the recall budget (in-view accuracy above 0.77) on "
        "most seeds.",
        "seed passes: in-view accuracy > learned_threshold (0.77)",
        _learns(s_),
        0.5,
        "holds" if s_ in RECALL_STATED_SCHEMES else None,
        kind="rate",
        experiments=_RECALL,
    )
    for s_ in _RECALL_SCHEMES
)
PROPOSITIONS += tuple(
    _P(
        f"reach-{s_}-{band}-at-{f}L",
        f"{s_} recalls keys {band.replace('-', ' to ')} back, shown {f}L tokens, at least "
        f"{REACH} better than the same model with attention limited to its last L keys, on "
        "most seeds.",
        f"seed passes: accuracy(full) - accuracy(window of L) >= {REACH}, band {band}, "
        f"context {f}L",
        _reach(s_, band, f),
        0.5,
        _REACH_STATED.get((s_, band, f)),
        kind="rate",
        experiments=_RECALL,
    )
    for s_ in _RECALL_SCHEMES + ("rope:ntk", "rope:yarn", "rope:llama3", "rope:pi")
    for band, f in (("L-2L", 2), ("L-2L", 8), ("4L-8L", 8))
    if not (s_.startswith("rope:") and f == 2)
)


# ------------------------------------------------------------------ the rules


def frozen_hash() -> str:
    """SHA-256 of this file (the frozen propositions, thresholds, stated verdicts and rules)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _decide(p: Proposition, values: list[float]) -> dict:
    """The raw verdict of ``p`` for its per-seed ``values``, by the rule of its kind."""
    out = {"mean": math.nan, "lo": math.nan, "hi": math.nan, "level": 0.95, "p": 1.0}
    n = len(values)
    if n == 0:
        return {**out, "verdict": "no rows"}
    if p.kind == "rate":
        k = int(round(math.fsum(values)))
        lo, hi = clopper_pearson(k, n)
        above, below = binomial_tail(k, n, p.threshold)
        p_holds, p_fails = min(1.0, 2 * above), min(1.0, 2 * below)
        verdict = "holds" if lo > p.threshold else "fails" if hi < p.threshold else "inconclusive"
        return {**out, "mean": k / n, "lo": lo, "hi": hi, "k": k, "verdict": verdict,
                "p": min(p_holds, p_fails)}  # fmt: skip
    if any(math.isnan(v) for v in values):
        return {**out, "verdict": "inconclusive", "note": "undefined on a seed"}
    mean, lo, hi = t_interval(values, 0.95, exact=True)
    spread = n > 1 and max(values) > min(values)
    if not spread:
        note = "fewer than 2 seeds" if n < 2 else "no spread over seeds"
        return {**out, "mean": mean, "verdict": "inconclusive", "note": note}
    if p.kind == "effect":
        above, below = t_test(values, p.threshold)
        verdict = "holds" if lo > p.threshold else "fails" if hi < p.threshold else "inconclusive"
        return {**out, "mean": mean, "lo": lo, "hi": hi, "verdict": verdict,
                "p": min(1.0, 2 * min(above, below))}  # fmt: skip
    if p.kind == "equivalence":
        low, high = p.threshold - p.margin, p.threshold + p.margin
        _, lo90, hi90 = t_interval(values, 0.90, exact=True)
        p_tost = max(t_test(values, low)[0], t_test(values, high)[1])
        p_beyond = min(1.0, 2 * min(t_test(values, high)[0], t_test(values, low)[1]))
        if low < lo90 and hi90 < high:
            verdict = "holds"
        elif lo > high or hi < low:
            verdict = "fails"
        else:
            verdict = "inconclusive"
        return {**out, "mean": mean, "lo": lo90, "hi": hi90, "level": 0.90, "verdict": verdict,
                "p": min(p_tost, p_beyond)}  # fmt: skip
    raise ValueError(f"kind must be 'effect', 'equivalence' or 'rate', got {p.kind!r}")


def check(results: dict, propositions=PROPOSITIONS) -> list[dict]:
    """One verdict per proposition for ``results`` (a :func:`run_all` output or its ``results``).

    A proposition is checked when every experiment it reads has rows in
    ``results``; each seed of ``results`` gives a value, or none when its
    rows for that seed are missing (or, for a recall proposition, when it is
    not about that seed).  Each verdict is a dict: ``name``, ``claim``,
    ``statistic``, ``kind``, ``values`` (one per seed that gave one, in seed
    order), ``seeds`` (how many), ``mean``, ``lo``, ``hi`` (the interval of
    the rule: 95% t, 90% t for an equivalence, 95% Clopper-Pearson for a
    rate, whose ``mean`` is ``k / n``), ``level``, ``threshold``, ``margin``,
    ``verdict`` (``"holds"``, ``"fails"``, ``"inconclusive"``, or ``"no
    rows"`` when no seed gave a value), ``p``, and after Holm's correction
    within the ``family`` (``"<preset>, stated"`` or ``"<preset>,
    reported"``): ``p_holm`` and ``verdict_holm``; ``stated``.
    """
    res = results.get("results", results)
    seeds = sorted({r["seed"] for rows in res.values() for r in rows if "seed" in r}) or [None]
    out = []
    for p in propositions:
        if not all(res.get(e) for e in p.experiments):
            continue
        values = []
        for s in seeds:
            try:
                v = p.compute(res, s)
            except KeyError:
                continue
            if v is not None:
                values.append(round(float(v), 4))
        decided = _decide(p, values)
        out.append({
            "name": p.name, "claim": p.claim, "statistic": p.statistic, "kind": p.kind,
            "values": values, "seeds": len(values), **decided,
            "mean": round(decided["mean"], 4), "lo": round(decided["lo"], 4),
            "hi": round(decided["hi"], 4), "threshold": p.threshold, "margin": p.margin,
            "p": round(decided["p"], 6), "stated": p.stated,
            "family": f"{p.preset}, {'stated' if p.stated else 'reported'}",
        })  # fmt: skip
    families: dict = {}
    for v in out:
        if v["verdict"] != "no rows":
            families.setdefault(v["family"], []).append(v)
    for members in families.values():
        for v, adjusted in zip(members, holm([v["p"] for v in members]), strict=True):
            v["p_holm"] = round(adjusted, 6)
            keep = v["verdict"] in ("holds", "fails") and adjusted < ALPHA
            v["verdict_holm"] = v["verdict"] if keep else "inconclusive"
    for v in out:
        v.setdefault("p_holm", None)
        v.setdefault("verdict_holm", v["verdict"])
    return out


def failures(verdicts: list[dict]) -> list[dict]:
    """The verdicts of stated propositions whose (raw) verdict is not the stated one."""
    return [v for v in verdicts if v["stated"] is not None and v["verdict"] != v["stated"]]


def _interval(v: dict) -> str:
    if v["verdict"] == "no rows":
        return "no rows"
    if v["kind"] == "rate":
        return f"{v['k']} of {v['seeds']} seeds [{v['lo']:.2f}, {v['hi']:.2f}]"
    if v["lo"] != v["lo"]:  # NaN: no interval
        return f"mean {v['mean']:+.3f} ({v.get('note', 'no interval')})"
    level = "90%" if v["kind"] == "equivalence" else "95%"
    return f"mean {v['mean']:+.3f} {level} [{v['lo']:+.3f}, {v['hi']:+.3f}]"


def format_verdicts(verdicts: list[dict]) -> str:
    """A plain-text table of verdicts, one line each: raw verdict, after Holm, name, interval."""
    lines = []
    for v in verdicts:
        bar = (f"within +-{v['margin']:g}" if v["kind"] == "equivalence"
               else f"vs {v['threshold']:g}")  # fmt: skip
        stated = f"  (stated: {v['stated']})" if v["stated"] else ""
        lines.append(
            f"{v['verdict']:>12s} {v['verdict_holm']:>12s}  {v['name']:34s} {_interval(v)} "
            f"{bar}{stated}"
        )
    return "\n".join(lines)
