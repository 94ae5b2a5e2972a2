"""The recall claims read as continuous effects: each seed's gain over its window control.

The frozen recall propositions (:mod:`posenc.lab.propositions`) turn each seed into a
pass or a fail: a seed passes when the model recalls a distance band at least 0.25
better than the same model with its attention limited to its last ``L`` keys. A
claim "holds" when most seeds pass. That reads a margin as a yes/no answer: a model
that beats its control on every seed by 0.1 "fails", and one whose seeds sit just
above and below the margin flips with the noise.

This module reads the same stored rows as the effect they measure:

* the **gain** of a seed is ``accuracy(full) - accuracy(window of L)`` on one band
  at one context, the statistic the propositions threshold;
* over seeds, its mean with a 95% Student-t interval and an **exact Wilcoxon
  signed-rank** test of "no gain" (two-sided; the null distribution enumerates every
  sign assignment of the ranks, ties averaged and zero gains dropped, as Wilcoxon's
  test does);
* the bands can start one token later (``band_start="L+1"``): the window control of
  ``L`` keys masks a key ``L`` back but still sees its value, one token later, so at
  distance ``L`` exactly it answers as if the key were in view. Re-scoring drops those
  answers, using the distance of every stored answer;
* Holm's correction runs over **one family per preset**: every gain of that preset's
  results, whatever the freeze stated about it.

:data:`SESOI_ACCURACY` and :data:`SESOI_LOSS` are the smallest effects of interest
the book applies everywhere: an effect inside ``±`` them is "no practical
difference" (by TOST), one outside "departs".
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .stats import holm, t_interval, t_test

__all__ = [
    "SESOI_ACCURACY",
    "SESOI_LOSS",
    "lead_effects",
    "moved",
    "recall_gains",
    "wilcoxon_exact",
]

#: The smallest difference in accuracy (a proportion of answers) the book treats as
#: real: 0.05, five answers in a hundred.  Defined, not measured.
SESOI_ACCURACY = 0.05
#: The smallest difference in loss the book treats as real, in nats per token: the
#: equivalence margin the first freeze fixed for its TOST claims (propositions.MARGIN).
SESOI_LOSS = 0.05


def wilcoxon_exact(values: Sequence[float]) -> float:
    """Two-sided exact p-value of Wilcoxon's signed-rank test that ``values`` centre on 0.

    Zeros are dropped; tied absolute values share their average rank, and the null
    distribution is enumerated over every sign assignment of those ranks (exact under
    ties too).  With no value left the p-value is 1.

    Parameters
    ----------
    values
        Paired differences, one per seed.

    Returns
    -------
    float
        ``P(|W - E W| >= |w - E W|)`` under the null, ``W`` the sum of positive ranks.

    Examples
    --------
    >>> round(wilcoxon_exact([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]), 6)
    0.001953
    >>> wilcoxon_exact([0.0, 0.0])
    1.0
    """
    x = [float(v) for v in values if v != 0]
    n = len(x)
    if n == 0:
        return 1.0
    if n > 20:
        raise ValueError(f"values must hold at most 20 non-zero differences, got {n}")
    order = sorted(range(n), key=lambda i: abs(x[i]))
    ranks = [0.0] * n
    i = 0
    while i < n:  # average ranks over runs of tied |x|
        j = i
        while j + 1 < n and abs(x[order[j + 1]]) == abs(x[order[i]]):
            j += 1
        for t in range(i, j + 1):
            ranks[order[t]] = (i + j) / 2 + 1
        i = j + 1
    centre = sum(ranks) / 2
    observed = abs(sum(r for r, v in zip(ranks, x, strict=True) if v > 0) - centre)
    tol = 1e-9 * max(1.0, centre)  # sums of half-integers: compare without roundoff
    extreme = sum(
        abs(sum(r for r, s in zip(ranks, signs, strict=True) if s) - centre) >= observed - tol
        for signs in itertools.product((False, True), repeat=n)
    )
    return float(extreme / 2**n)


def _answers(results: Mapping[str, Any]) -> dict[tuple[int, int, str], list[int]]:
    """(seed, factor, band) -> the distance of every scored answer, in stored order."""
    rows = results.get("recall_answers", [])
    return {(r["seed"], r["factor"], r["band"]): r["distances"] for r in rows}


def _accuracy(row: Mapping[str, Any], distances: list[int] | None, start: int | None) -> float:
    if start is None or row["lo"] >= start:
        return float(row["accuracy"])
    if distances is None or len(distances) != len(row["hits"]):
        raise ValueError(
            f"band_start needs each answer's distance: no recall_answers match seed "
            f"{row['seed']}, factor {row['factor']}, band {row['band']}"
        )
    kept = [h == "1" for h, d in zip(row["hits"], distances, strict=True) if d >= start]
    return sum(kept) / len(kept) if kept else math.nan


def _t_summary(values: Sequence[float]) -> tuple[float, float, float, float]:
    """Mean, 95% t-interval and two-sided t-test p of "centred on 0"; NaN for all but the
    mean when the values have no spread (the interval and the test are undefined)."""
    if len(values) > 1 and max(values) > min(values):
        mean, lo, hi = t_interval(values, 0.95, exact=True)
        return mean, lo, hi, min(1.0, 2 * min(t_test(values, 0.0)))
    return math.fsum(values) / len(values), math.nan, math.nan, math.nan


def recall_gains(
    results: Mapping[str, Any],
    *,
    band_start: str = "L",
    family: str | None = None,
    control: str = "window",
) -> list[dict[str, Any]]:
    """Per (scheme, band, context): the seeds' gains over the window-of-L control.

    Parameters
    ----------
    results
        A recall run's output (as :func:`posenc.lab.load_results` reads it) or its
        ``results``; it needs ``recall`` rows with ``attention`` ``"full"`` and
        ``"window"``, and for ``band_start="L+1"`` the ``recall_answers`` rows.
    band_start
        ``"L"``: the bands as stored (``L-2L`` starts at distance ``L``); ``"L+1"``:
        answers at distance ``L`` exactly are dropped from bands that start there.
    family
        The name of the Holm family (default: the config's ``recall_warmup`` and
        seeds, which tell the presets apart); every gain of ``results`` is in it.
    control
        The rows the full model is compared with: ``"window"`` (the same model with
        its attention masked to its last ``L`` keys) or ``"trained-window"`` (the
        trained control of ``LabConfig.recall_control_schemes``; cells without it
        are left out).

    Returns
    -------
    list of dict
        One per (scheme, band, factor) beyond ``L``, sorted by scheme, factor and
        band: ``scheme``, ``band``, ``factor``, ``gains`` (one per seed, in seed
        order), ``seeds``, ``mean``, ``lo``, ``hi`` (95% t), ``p`` (exact Wilcoxon,
        two-sided), ``p_t`` (the one-sample t-test of the same null, two-sided),
        ``p_holm`` and ``p_t_holm`` (Holm's correction of each over the family),
        ``family``, ``above_sesoi`` (the interval's lower end
        exceeds :data:`SESOI_ACCURACY`) and ``passes`` (seeds whose gain is at least
        0.25, the frozen rule's per-seed margin).

    Examples
    --------
    >>> from posenc.lab import load_results
    >>> from posenc.lab.gains import recall_gains
    >>> rows = recall_gains(load_results("recall-warmup", split="confirmation"))
    >>> cell = ("rope", "L-2L", 8)   # plain RoPE, keys L to 2L back, shown 8L tokens
    >>> g = next(r for r in rows if (r["scheme"], r["band"], r["factor"]) == cell)
    >>> g["passes"], g["seeds"], f"{g['mean']:+.3f} [{g['lo']:.3f}, {g['hi']:.3f}]"
    (0, 10, '+0.105 [0.060, 0.149]')
    >>> round(g["p"], 5), round(g["p_t"], 6)   # no seed clears 0.25, every seed gains
    (0.00195, 0.000463)
    """
    res = results.get("results", results)
    config = results.get("config", {}) if "results" in results else {}
    train_len = int(config.get("train_len", 0)) or None
    start = None
    if band_start == "L+1":
        if train_len is None:
            raise ValueError("band_start='L+1' needs the results' config (its train_len)")
        start = train_len + 1
    elif band_start != "L":
        raise ValueError(f"band_start must be 'L' or 'L+1', got {band_start!r}")
    if control not in ("window", "trained-window"):
        raise ValueError(f"control must be 'window' or 'trained-window', got {control!r}")
    answers = _answers(res) if start is not None else {}
    cells: dict[tuple[str, str, int], dict[int, dict[str, float]]] = {}
    for row in res.get("recall", []):
        if row.get("band") in (None, "<L"):
            continue
        key = (row["scheme"], row["band"], row["factor"])
        distances = answers.get((row["seed"], row["factor"], row["band"]))
        acc = _accuracy(row, distances, start)
        cells.setdefault(key, {}).setdefault(row["seed"], {})[row["attention"]] = acc
    if family is None:
        family = f"warmup {config.get('recall_warmup')}, seeds {results.get('seeds')}"
    out: list[dict[str, Any]] = []
    for scheme, band, factor in sorted(cells, key=lambda c: (c[0], c[2], c[1])):
        by_seed = cells[(scheme, band, factor)]
        gains = [
            s["full"] - s[control]
            for _, s in sorted(by_seed.items())
            if "full" in s and control in s and not math.isnan(s["full"] - s[control])
        ]
        if not gains:
            continue
        mean, lo, hi, p_t = _t_summary(gains)
        out.append({
            "scheme": scheme, "band": band, "factor": factor, "gains": gains,
            "seeds": len(gains), "mean": mean, "lo": lo, "hi": hi,
            "p": wilcoxon_exact(gains), "p_t": p_t, "family": family,
            "above_sesoi": bool(lo > SESOI_ACCURACY), "passes": sum(g >= 0.25 for g in gains),
        })  # fmt: skip
    wilcoxon_holm = holm(float(r["p"]) for r in out)
    t_holm = holm(1.0 if math.isnan(r["p_t"]) else float(r["p_t"]) for r in out)
    for row, w_adj, t_adj in zip(out, wilcoxon_holm, t_holm, strict=True):
        row["p_holm"], row["p_t_holm"] = w_adj, t_adj
    return out


def moved(before: Iterable[Mapping[str, Any]], after: Iterable[Mapping[str, Any]]) -> list[str]:
    """The cells whose count of passing seeds differs between two :func:`recall_gains` readings.

    Parameters
    ----------
    before, after
        Two outputs of :func:`recall_gains`, e.g. with ``band_start="L"`` and ``"L+1"``.

    Returns
    -------
    list of str
        ``"<scheme> <band> at <factor>L: <before> -> <after> seeds pass"`` per cell that moved.
    """
    a = {(r["scheme"], r["band"], r["factor"]): r["passes"] for r in before}
    return [
        f"{s} {b} at {f}L: {a[(s, b, f)]} -> {r['passes']} seeds pass"
        for r in after
        for s, b, f in [(r["scheme"], r["band"], r["factor"])]
        if (s, b, f) in a and a[(s, b, f)] != r["passes"]
    ]


def lead_effects(results: Mapping[str, Any], *, alpha: float = 0.05) -> list[dict[str, Any]]:
    """Per (scheme, far band): does moving the inputs away from the start change the gain?

    The reading rule of the experiment ``recall_lead``, committed with the preset
    ``recall-recipe`` before any of its results was seen.  Per seed, the gain over the
    masked window-of-L control (bands from ``L + 1``, as :func:`recall_gains` with
    ``band_start="L+1"``) is measured on the same band inputs twice: as stored and
    after ``lead`` filler tokens.  Its paired difference, moved minus as stored, is the
    statistic: distance is kept and only the position from the start changes.

    Parameters
    ----------
    results
        A run holding ``recall_lead`` rows (``attention`` ``"full"`` and ``"window"``,
        ``lead`` 0 and one positive lead), ``recall_answers`` for the same seeds, and
        its ``config`` (for ``train_len``).
    alpha
        The familywise level of the decision.

    Returns
    -------
    list of dict
        One per (scheme, band), in stored order: ``scheme``, ``band``, ``factor``,
        ``lead`` (fillers, in tokens), ``diffs`` (one per seed, in seed order),
        ``seeds``, ``mean``, ``lo``, ``hi`` (95% t), ``p_t`` (two-sided t-test of no
        change), ``p_t_holm`` (Holm over every row), ``p_wilcoxon`` (exact, printed
        beside it, decides nothing) and ``matters``: ``True`` when ``p_t_holm <
        alpha`` and the mean lies outside ``±`` :data:`SESOI_ACCURACY`; ``False``
        otherwise; ``None`` when the mean lies outside and the differences have no
        spread (no t-test to decide).  A row without spread enters Holm's family with
        ``p_t = 1``: it is one of the scheme x band cells the rule counts.
    """
    if not 0 < alpha < 1:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha!r}")
    if "results" not in results or "train_len" not in results.get("config", {}):
        raise ValueError("results must be a stored run with its config (its train_len)")
    res = results["results"]
    start = int(results["config"]["train_len"]) + 1
    answers = _answers(res)
    acc: dict[tuple[str, str, int], dict[int, dict[tuple[int, str], float]]] = {}
    leads: set[int] = set()
    for row in res.get("recall_lead", []):
        distances = answers.get((row["seed"], row["factor"], row["band"]))
        cell = acc.setdefault((row["scheme"], row["band"], row["factor"]), {})
        cell.setdefault(row["seed"], {})[row["lead"], row["attention"]] = _accuracy(
            row, distances, start
        )
        leads.add(row["lead"])
    if not acc:
        raise ValueError("results hold no recall_lead rows (the preset's recall_lead is 0)")
    moved_by = max(leads)
    if sorted(leads) != [0, moved_by]:
        raise ValueError(f"recall_lead rows must have lead 0 and one other, got {sorted(leads)}")
    out: list[dict[str, Any]] = []
    for (scheme, band, factor), by_seed in acc.items():
        diffs = []
        for _, a in sorted(by_seed.items()):
            try:
                g0 = a[0, "full"] - a[0, "window"]
                g1 = a[moved_by, "full"] - a[moved_by, "window"]
            except KeyError as missing:
                raise ValueError(f"{scheme} {band}: a seed lacks the row {missing}") from None
            # accuracies are counts over a few hundred answers: equal differences must
            # compare equal (no spread), not differ by roundoff and feed a t-test
            diffs.append(round(g1 - g0, 12))
        mean, lo, hi, p_t = _t_summary(diffs)
        out.append({
            "scheme": scheme, "band": band, "factor": factor, "lead": moved_by, "diffs": diffs,
            "seeds": len(diffs), "mean": mean, "lo": lo, "hi": hi, "p_t": p_t,
            "p_wilcoxon": wilcoxon_exact(diffs),
        })  # fmt: skip
    adjusted = holm(1.0 if math.isnan(r["p_t"]) else float(r["p_t"]) for r in out)
    for row, p_adj in zip(out, adjusted, strict=True):
        row["p_t_holm"] = p_adj
        if abs(row["mean"]) <= SESOI_ACCURACY:  # inside the margin: never "matters"
            row["matters"] = False
        else:
            row["matters"] = None if math.isnan(row["p_t"]) else bool(p_adj < alpha)
    return out
