"""posenc.lab.gains: the recall claims read as continuous effects (issue 35, item 2).

Independent sources: scipy's exact Wilcoxon test (no ties, no zeros), a brute-force
loop over the stored rows, and the frozen propositions' own per-seed pass counts.
"""

from __future__ import annotations

import copy
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

import posenc.lab as lab
from posenc.lab.gains import SESOI_ACCURACY, moved, recall_gains, wilcoxon_exact
from posenc.lab.stats import holm


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-1000, 1000).filter(bool), min_size=1, max_size=12, unique_by=abs))
def test_wilcoxon_equals_scipys_exact_test_without_ties(ints: list[int]) -> None:
    values = [i / 997 for i in ints]
    want = stats.wilcoxon(values, method="exact").pvalue
    assert wilcoxon_exact(values) == pytest.approx(want, rel=1e-12, abs=1e-15)


def test_wilcoxon_with_ties_and_zeros_enumerates_average_ranks() -> None:
    # zeros dropped; |x| = 1, 1, 2: ranks 1.5, 1.5, 3, all positive.  Of the 8 sign
    # assignments, W = 6 or 0 are as extreme as the observed 6 (centre 3): p = 2/8
    assert wilcoxon_exact([0.0, 1.0, 1.0, 2.0]) == 0.25
    assert wilcoxon_exact([1.0, -1.0]) == 1.0


def _loop_gains(results, scheme, band, factor):
    """full - window per seed, straight from the rows."""
    rows = results["results"]["recall"]
    acc = {
        (r["seed"], r["attention"]): r["accuracy"]
        for r in rows
        if (r["scheme"], r.get("band"), r["factor"]) == (scheme, band, factor)
    }
    seeds = sorted({s for s, _ in acc})
    return [acc[(s, "full")] - acc[(s, "window")] for s in seeds]


@pytest.mark.parametrize("preset", ["recall", "recall-warmup"])
def test_gains_match_the_rows_and_the_frozen_pass_counts(preset: str) -> None:
    results = lab.load_results(preset, split="confirmation")
    rows = {(r["scheme"], r["band"], r["factor"]): r for r in recall_gains(results)}
    # every reach proposition's k (seeds passing the frozen 0.25 margin) is the gains' count
    verdicts = lab.check(results, lab.propositions_for(preset))
    reach = [v for v in verdicts if v["name"].startswith("reach-") and v["verdict"] != "no rows"]
    assert reach
    for v in reach:
        scheme, rest = v["name"][len("reach-") :].rsplit("-at-", 1)
        scheme, band = scheme.rsplit("-", 2)[0], "-".join(scheme.rsplit("-", 2)[1:])
        g = rows[(scheme, band, int(rest[:-1]))]
        assert g["passes"] == v["k"] and g["seeds"] == v["seeds"], v["name"]
        assert g["gains"] == pytest.approx(_loop_gains(results, scheme, band, g["factor"]))
    # one Holm family for the whole preset's results
    assert [r["p_holm"] for r in rows.values()] == holm(r["p"] for r in rows.values())
    assert all(r["p_holm"] >= r["p"] for r in rows.values())


def test_the_review_numbers_for_rope_and_pi_with_the_warmup() -> None:
    """The review (lab-2026-11-27) recomputed these from the same file."""
    rows = {
        (r["scheme"], r["band"], r["factor"]): r
        for r in recall_gains(lab.load_results("recall-warmup", split="confirmation"))
    }
    for cell, (mean, lo, hi) in {
        ("rope", "L-2L", 8): (0.105, 0.060, 0.149),
        ("rope:pi", "L-2L", 8): (0.142, 0.106, 0.177),
        ("rope:pi", "4L-8L", 8): (0.102, 0.070, 0.134),
    }.items():
        r = rows[cell]
        assert (round(r["mean"], 3), round(r["lo"], 3), round(r["hi"], 3)) == (mean, lo, hi)
        assert r["passes"] == 0 and r["above_sesoi"] and r["lo"] > SESOI_ACCURACY


def test_band_start_l_plus_1_drops_exactly_the_answers_at_distance_l() -> None:
    results = copy.deepcopy(lab.load_results("recall", split="confirmation"))
    train_len = results["config"]["train_len"]
    answers = {
        (r["seed"], r["factor"], r["band"]): r["distances"]
        for r in results["results"]["recall_answers"]
    }
    # make every window answer at distance L right and every other one wrong: after the
    # re-scoring the window scores 0 on the L-2L bands, so each gain is the full accuracy
    for r in results["results"]["recall"]:
        if r.get("band") == "L-2L":
            d = answers[(r["seed"], r["factor"], r["band"])]
            if r["attention"] == "window":
                r["hits"] = "".join("1" if x == train_len else "0" for x in d)
                r["accuracy"] = r["hits"].count("1") / len(d)
    before = recall_gains(results)
    after = recall_gains(results, band_start="L+1")
    for a in after:
        if a["band"] != "L-2L":
            continue
        full = [
            r
            for r in results["results"]["recall"]
            if (r["scheme"], r.get("band"), r["factor"], r.get("attention"))
            == (a["scheme"], "L-2L", a["factor"], "full")
        ]
        want = []
        for r in sorted(full, key=lambda r: r["seed"]):
            d = answers[(r["seed"], r["factor"], "L-2L")]
            kept = [h for h, x in zip(r["hits"], d, strict=True) if x > train_len]
            want.append(kept.count("1") / len(kept))
        assert a["gains"] == pytest.approx(want), a["scheme"]
    assert moved(before, before) == []
    assert all(" -> " in line for line in moved(before, after))


def test_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="band_start"):
        recall_gains(lab.load_results("recall-warmup", split="confirmation"), band_start="L+2")
    with pytest.raises(ValueError, match="train_len"):
        recall_gains({"recall": []}, band_start="L+1")
    with pytest.raises(ValueError, match="at most 20"):
        wilcoxon_exact([1.0 + i for i in range(21)])
    assert math.isnan(recall_gains(
        {"config": {}, "seeds": [0], "results": {"recall": [
            {"seed": 0, "scheme": "x", "band": "L-2L", "factor": 2, "attention": a,
             "accuracy": 0.5, "lo": 32} for a in ("full", "window")]}}
    )[0]["lo"])  # fmt: skip
