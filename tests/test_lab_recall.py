"""Multi-query associative recall (posenc.lab.recall): the samplers' layout, checked
token by token, and the scoring, checked with an oracle that applies the rule exactly."""

import copy
import dataclasses
import math

import pytest
import torch
from torch import nn

from posenc.lab import PRESETS, Lab, LabConfig
from posenc.lab.lab import rope_scaling_for
from posenc.lab.recall import (
    bands,
    criterion_step,
    learned_seeds,
    needle_grid,
    recall,
    recall_accuracy,
    recall_answers,
    recall_curve,
    recall_hits,
    recall_lead,
    round_accuracies,
)
from posenc.lab.tasks import RecallTask
from posenc.lab.train import seed_for


def _earlier_value(tokens, t, keys):
    """Brute force: the token after the previous occurrence of tokens[t] (a key), or None."""
    for s in range(t - 1, -1, -1):
        if tokens[s] == tokens[t] and tokens[t] < keys:
            return int(tokens[s + 1])
    return None


class Oracle(nn.Module):
    """Names the token that followed the previous occurrence of the current key, when it is
    in view and at most ``reach`` tokens back; otherwise no preference (uniform logits)."""

    max_len = None

    def __init__(self, task, reach=None):
        super().__init__()
        self.task = task
        self.reach = reach
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        b, n = tokens.shape
        logits = torch.zeros(b, n, self.task.vocab)
        for i in range(b):
            row = tokens[i].tolist()
            for t in range(n):
                lo = 0 if self.reach is None else max(0, t - self.reach)
                v = _earlier_value(row[lo:], t - lo, self.task.keys)
                if v is not None:
                    logits[i, t, v] = 10.0
        return logits


@pytest.mark.parametrize("length", [24, 33, 64])
def test_training_batch_answers_are_the_token_after_the_earlier_key(length):
    task = RecallTask(pairs=4)
    x, y, w = task.batch(64, length, torch.Generator().manual_seed(length))
    assert x.shape == y.shape == w.shape == (64, length)
    assert task.block == 16 and torch.equal(w.sum(1), torch.full((64,), 8.0))  # two rounds
    for i in range(64):
        row = x[i].tolist()
        keys_before = [t for t in row[: length - 16] if t < task.keys]
        assert len(keys_before) == len(set(keys_before)) == 4  # distinct keys, one pair each
        for t in torch.nonzero(w[i]).flatten().tolist():
            assert row[t] < task.keys and y[i, t] == row[t + 1]
            assert _earlier_value(row, t, task.keys) == row[t + 1]


def test_pairs_are_spread_uniformly_over_the_region():
    """The mean start of a pair is the region's centre within 4 standard errors."""
    task = RecallTask(pairs=2)
    length = 44
    x, _, _ = task.batch(4000, length, torch.Generator().manual_seed(0))
    region = x[:, : length - 8]
    pos = torch.nonzero(region < task.keys)[:, 1].double()
    # a pair starts anywhere in 0 .. R-2 (R = 36); by symmetry its mean is (R - 2) / 2
    centre, se = (36 - 2) / 2, pos.std().item() / math.sqrt(len(pos))
    assert abs(pos.mean().item() - centre) < 4 * se


@pytest.mark.parametrize("length,lo,hi", [(32, 1, 31), (64, 32, 63), (256, 128, 255)])
def test_band_batch_puts_every_key_at_its_distance_and_stores_it(length, lo, hi):
    task = RecallTask(pairs=4)
    x, y, w, d = task.band_batch(64, length, lo, hi, torch.Generator().manual_seed(length))
    assert (
        x.shape == (64, length) and d.shape == (64, 4) and torch.equal(w.sum(1), 4 * torch.ones(64))
    )
    for i in range(64):
        row = x[i].tolist()
        for j, t in enumerate(torch.nonzero(w[i]).flatten().tolist()):
            # the first round's queries, in order; the key d back, alone before the block
            assert t == length - 16 + 2 * j and row[t] < task.keys
            key_at = t - int(d[i, j])
            assert row[key_at] == row[t] and y[i, t] == row[key_at + 1]
            assert row[: length - 16].count(row[t]) == 1
            assert max(lo, 2 * j + 2) <= d[i, j] <= min(hi, t)
    assert recall_accuracy(Oracle(task), task, x, y, w)[0] == 1.0


def test_the_window_oracle_recalls_within_its_reach_only():
    """An oracle that sees only its last 32 tokens: every answer less than 32 back, and
    about chance (1/16) beyond, on the band sampler's inputs."""
    task = RecallTask(pairs=4)
    g = torch.Generator().manual_seed(5)
    near = task.band_batch(32, 64, 1, 31, g)
    far = task.band_batch(32, 64, 32, 63, g)
    window = Oracle(task, reach=31)
    assert bool(recall_hits(window, task, *near[:3]).all())
    acc = recall_hits(window, task, *far[:3]).double().mean().item()
    assert abs(acc - 1 / 16) < 4 * math.sqrt(1 / 16 * 15 / 16 / 128)


def test_round_accuracies_tell_the_first_round_from_the_second():
    """A model that looks back only a few tokens answers the second round (its answers sit
    in the block) and guesses the first: the plateau the learned threshold is set above."""
    task = RecallTask(pairs=4)
    x, y, w = task.batch(32, 200, torch.Generator().manual_seed(6))
    full = round_accuracies(Oracle(task), task, x, y, w)
    assert full == {"accuracy": 1.0, "accuracy_round1": 1.0, "accuracy_round2": 1.0}
    short = round_accuracies(Oracle(task, reach=15), task, x, y, w)
    assert short["accuracy_round2"] == 1.0
    # first round: the few keys within 15 tokens of their query (about 8%), else a guess
    assert short["accuracy_round1"] < 0.25
    assert short["accuracy"] == pytest.approx((short["accuracy_round1"] + 1) / 2, abs=1e-4)


def test_bands_and_criterion_step():
    assert bands(32, 1, 16) == [("<L", 1, 31)]
    assert bands(32, 2, 16) == [("<L", 1, 31), ("L-2L", 32, 63)]
    assert bands(32, 8, 16) == [("<L", 1, 31), ("L-2L", 32, 63), ("2L-4L", 64, 127),
                                ("4L-8L", 128, 255)]  # fmt: skip
    probes = [{"step": 250, "accuracy": 0.5}, {"step": 500, "accuracy": 0.8},
              {"step": 750, "accuracy": 0.99}]  # fmt: skip
    assert criterion_step(probes, 0.77) == 500 and criterion_step(probes, 0.995) is None


@pytest.mark.parametrize("depth", [0.0, 0.3, 1.0])
def test_needle_sits_at_its_depth_and_is_the_only_scored_answer(depth):
    task = RecallTask(pairs=3)
    length = 48
    x, y, w = task.needle_batch(16, length, depth, torch.Generator().manual_seed(2))
    at = round(depth * (length - 12 - 2))
    assert torch.equal(w.sum(1), torch.ones(16))
    for i in range(16):
        t = int(torch.nonzero(w[i])[0])
        assert t < length - 6  # in the first round
        assert x[i, t] == x[i, at] and y[i, t] == x[i, at + 1]
    assert recall_accuracy(Oracle(task), task, x, y, w)[0] == 1.0


def test_no_content_marks_the_answer():
    """Fillers are value tokens, so guessing the most frequent value in view (a rule that
    reads content only) scores about chance on inputs whose keys lie L to 2L back; with
    fillers of their own, values would be the only such tokens in view and the same rule
    would score 1 / pairs = 0.25 or more."""
    task = RecallTask(pairs=4)
    x, y, w, _ = task.band_batch(1000, 64, 32, 63, torch.Generator().manual_seed(3))
    hits = 0
    for i in range(1000):
        row = x[i].tolist()
        t = int(torch.nonzero(w[i])[0])  # the first query: no answer shown yet
        counts = torch.bincount(torch.tensor(row[:t]), minlength=task.vocab)[task.keys :]
        hits += int(counts.argmax() + task.keys == y[i, t])
    assert hits / 1000 < 0.2  # about 0.14 (5 standard errors below 0.2); locating gives 1


def test_bad_input_names_the_parameter():
    task = RecallTask(pairs=4)
    g = torch.Generator()
    with pytest.raises(ValueError, match="depth"):
        task.needle_batch(2, 32, 1.5, g)
    with pytest.raises(ValueError, match="length"):
        task.batch(2, 16, g)
    with pytest.raises(ValueError, match="keys"):
        RecallTask(pairs=8, keys=4)
    with pytest.raises(ValueError, match="hi must allow"):
        task.band_batch(2, 40, 32, 63, g)  # a key 32 back cannot precede the first query


def test_experiments_rows_on_a_tiny_run():
    c = dataclasses.replace(
        PRESETS["smoke"],
        recall_steps=4,
        recall_probe_every=2,
        recall_pairs=1,
        recall_sequences=16,
        recall_band_answers=8,
        recall_factors=(1, 2, 8),
        recall_schemes=("alibi", "rope"),
    )
    lab = Lab(c)
    rows = recall(lab)
    assert {r["scheme"] for r in rows} == {"alibi", "rope", "rope:pi", "rope:ntk", "rope:yarn",
                                           "rope:llama3"}  # fmt: skip
    view = [r for r in rows if r["factor"] == 0]
    assert all(r["learned"] in (0.0, 1.0) and "accuracy_round2" in r for r in view)
    assert learned_seeds(rows) == {
        s: (int(sum(r["learned"] for r in view if r["scheme"] == s)), 1) for s in ("alibi", "rope")
    }
    answers = {(r["factor"], r["band"]): r for r in recall_answers(lab)}
    assert set(answers) == {(1, "<L"), (2, "<L"), (2, "L-2L"), (8, "<L"), (8, "L-2L"),
                            (8, "2L-4L"), (8, "4L-8L")}  # fmt: skip
    for r in rows:
        if r["factor"] == 0:
            continue
        a = answers[r["factor"], r["band"]]
        assert len(r["hits"]) == r["answers"] == len(a["distances"]) == 8
        assert r["correct"] == r["hits"].count("1") and r["accuracy"] == r["correct"] / 8
        assert all(a["lo"] <= d <= a["hi"] for d in a["distances"])
    for name in ("alibi", "rope:ntk"):  # every band, both ways, scaled RoPE only beyond L
        got = {(r["factor"], r["band"], r["attention"]) for r in rows
               if r["scheme"] == name and r["factor"] > 0}  # fmt: skip
        want = {k + (att,) for k in answers for att in ("full", "window")}
        assert got == (want if name == "alibi" else {k for k in want if k[0] > 1})
    curve = recall_curve(lab)
    assert [r["step"] for r in curve if r["scheme"] == "alibi"] == [2, 4]
    grid = needle_grid(lab)
    assert len({(r["scheme"], r["factor"], r["depth"]) for r in grid}) == len(grid)
    assert all(0 <= r["accuracy"] <= 1 for r in grid + rows)


def test_needle_scalings_add_ropes_scaled_grids_and_leave_the_plain_ones():
    c = dataclasses.replace(
        PRESETS["smoke"], recall_steps=4, recall_pairs=1, recall_sequences=16,
        recall_factors=(1, 2, 4), needle_depths=(0.0, 1.0), recall_schemes=("alibi", "rope"),
    )  # fmt: skip
    plain = needle_grid(Lab(c))
    scaled_lab = Lab(dataclasses.replace(c, needle_scalings=True))
    scaled = needle_grid(scaled_lab)
    assert [r for r in scaled if ":" not in r["scheme"]] == plain  # the same models, inputs
    extra = {(r["scheme"], r["factor"], r["depth"]) for r in scaled if ":" in r["scheme"]}
    methods = ("pi", "ntk", "yarn", "llama3")
    assert extra == {(f"rope:{m}", f, d) for m in methods for f in (2, 4) for d in (0.0, 1.0)}
    # each row is the scaled copy of the trained RoPE model on the plain grid's inputs
    model, _ = scaled_lab.model("recall", "rope")
    copy_ = copy.deepcopy(model)
    copy_.set_rope_scaling(rope_scaling_for("yarn", 4, c.train_len))
    g = torch.Generator().manual_seed(seed_for(c.seed, "needle", 4, 1.0))
    task = scaled_lab.recall
    acc, _ = recall_accuracy(copy_, task, *task.needle_batch(32, 4 * c.train_len, 1.0, g))
    (row,) = [r for r in scaled if (r["scheme"], r["factor"], r["depth"]) == ("rope:yarn", 4, 1.0)]
    assert row["accuracy"] == pytest.approx(acc, abs=1e-12)
    assert "needle_scalings" not in c.to_dict()
    assert LabConfig.from_dict(scaled_lab.config.to_dict()) == scaled_lab.config
    with pytest.raises(ValueError, match="needle_scalings must be a bool"):
        dataclasses.replace(c, needle_scalings=1)


def test_a_lead_moves_every_token_and_keeps_every_distance():
    task = RecallTask(pairs=2)
    g = torch.Generator().manual_seed(3)
    x, y, w, dist = task.band_batch(4, 64, 20, 40, g)
    x2, y2, w2 = task.lead(x, y, w, 32, torch.Generator().manual_seed(4))
    assert x2.shape == (4, 96)
    assert torch.equal(x2[:, 32:], x) and torch.equal(y2[:, 32:], y) and torch.equal(w2[:, 32:], w)
    assert not w2[:, :32].any() and not y2[:, :32].any()
    assert ((x2[:, :32] >= task.keys) & (x2[:, :32] < task.vocab)).all()  # fillers: values
    for row in range(4):  # brute force: each scored query's key, as far back as before
        for t in torch.nonzero(w2[row]).flatten().tolist():
            back = next(s for s in range(t - 1, -1, -1) if x2[row, s] == x2[row, t])
            assert t - back in dist[row].tolist()
    with pytest.raises(ValueError, match="fillers"):
        task.lead(x, y, w, -1, g)
    with pytest.raises(ValueError, match="share one"):
        task.lead(x, y[:, 1:], w, 2, g)


def test_recall_lead_scores_the_far_bands_twice_on_the_same_answers():
    c = dataclasses.replace(
        PRESETS["smoke"], recall_steps=4, recall_pairs=1, recall_sequences=16,
        recall_band_answers=8, recall_factors=(1, 4), recall_schemes=("alibi", "learned"),
    )  # fmt: skip
    assert recall_lead(Lab(c)) == []  # no lead: nothing scored
    lab = Lab(dataclasses.replace(c, recall_lead=4))
    rows = recall_lead(lab)
    L = c.train_len
    assert {(r["scheme"], r["band"], r["lead"], r["attention"]) for r in rows} == {
        (s, b, n, a) for s in ("alibi", "learned") for b in ("L-2L", "2L-4L")
        for n in (0, 4 * L) for a in ("full", "window")
    }  # fmt: skip
    plain = {(r["scheme"], r["band"], r["attention"]): r for r in recall(lab) if r["factor"] == 4}
    for r in rows:
        assert r["length"] == 4 * L + r["lead"] and r["answers"] == 8
        if r["lead"] == 0:  # the recall experiment's own rows, answer by answer
            assert r["hits"] == plain[r["scheme"], r["band"], r["attention"]]["hits"]
    assert lab.config.table_len >= 8 * L  # the learned table reaches the moved inputs
    assert "recall_lead" not in c.to_dict() and lab.config.to_dict()["recall_lead"] == 4
