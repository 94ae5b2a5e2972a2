"""The fourth freeze: the recall study under one recipe, read as continuous gains.

This file is frozen like posenc/lab/propositions.py, warmup_propositions.py and
fflm_propositions.py: it is committed before any run of the seeds that test it, and the
chapter prints its SHA-256 (:func:`frozen_hash`).  Not a byte of it may change after
that commit.  (Issue 35 calls it the recall study's "third freeze"; it is the lab's fourth
frozen file, since the flip-flop table froze in between.)

**Why.**  The first freeze trained the rotary models with a 150-step warmup and the
second restored 450 for RoPE and xPos only, so the stated recall claims compared
schemes trained differently; each seed was turned into a pass or a fail at a 0.25 margin
and read as "recalls" or "does not"; the window-of-L control (the trained model with
its attention masked) saw the value of a key exactly ``L`` back; and the far keys at 8L
sat near the input's start.  Here every scheme trains with one recipe, each claim is a
continuous gain with an interval and an exact Wilcoxon test, the bands start at
``L + 1``, and the control is a model *trained* with the window.

**The recipe** (preset ``recall-recipe``, ``posenc.lab.PRESETS["recall-recipe"]``): the
recall preset's model and task (2 layers, width 64, 4 heads, ``L`` = 32, 4 pairs, 9,000
steps, batch 32) with the **450-step warmup** of ``recall-warmup`` for all 13 schemes of
:data:`SCHEMES` (with 150 steps 1 of 20 rotary models learned; with 450, 32 of 32).
Beside each model of :data:`CONTROL_SCHEMES` (the eight schemes with stated recall
claims) a **trained window-of-L control**: the same initialisation and the same recall
batches, its attention limited to its last ``L`` keys throughout training, each batch
moved by ``n`` filler tokens, ``n`` uniform on ``0 .. L`` (``recall_control_lead = 1``;
:class:`posenc.lab.tasks.LeadRecallTask`), so the window binds where the pairs lie far
back, and the control meets positions up to ``2L``.  (Trained at ``L`` tokens with a
window of ``L`` it would be the full model: at ``L`` tokens that mask hides nothing.)
The masked full model is kept as a second, labelled reference (``attention =
"window"``).  The far bands at 8L are also scored with ``8L`` fillers before the same
inputs (``recall_lead = 8``), and RoPE's needle grid with each scaling
(``needle_scalings``).

**The statistic** of a gain proposition, per seed: the accuracy of the full model minus
that of the trained control on the same answers of one band at one context, counting
only answers whose key lies at least ``L + 1`` tokens back (the stored distance of each
answer, ``recall_answers``).  For ``rope:<method>`` both models are scaled alike.

**The rules** (``ALPHA`` = 0.05; :data:`SESOI` = 0.05, the smallest gain in accuracy of
interest, ``posenc.lab.gains.SESOI_ACCURACY``):

* ``kind="gain"``: the 95% Student-t interval of the mean gain over seeds, and the exact
  two-sided Wilcoxon signed-rank test of the gains minus ``SESOI``
  (:func:`posenc.lab.gains.wilcoxon_exact`).  **holds** (recalls beyond the control by
  more than ``SESOI``) when the interval lies above ``SESOI`` and the Wilcoxon p is
  below ``ALPHA`` with its ranks on the same side; **fails** (no gain of interest) when
  the interval lies below ``SESOI`` and the Wilcoxon test agrees in the same way;
  otherwise **inconclusive** (also when the two tests disagree, or with no spread).
  ``p`` is the two-sided t-test against ``SESOI`` (its exact Wilcoxon twin is
  ``p_wilcoxon``; with 10 seeds that one cannot fall below 2/1024, so Holm over this
  family runs on the t p-value).
* ``kind="rate"`` (``learns-*`` only): the first freeze's rate rule, unchanged.

**Multiplicity.**  One family per preset: every proposition of ``recall-recipe``,
stated and reported together (Holm over all of them); the same for ``lm-budget``.  Holm
holds each family's chance of any false verdict after correction to ``ALPHA``; over the
lab's families together it is at most ``ALPHA`` times their number (Bonferroni over
families).

**Stated verdicts**, set mechanically before this file was committed from the stored
runs closest to this recipe, with the gain rule above applied to the *masked* control
(the only one stored) and bands from ``L + 1``: for ``rope``, ``xpos`` and
``rope:<method>`` the 450-step runs (``recall-warmup.json`` seeds 5-10 and
``recall-warmup-confirmation.json`` seeds 15-24, 16 seeds); for the other schemes
``recall-confirmation.json`` (seeds 5-14, 150-step warmup: this freeze states that the
warmup does not change their verdicts).  The verdict found there is stated ("holds" or
"fails"); an inconclusive one is reported (``None``).  ``learns-*``: stated "holds"
where every stored seed learned, "fails" where none did, else reported.  Every gain
against the masked control (``*-masked``), for all 13 schemes, is reported.

**Language models** (preset ``lm-budget``): the eight schemes' language models of the
``full`` preset at 300 steps, at 1,200 steps (``lm_long_steps``) and at 300 steps with
a third of the peak learning rate (``lm_lr_scales = (1/3,)``), each from the same
initialisation and data (experiment ``lm_budget``).  The first freeze's length
propositions about these schemes are read on each: at 300 steps with the first
freeze's stated verdicts (a fresh replication on new seeds), at 1,200 steps and at the
lower rate reported (:func:`budget_view` puts those models' rows in place of the
``extrapolation`` rows).

**Seeds** 25-34 for both presets; no stored lab run has used them.  **The runs after
the freeze** (each ``python -m posenc.lab --threads 1 --no-plots --split confirmation``,
one seed ``S`` per process, two processes at a time, the parts joined with
``--merge``)::

    --preset lm-budget --seeds S
    --preset recall-recipe --seeds S --schemes none,sinusoidal,learned,rope,alibi,t5,xpos,kerple
    --preset recall-recipe --seeds S --schemes shaw,transformer_xl,da,fire,cope

then ``python -m posenc.lab --check DIR --preset recall-recipe --split confirmation`` (and
``--preset lm-budget``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from . import propositions as _first
from .gains import wilcoxon_exact
from .stats import holm, t_interval, t_test

__all__ = ["PROPOSITIONS", "RecipeProposition", "budget_view", "check", "frozen_hash"]

PRESET = "recall-recipe"
LM_PRESET = "lm-budget"
ALPHA = 0.05
#: The smallest gain in accuracy of interest (a proportion of answers).
SESOI = 0.05
#: The seeds that test both presets.
SEEDS = tuple(range(25, 35))
#: Every scheme of the registry that the recall preset trains.
SCHEMES = ("none", "sinusoidal", "learned", "rope", "alibi", "t5", "xpos", "kerple",
           "shaw", "transformer_xl", "da", "fire", "cope")  # fmt: skip
#: The schemes with stated recall claims, each with a trained window-of-L control.
CONTROL_SCHEMES = SCHEMES[:8]
#: (band, context factor) of every gain: keys L+1 to 2L back at 2L and 8L, 4L to 8L at 8L.
CELLS = (("L-2L", 2), ("L-2L", 8), ("4L-8L", 8))
ROPE_SCALED = ("rope:ntk", "rope:yarn", "rope:llama3", "rope:pi")
#: The peak learning rate's scale of the lm-budget preset's variant.
LR_SCALE = 1 / 3

# (scheme, band, factor) -> stated verdict of the gain over the trained control; every
# other gain is reported.  From the stored runs by the rule of the docstring; the mean
# masked gain and its 95% interval there are in each comment.
STATED_GAINS: dict[tuple[str, str, int], str | None] = {
    ("none", "L-2L", 2): "holds",  # +0.911 [+0.899, +0.923]
    ("none", "L-2L", 8): "fails",  # +0.024 [+0.012, +0.035]
    ("none", "4L-8L", 8): "holds",  # +0.582 [+0.547, +0.616]
    ("sinusoidal", "L-2L", 2): "holds",  # +0.779 [+0.739, +0.819]
    ("sinusoidal", "L-2L", 8): "fails",  # +0.017 [+0.001, +0.032]
    ("sinusoidal", "4L-8L", 8): "holds",  # +0.141 [+0.115, +0.168]
    ("learned", "L-2L", 2): "holds",  # +0.658 [+0.538, +0.778]
    ("learned", "L-2L", 8): "fails",  # +0.006 [-0.013, +0.024]
    ("learned", "4L-8L", 8): "holds",  # +0.108 [+0.087, +0.129]
    ("rope", "L-2L", 2): "holds",  # +0.197 [+0.141, +0.254], 16 seeds
    ("rope", "L-2L", 8): "holds",  # +0.116 [+0.077, +0.155]
    ("rope", "4L-8L", 8): "fails",  # +0.018 [+0.007, +0.028]
    ("alibi", "L-2L", 2): "holds",  # +0.943 [+0.932, +0.953]
    ("alibi", "L-2L", 8): "holds",  # +0.939 [+0.927, +0.951]
    ("alibi", "4L-8L", 8): "holds",  # +0.940 [+0.928, +0.953]
    ("t5", "L-2L", 2): "holds",  # +0.931 [+0.921, +0.941]
    ("t5", "L-2L", 8): "fails",  # +0.020 [+0.005, +0.034]
    ("t5", "4L-8L", 8): "holds",  # +0.484 [+0.409, +0.560]
    ("xpos", "L-2L", 2): "holds",  # +0.534 [+0.483, +0.584], 16 seeds
    ("xpos", "L-2L", 8): "holds",  # +0.342 [+0.264, +0.420]
    ("xpos", "4L-8L", 8): "holds",  # +0.099 [+0.063, +0.135]
    ("kerple", "L-2L", 2): "holds",  # +0.931 [+0.918, +0.943]
    ("kerple", "L-2L", 8): "holds",  # +0.938 [+0.924, +0.951]
    ("kerple", "4L-8L", 8): "holds",  # +0.943 [+0.927, +0.959]
    ("rope:ntk", "L-2L", 8): "holds",  # +0.925 [+0.909, +0.941], 16 seeds
    ("rope:ntk", "4L-8L", 8): None,  # +0.094 [+0.048, +0.140], Wilcoxon p 0.15
    ("rope:yarn", "L-2L", 8): "holds",  # +0.856 [+0.818, +0.895]
    ("rope:yarn", "4L-8L", 8): "holds",  # +0.378 [+0.304, +0.451]
    ("rope:llama3", "L-2L", 8): "holds",  # +0.868 [+0.831, +0.906]
    ("rope:llama3", "4L-8L", 8): "holds",  # +0.604 [+0.520, +0.688]
    ("rope:pi", "L-2L", 8): "holds",  # +0.151 [+0.128, +0.173]
    ("rope:pi", "4L-8L", 8): "holds",  # +0.097 [+0.075, +0.118]
}
# scheme -> stated verdict of learns-<scheme> (stored seeds that learned)
STATED_LEARNS: dict[str, str | None] = {
    "none": "holds",  # 10 of 10
    "sinusoidal": "holds",  # 10 of 10
    "learned": None,  # 9 of 10
    "rope": "holds",  # 16 of 16 (450-step warmup)
    "alibi": "holds",  # 10 of 10
    "t5": "holds",  # 10 of 10
    "xpos": "holds",  # 16 of 16 (450-step warmup)
    "kerple": "holds",  # 10 of 10
    "shaw": "holds",  # 5 of 5 (seeds 5-9)
    "transformer_xl": None,  # 4 of 5
    "da": None,  # 2 of 5
    "fire": "holds",  # 5 of 5
    "cope": "holds",  # 5 of 5
}

_Results = Mapping[str, Any]


@dataclasses.dataclass(frozen=True)
class RecipeProposition(_first.Proposition):
    """A claim about the rows of one preset of this freeze (``recall-recipe`` or
    ``lm-budget``)."""

    about: str = PRESET

    @property
    def preset(self) -> str:
        """The preset whose rows decide it: Holm's family and ``--check`` go by it."""
        return self.about


def _kept_accuracy(res: _Results, seed: int | None, scheme: str, band: str, factor: int,
                   attention: str) -> float:  # fmt: skip
    """Accuracy of one band row over the answers whose key lies ``L + 1`` or more back."""
    row = _first._row(res["recall"], seed, scheme=scheme, factor=factor, band=band,
                      attention=attention)  # fmt: skip
    answers = _first._row(res["recall_answers"], seed, factor=factor, band=band)["distances"]
    if len(answers) != len(row["hits"]):
        raise ValueError(f"seed {seed}, {band} at {factor}L: hits and distances differ in length")
    start = min(r["length"] for r in res["recall"] if r["factor"] == 0) + 1  # L + 1
    kept = [h == "1" for h, d in zip(row["hits"], answers, strict=True) if d >= start]
    return sum(kept) / len(kept) if kept else math.nan


def _gain(
    scheme: str, band: str, factor: int, control: str
) -> Callable[[_Results, int | None], float]:
    def compute(res: _Results, seed: int | None) -> float:
        full = _kept_accuracy(res, seed, scheme, band, factor, "full")
        return full - _kept_accuracy(res, seed, scheme, band, factor, control)

    return compute


def _gain_proposition(scheme: str, band: str, factor: int, masked: bool) -> RecipeProposition:
    control = "window" if masked else "trained-window"
    what = ("the same model with its attention masked to its last L keys" if masked
            else "a model trained with its attention limited to its last L keys")  # fmt: skip
    return RecipeProposition(
        name=f"gain-{scheme}-{band}-at-{factor}L" + ("-masked" if masked else ""),
        claim=f"{scheme} recalls keys {band.replace('-', ' to ')} back (from L+1), shown "
        f"{factor}L tokens, more than {SESOI} better than {what}.",
        statistic=f"accuracy(full) - accuracy({control}), distances >= L+1, band {band}, "
        f"context {factor}L",
        compute=_gain(scheme, band, factor, control),
        threshold=SESOI,
        stated=None if masked else STATED_GAINS.get((scheme, band, factor)),
        kind="gain",
        experiments=("recall", "recall_answers"),
    )


def _learns(scheme: str) -> RecipeProposition:
    first = next(p for p in _first.PROPOSITIONS if p.name == f"learns-{scheme}")
    fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(first)}
    return RecipeProposition(**{**fields, "stated": STATED_LEARNS.get(scheme)})


def budget_view(results: _Results, *, steps: int | None = None,
                lr_scale: float | None = None) -> dict[str, Any]:  # fmt: skip
    """``results`` with the ``extrapolation`` rows replaced by one budget's ``lm_budget``
    rows: the models trained ``steps`` steps, or those whose peak learning rate is
    ``lr_scale`` times the longest-trained models' (the preset's ``lr``)."""
    res = results.get("results", results)
    rows = res.get("lm_budget", [])
    longest = max((r["steps"] for r in rows), default=None)
    base_lr = next((r["lr"] for r in rows if r["steps"] == longest), math.nan)
    kept = [
        r for r in rows
        if (steps is not None and r["steps"] == steps)
        or (lr_scale is not None and math.isclose(r["lr"], base_lr * lr_scale, rel_tol=1e-9))
    ]  # fmt: skip
    return {**res, "extrapolation": kept}


# the first freeze's length propositions about the eight schemes' language models
_LM_NAMES = ("sinusoidal-breaks", "learned-breaks", "rope-breaks", "alibi-breaks", "none-breaks",
             "t5-breaks", "xpos-breaks", "kerple-breaks", "alibi-vs-sinusoidal",
             "alibi-rope-same-4L", "alibi-beats-rope-16L", "alibi-loss-falls")  # fmt: skip


def _lm(name: str, budget: str) -> RecipeProposition:
    first = next(p for p in _first.PROPOSITIONS if p.name == name)
    fields = {f.name: getattr(first, f.name) for f in dataclasses.fields(first)}
    if budget == "300":
        return RecipeProposition(**{**fields, "name": f"{name}@300"}, about=LM_PRESET)
    steps = 1200 if budget == "1200" else None  # the preset's lm_long_steps
    lr_scale = LR_SCALE if budget == "lr/3" else None

    def compute(res: _Results, seed: int | None) -> float | None:
        return first.compute(budget_view(res, steps=steps, lr_scale=lr_scale), seed)

    return RecipeProposition(
        **{**fields, "name": f"{name}@{budget}", "compute": compute, "stated": None,
           "claim": f"{first.claim} (models trained {budget.replace('lr/3', 'with lr / 3')}"
           f"{' steps' if budget == '1200' else ''})", "experiments": ("lm_budget",)},
        about=LM_PRESET,
    )  # fmt: skip


PROPOSITIONS: tuple[RecipeProposition, ...] = (
    *(_learns(s) for s in SCHEMES),
    *(_gain_proposition(s, b, f, masked=False) for s in CONTROL_SCHEMES for b, f in CELLS),
    *(_gain_proposition(s, b, f, masked=False) for s in ROPE_SCALED for b, f in CELLS if f > 2),
    *(_gain_proposition(s, b, f, masked=True) for s in SCHEMES for b, f in CELLS),
    *(_gain_proposition(s, b, f, masked=True) for s in ROPE_SCALED for b, f in CELLS if f > 2),
    *(_lm(n, budget) for budget in ("300", "1200", "lr/3") for n in _LM_NAMES),
)


def frozen_hash() -> str:
    """SHA-256 of this file (the propositions, their stated verdicts and the rules)."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()


def _rank_side(values: list[float]) -> int:
    """+1 when the positive values' ranks (of ``|value|``, zeros dropped, ties averaged)
    outweigh the negative ones', -1 when less, 0 when equal: the side Wilcoxon's test
    points to."""
    x = sorted((abs(v), v > 0) for v in values if v != 0)
    signed, i = 0.0, 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and x[j + 1][0] == x[i][0]:
            j += 1
        rank = (i + j) / 2 + 1
        signed += sum(rank if positive else -rank for _, positive in x[i : j + 1])
        i = j + 1
    return (signed > 0) - (signed < 0)


def _decide_gain(values: list[float]) -> dict[str, Any]:
    """The gain rule: t-interval against SESOI, and the exact Wilcoxon test agreeing."""
    out = {"mean": math.nan, "lo": math.nan, "hi": math.nan, "level": 0.95, "p": 1.0,
           "p_wilcoxon": 1.0}  # fmt: skip
    if not values:
        return {**out, "verdict": "no rows"}
    if any(math.isnan(v) for v in values):
        return {**out, "verdict": "inconclusive", "note": "undefined on a seed"}
    p_w = wilcoxon_exact([v - SESOI for v in values])
    if len(values) < 2 or max(values) == min(values):
        note = "fewer than 2 seeds" if len(values) < 2 else "no spread over seeds"
        return {**out, "mean": math.fsum(values) / len(values), "p_wilcoxon": p_w,
                "verdict": "inconclusive", "note": note}  # fmt: skip
    mean, lo, hi = t_interval(values, 0.95, exact=True)
    above, below = t_test(values, SESOI)
    side = _rank_side([v - SESOI for v in values])
    verdict = ("holds" if lo > SESOI and p_w < ALPHA and side > 0
               else "fails" if hi < SESOI and p_w < ALPHA and side < 0
               else "inconclusive")  # fmt: skip
    return {**out, "mean": mean, "lo": lo, "hi": hi, "verdict": verdict,
            "p": min(1.0, 2 * min(above, below)), "p_wilcoxon": p_w}  # fmt: skip


def check(
    results: _Results, propositions: Iterable[RecipeProposition] = PROPOSITIONS
) -> list[dict[str, Any]]:
    """One verdict per proposition, as :func:`posenc.lab.propositions.check` gives them,
    with the gain rule for ``kind="gain"`` and Holm over one family per preset."""
    res = results.get("results", results)
    seeds = sorted({r["seed"] for rows in res.values() for r in rows if "seed" in r}) or [None]
    out = []
    for p in propositions:
        if not all(res.get(e) for e in p.experiments):
            continue
        values = []
        for s in seeds:
            try:
                value = p.compute(res, s)
            except KeyError:
                continue
            if value is not None:
                values.append(round(float(value), 4))
        decided = _decide_gain(values) if p.kind == "gain" else _first._decide(p, values)
        out.append({
            "name": p.name, "claim": p.claim, "statistic": p.statistic, "kind": p.kind,
            "values": values, "seeds": len(values), **decided,
            "mean": round(decided["mean"], 4), "lo": round(decided["lo"], 4),
            "hi": round(decided["hi"], 4), "threshold": p.threshold, "margin": p.margin,
            "p": round(decided["p"], 6), "stated": p.stated, "family": p.preset,
        })  # fmt: skip
    families: dict[str, list[dict[str, Any]]] = {}
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
