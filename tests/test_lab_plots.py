"""posenc.lab.plots: a figure for every experiment, drawn from rows of a real (tiny) run."""

import copy
import dataclasses
import math

import pytest

import posenc.lab
from posenc.lab import summarize
from posenc.lab.recall import learned_seeds

matplotlib = pytest.importorskip("matplotlib")
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from posenc.lab import plots  # noqa: E402

# every experiment at the smallest sizes that still give each figure all its parts
# (two seeds: intervals; two bases, scales and betas: one line each; RoPE in recall: rope:*)
CONFIG = dataclasses.replace(
    posenc.lab.PRESETS["smoke"],
    steps=4,
    passkey_steps=4,
    recall_steps=4,
    lm_long_steps=6,
    recall_probe_every=2,
    finetune_steps=2,
    schemes=("rope", "alibi", "sinusoidal"),
    recall_schemes=("rope", "alibi"),
    recall_pairs=1,
    recall_factors=(1, 2, 4),
    rope_bases=(100.0, 1000.0),
    alibi_slope_scales=(0.5, 1.0),
    yarn_betas=(32.0, 2.0),
    curse_sequences=8,
    passkey_sequences=8,
    recall_sequences=8,
    recall_band_answers=8,
    eval_tokens=64,
    recall_lead=2,  # the opt-in experiments, so that every figure has rows
    lm_budget_schemes=("alibi",),
    lm_lr_scales=(0.5,),
)


#: What a figure needs besides the rows (as the CLI passes it).
EXTRA = {"passkey": {"sequences": CONFIG.passkey_sequences}}

pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: see conftest


@pytest.fixture(scope="module")
def results():
    return posenc.lab.run_all(CONFIG, seeds="0-1")["results"]


def _drawn(fig) -> int:
    """How many axes of ``fig`` hold data: lines, collections (bands, points) or images."""
    return sum(bool(ax.lines or ax.collections or ax.images) for ax in fig.axes)


def test_every_experiment_has_a_figure():
    assert set(posenc.lab.EXPERIMENTS) <= set(plots.FIGURES)


@pytest.mark.parametrize("seeds", [(0, 1), (0,)], ids=["two-seeds", "one-seed"])
@pytest.mark.parametrize("name", list(posenc.lab.EXPERIMENTS))
def test_figure_draws_its_experiment_alone(results, name, seeds):
    # the CLI draws FIGURES[name] for the experiments it ran: the figure needs only its own rows
    rows = [r for r in results[name] if r["seed"] in seeds]
    assert rows
    fig = plots.FIGURES[name]({name: rows}, **EXTRA.get(name, {}))
    try:
        assert isinstance(fig, Figure)
        assert _drawn(fig) >= 1
    finally:
        plt.close(fig)


def test_float_keys_stay_apart(results):
    # summarize averages float fields, and base, scale, beta_fast and depth are floats:
    # the figures' grouping keeps one mean per value, equal to the mean over seeds
    raw = results["rope_base"]
    rows = plots._summary(raw, "base")
    assert {r["base"] for r in rows} == set(CONFIG.rope_bases)
    for r in rows:
        same = [
            x["excess"]
            for x in raw
            if (x["base"], x["head_dim"], x["method"], x["factor"])
            == (r["base"], r["head_dim"], r["method"], r["factor"])
        ]
        assert r["seeds"] == len(same) == 2
        assert r["excess"] == pytest.approx(math.fsum(same) / 2, abs=1e-12)


def test_lm_budget_keeps_each_learning_rate_apart(results):
    # lr is a float setting: each budget is its own group, the mean over its own seeds
    rows = summarize(results["lm_budget"])
    budgets = {(r["steps"], r["lr"]) for r in rows}
    assert budgets == {(CONFIG.lm_long_steps, CONFIG.lr), (CONFIG.steps, CONFIG.lr * 0.5)}
    for r in rows:
        same = [
            x["loss"]
            for x in results["lm_budget"]
            if (x["steps"], x["lr"], x["factor"]) == (r["steps"], r["lr"], r["factor"])
        ]
        assert r["seeds"] == len(same) == 2
        assert r["loss"] == pytest.approx(math.fsum(same) / 2, abs=1e-12)


def test_rope_base_draws_one_line_per_base(results):
    fig = plots.rope_base(results)
    try:
        left = [ax for ax in fig.axes if ax.get_title().startswith("plain RoPE")]
        assert len(left) == len({r["head_dim"] for r in results["rope_base"]})
        for ax in left:
            labels = [line.get_label() for line in ax.lines]
            assert labels == [f"base {b:g}" for b in CONFIG.rope_bases]
    finally:
        plt.close(fig)


def test_recall_titles_count_the_seeds_that_learned(results):
    counts = learned_seeds(results["recall"])  # the recall module's own count
    names = {r["scheme"] for r in results["recall"] if r["factor"] > 0}
    fig = plots.recall(results)
    try:
        titles = {ax.get_title() for ax in fig.axes if ax.get_visible()}
        expected = set()
        for name in names:
            got, total = counts[name.split(":")[0]]
            expected.add(f"{name} ({got} of {total} seeds learned)")
        assert titles == expected
    finally:
        plt.close(fig)


def test_recall_titles_count_each_schemes_own_seeds(results):
    # a results file merged from parts may hold other seeds for other schemes
    one = min(r["scheme"] for r in results["recall"])
    drop = max(r["seed"] for r in results["recall"])
    rows = [r for r in results["recall"]
            if not (r["scheme"].split(":")[0] == one and r["seed"] == drop)]  # fmt: skip
    fig = plots.recall({"recall": rows})
    try:
        title = next(ax.get_title() for ax in fig.axes if ax.get_title().startswith(one + " ("))
        got, total = learned_seeds(rows)[one]
        assert title == f"{one} ({got} of {total} seeds learned)" and total == 1
    finally:
        plt.close(fig)


def test_recall_fills_exactly_the_points_of_seeds_that_learned(results):
    """Circles (full attention) are filled where the model learned; crosses (the window
    control) are one per window row."""
    raw = [r for r in results["recall"] if r["factor"] > 0]
    learned = {(r["scheme"], r["seed"]) for r in results["recall"]
               if r["factor"] == 0 and r["learned"] == 1}  # fmt: skip
    full = [r for r in raw if r["attention"] == "full"]
    expected = sum((r["scheme"].split(":")[0], r["seed"]) in learned for r in full)
    fig = plots.recall(results)
    try:
        filled = hollow = crosses = 0
        for ax in fig.axes:
            for points in ax.collections:
                n = len(points.get_offsets())
                if points.get_label() == "_window":
                    crosses += n
                elif points.get_facecolors().size and points.get_facecolors()[0, 3] > 0:
                    filled += n
                else:
                    hollow += n
        assert (filled, filled + hollow) == (expected, len(full))
        assert crosses == len(raw) - len(full)
    finally:
        plt.close(fig)


def test_needle_grid_cells_are_the_mean_over_the_seeds_that_learned(results):
    # the tiny models rarely learn: mark which seeds did, so both paths are drawn
    results = copy.deepcopy(results)
    schemes = sorted({r["scheme"] for r in results["recall"] if r["factor"] == 0})
    for r in results["recall"]:
        if r["factor"] == 0:
            r["learned"] = 1.0 if r["scheme"] == schemes[0] or r["seed"] == 0 else 0.0
    if len(schemes) > 1:
        for r in results["recall"]:
            if r["factor"] == 0 and r["scheme"] == schemes[-1]:
                r["learned"] = 0.0
    learned = {(r["scheme"], r["seed"]) for r in results["recall"]
               if r["factor"] == 0 and r["learned"] == 1.0}  # fmt: skip
    raw = [r for r in results["needle_grid"] if (r["scheme"], r["seed"]) in learned]
    fig = plots.needle_grid(results)
    try:
        drawn = set()
        for ax in [a for a in fig.axes if a.images]:
            scheme = ax.get_title().split(" (")[0]
            drawn.add(any(r["scheme"] == scheme for r in raw))
            if not any(r["scheme"] == scheme for r in raw):
                assert [t.get_text() for t in ax.texts] == ["no seed learned the task"]
                continue
            shown = sorted(float(t.get_text()) for t in ax.texts)
            cells = {(r["factor"], r["depth"]) for r in raw if r["scheme"] == scheme}
            means = []
            for cell in cells:
                accs = [r["accuracy"] for r in raw
                        if (r["scheme"], r["factor"], r["depth"]) == (scheme, *cell)]  # fmt: skip
                means.append(math.fsum(accs) / len(accs))
            assert shown == pytest.approx(sorted(means), abs=0.0051)  # printed to 2 decimals
            assert len(shown) == len(CONFIG.recall_factors) * len(CONFIG.needle_depths)
        assert drawn == {True, False} or len(schemes) == 1
    finally:
        plt.close(fig)


def test_needle_grid_of_a_scaled_rope_counts_ropes_learned_seeds(results):
    """A "rope:pi" row comes from RoPE's model: its panel averages RoPE's learned seeds."""
    results = copy.deepcopy(results)
    for r in results["recall"]:
        if r["factor"] == 0:
            r["learned"] = 1.0 if (r["scheme"], r["seed"]) == ("rope", 0) else 0.0
    scaled = [{**r, "scheme": "rope:pi", "accuracy": 1.0 - r["accuracy"]}
              for r in results["needle_grid"] if r["scheme"] == "rope"]  # fmt: skip
    results["needle_grid"] = scaled
    fig = plots.needle_grid(results)
    try:
        (ax,) = [a for a in fig.axes if a.images]
        assert ax.get_title() == "rope:pi (1 of 2 learned)"
        want = sorted(r["accuracy"] for r in scaled if r["seed"] == 0)
        assert sorted(float(t.get_text()) for t in ax.texts) == pytest.approx(want, abs=0.0051)
    finally:
        plt.close(fig)


def test_passkey_pools_every_answer_with_a_clopper_pearson_interval(results):
    """Each point is the accuracy of every answer of every seed, its bar the exact binomial
    interval of those answers (golden values from SciPy's beta quantiles)."""
    beta = pytest.importorskip("scipy.stats").beta
    rows = results["passkey"]
    n = CONFIG.passkey_sequences
    long_len = max(r["length"] for r in rows)
    fig = plots.passkey(results, n)
    try:
        ax = next(a for a in fig.axes if a.get_title() == "alibi")
        line = ax.containers[0]  # the plain model's curve with its error bars
        xs, ys = line.lines[0].get_data()
        segments = line.lines[2][0].get_segments()
        for x, y, seg in zip(xs, ys, segments, strict=True):
            accs = [r["accuracy"] for r in rows
                    if (r["scheme"], r["length"], r["hi"]) == ("alibi", long_len, x)]  # fmt: skip
            k, total = round(sum(accs) * n), n * len(accs)
            lo = beta.ppf(0.025, k, total - k + 1) if k > 0 else 0.0
            hi = beta.ppf(0.975, k + 1, total - k) if k < total else 1.0
            assert y == pytest.approx(k / total, abs=1e-12)
            assert [p[1] for p in seg] == pytest.approx([lo, hi], abs=1e-9)
            assert 0 <= lo < hi <= 1
    finally:
        plt.close(fig)


@pytest.mark.parametrize("sequences", [9, 25])  # CONFIG.passkey_sequences is 8
def test_passkey_refuses_an_answer_count_the_rows_do_not_fit(results, sequences):
    # 8 answers make accuracies in steps of 1/8; pooling them as 9 or 25 answers would be
    # silently wrong, so the figure refuses and names the parameter
    rows = [dict(r, accuracy=0.375) for r in results["passkey"]]
    with pytest.raises(ValueError, match=f"sequences={sequences}"):
        plots.passkey({"passkey": rows}, sequences)
