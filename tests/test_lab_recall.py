"""Multi-query associative recall (posenc.lab.recall): the samplers' layout, checked
token by token, and the scoring, checked with an oracle that applies the rule exactly."""

import dataclasses
import math

import pytest
import torch
from torch import nn

from posenc.lab import PRESETS, Lab
from posenc.lab.recall import learned_seeds, needle_grid, recall, recall_accuracy
from posenc.lab.tasks import RecallTask


def _earlier_value(tokens, t, keys):
    """Brute force: the token after the previous occurrence of tokens[t] (a key), or None."""
    for s in range(t - 1, -1, -1):
        if tokens[s] == tokens[t] and tokens[t] < keys:
            return int(tokens[s + 1])
    return None


class Oracle(nn.Module):
    """Names the token that followed the previous occurrence of the current key, when it is
    in view; otherwise no preference (uniform logits)."""

    max_len = None

    def __init__(self, task):
        super().__init__()
        self.task = task
        self.anchor = nn.Parameter(torch.zeros(()))

    def forward(self, tokens):
        b, n = tokens.shape
        logits = torch.zeros(b, n, self.task.vocab)
        for i in range(b):
            for t in range(n):
                v = _earlier_value(tokens[i].tolist(), t, self.task.keys)
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


def test_far_batch_puts_every_pair_out_of_view_of_the_last_span_tokens():
    task = RecallTask(pairs=4)
    span, length = 32, 128
    x, y, w = task.far_batch(32, length, span, torch.Generator().manual_seed(1))
    body = x[:, : length - 16]
    where = torch.nonzero(body < task.keys)[:, 1]
    assert where.min() >= length - 2 * span and where.max() < length - span
    tail = x[:, -span:]
    assert not (tail[:, : span - 16] < task.keys).any()  # only the query block has keys
    assert torch.equal(w.sum(1), torch.full((32,), 4.0))  # the first round only
    oracle = Oracle(task)
    acc_full, _ = recall_accuracy(oracle, task, x, y, w)
    acc_cut, _ = recall_accuracy(oracle, task, *(t[:, -span:] for t in (x, y, w)))
    assert acc_full == 1.0
    # out of view: a guess; 128 answers, so within 4 binomial sd of 1/16
    assert abs(acc_cut - 1 / 16) < 4 * math.sqrt(1 / 16 * 15 / 16 / 128)


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
    reads content only) scores about 0.14 on the far inputs the lab scores at 2L; with
    fillers of their own, values would be the only such tokens in view and the same rule
    would score 1 / pairs = 0.25 or more."""
    task = RecallTask(pairs=4)
    x, y, w = task.far_batch(1000, 64, 32, torch.Generator().manual_seed(3))
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
    with pytest.raises(ValueError, match="length"):
        task.far_batch(2, 40, 32, g)


def test_experiments_rows_on_a_tiny_run():
    c = dataclasses.replace(
        PRESETS["smoke"],
        recall_steps=3,
        recall_pairs=1,
        recall_sequences=16,
        recall_schemes=("alibi", "learned"),
    )
    lab = Lab(c)
    rows = recall(lab)
    assert {r["scheme"] for r in rows} == {"alibi", "learned"}
    learned_rows = [r for r in rows if r["factor"] == 0]
    assert all(r["learned"] in (0.0, 1.0) for r in learned_rows)
    assert learned_seeds(rows) == {
        s: (int(sum(r["learned"] for r in learned_rows if r["scheme"] == s)), 1)
        for s in ("alibi", "learned")
    }
    grid = needle_grid(lab)
    assert len({(r["scheme"], r["factor"], r["depth"]) for r in grid}) == len(grid)
    assert all(0 <= r["accuracy"] <= 1 for r in grid + rows)
