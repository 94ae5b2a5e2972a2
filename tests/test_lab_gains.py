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


# ------------------------------------------------------- the moved far bands (recall_lead)


def _lead_run(hits: dict[tuple[int, str, int, str], str], distances: list[int]) -> dict:
    """A run with L = 4: one far band at 8L; hits per (seed, scheme, lead, attention)."""
    rows = [
        {"seed": s, "scheme": k, "factor": 8, "lead": n, "band": "L-2L", "lo": 4, "hi": 7,
         "attention": a, "hits": h, "accuracy": h.count("1") / len(h)}
        for (s, k, n, a), h in hits.items()
    ]  # fmt: skip
    seeds = sorted({s for s, *_ in hits})
    answers = [{"seed": s, "factor": 8, "band": "L-2L", "distances": distances} for s in seeds]
    return {"config": {"train_len": 4}, "seeds": seeds,
            "results": {"recall_lead": rows, "recall_answers": answers}}  # fmt: skip


def test_lead_effects_by_hand() -> None:
    # distances 4, 5, 6, 7 with L = 4: the first answer (distance L) is dropped.
    # seed 0: stored 1.0 - 0.0, moved 2/3 - 0.0: diff -1/3
    # seed 1: stored 2/3 - 1/3, moved 1/3 - 1/3: diff -1/3 (the same: no spread, mean
    #         outside the margin, so undecided); seed 2 makes it -1/3, -1/3, 0
    hits = {(0, "x", 0, "full"): "1111", (0, "x", 0, "window"): "1000",
            (0, "x", 32, "full"): "0110", (0, "x", 32, "window"): "1000",
            (1, "x", 0, "full"): "0110", (1, "x", 0, "window"): "0100",
            (1, "x", 32, "full"): "0100", (1, "x", 32, "window"): "1100"}  # fmt: skip
    (row,) = lab.lead_effects(_lead_run(hits, [4, 5, 6, 7]))
    assert row["diffs"] == pytest.approx([-1 / 3, -1 / 3], abs=1e-12)
    assert (row["lead"], row["seeds"], row["matters"]) == (32, 2, None)
    assert math.isnan(row["p_t"]) and row["p_t_holm"] == 1.0
    hits |= {(2, "x", n, a): "1111" for n in (0, 32) for a in ("full", "window")}
    (row,) = lab.lead_effects(_lead_run(hits, [4, 5, 6, 7]))
    assert row["diffs"] == pytest.approx([-1 / 3, -1 / 3, 0.0], abs=1e-12)
    want = stats.ttest_1samp(row["diffs"], 0.0)
    assert row["p_t"] == pytest.approx(want.pvalue, rel=1e-9)
    assert (row["lo"], row["hi"]) == pytest.approx(want.confidence_interval(0.95), rel=1e-9)
    assert row["matters"] is False  # p about 0.18: not shown, although the mean is -0.22
    # seed 0's pattern on seeds 3 and 4, and seed 5 with diff -2/3: t about -6 on 4 df
    four = {k: h for k, h in hits.items() if k[0] == 0}
    four |= {(s, *k[1:]): h for s in (3, 4) for k, h in hits.items() if k[0] == 0}
    four |= {(5, "x", 0, "full"): "1111", (5, "x", 0, "window"): "1000",
             (5, "x", 32, "full"): "0100", (5, "x", 32, "window"): "1000"}  # fmt: skip
    (row,) = lab.lead_effects(_lead_run(four, [4, 5, 6, 7]))
    assert row["diffs"] == pytest.approx([-1 / 3] * 3 + [-2 / 3], abs=1e-12)
    assert row["p_t"] == pytest.approx(stats.ttest_1samp(row["diffs"], 0.0).pvalue, rel=1e-9)
    assert row["p_t"] < 0.05 and row["matters"] is True


@settings(max_examples=30, deadline=None)
@given(st.lists(st.text("01", min_size=16, max_size=16), min_size=24, max_size=24))
def test_lead_effects_holm_and_the_rule(strings: list[str]) -> None:
    """Three seeds, two schemes: p_t is scipy's t-test, Holm runs over both cells, and
    ``matters`` is exactly the committed rule; swapping the two leads negates every diff."""
    keys = [(s, k, n, a) for k in ("x", "y") for s in range(3) for n in (0, 32)
            for a in ("full", "window")]  # fmt: skip
    hits = dict(zip(keys, strings, strict=True))
    distances = list(range(2, 18))
    rows = lab.lead_effects(_lead_run(hits, distances))
    raw = [1.0 if math.isnan(r["p_t"]) else r["p_t"] for r in rows]
    assert [r["p_t_holm"] for r in rows] == pytest.approx(holm(raw))
    for r in rows:
        if len(set(r["diffs"])) > 1:
            assert r["p_t"] == pytest.approx(stats.ttest_1samp(r["diffs"], 0.0).pvalue, rel=1e-9)
        outside = abs(r["mean"]) > SESOI_ACCURACY
        if not outside:
            assert r["matters"] is False
        elif math.isnan(r["p_t"]):
            assert r["matters"] is None
        else:
            assert r["matters"] == (r["p_t_holm"] < 0.05)
    swapped = {(s, k, 32 - n, a): h for (s, k, n, a), h in hits.items()}
    for r, w in zip(rows, lab.lead_effects(_lead_run(swapped, distances)), strict=True):
        assert w["diffs"] == pytest.approx([-d for d in r["diffs"]], abs=1e-12)


def test_lead_effects_bad_input_is_named() -> None:
    with pytest.raises(ValueError, match="alpha must lie strictly between 0 and 1"):
        lab.lead_effects({"results": {}}, alpha=5)
    with pytest.raises(ValueError, match="train_len"):
        lab.lead_effects({"results": {}})
    with pytest.raises(ValueError, match="no recall_lead rows"):
        lab.lead_effects({"config": {"train_len": 4}, "results": {}})
    one = {(0, "x", n, a): "1111" for n in (0, 32) for a in ("full", "window")}
    with pytest.raises(ValueError, match="lead 0 and one other"):
        lab.lead_effects(_lead_run(one | {(0, "x", 64, "full"): "1111"}, [4, 5, 6, 7]))
    del one[0, "x", 32, "window"]
    with pytest.raises(ValueError, match="lacks the row"):
        lab.lead_effects(_lead_run(one, [4, 5, 6, 7]))
