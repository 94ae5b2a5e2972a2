"""posenc.lab.data: the entropy floor and the samplers against independent enumeration."""

import itertools
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from posenc.lab.data import CopyVocabSource, PasskeyTask


def _law(source: CopyVocabSource, length: int) -> dict:
    """Exact probability of every sequence, straight from the generative description.

    Sum over the hidden vocabulary S (uniform over the active-sized subsets) of
    the product over positions of: a fresh uniform draw from S, or (from
    position max(offsets) on, with probability copy_prob) a copy of the token
    a uniformly chosen offset back.  Independent of predictive() and of the
    Markov chain behind entropy_floor().
    """
    v, s, pi, offs = source.vocab, source.active, source.copy_prob, source.offsets
    subsets = list(itertools.combinations(range(v), s))
    law = {}
    for seq in itertools.product(range(v), repeat=length):
        total = 0.0
        for S in subsets:
            p = 1.0
            for t, x in enumerate(seq):
                fresh = (x in S) / s
                if t >= source.reach:
                    copy = sum(seq[t - o] == x for o in offs) / len(offs)
                    p *= pi * copy + (1 - pi) * fresh
                else:
                    p *= fresh
            total += p
        if total > 0:
            law[seq] = total / len(subsets)
    return law


def _conditional_entropies(law: dict, length: int) -> list[float]:
    """H(X_t | X_<t) = H(X_<=t) - H(X_<t) from the exact joint law."""
    joint_h = [0.0]
    for t in range(1, length + 1):
        marg: dict = {}
        for seq, p in law.items():
            marg[seq[:t]] = marg.get(seq[:t], 0.0) + p
        joint_h.append(-math.fsum(p * math.log(p) for p in marg.values() if p > 0))
    return [joint_h[t + 1] - joint_h[t] for t in range(length)]


@pytest.mark.parametrize(
    "vocab,active,offsets,copy_prob",
    [(3, 2, (1, 2), 0.4), (4, 2, (1,), 0.5), (3, 3, (2,), 0.3), (4, 3, (1, 3), 0.6)],
)
def test_entropy_floor_matches_brute_force_enumeration(vocab, active, offsets, copy_prob):
    source = CopyVocabSource(vocab, active, offsets, copy_prob)
    length = 5
    law = _law(source, length)
    assert math.isclose(math.fsum(law.values()), 1.0, abs_tol=1e-12)
    expected = _conditional_entropies(law, length)
    got = source.entropy_floor(length).tolist()
    assert got == pytest.approx(expected, abs=1e-12)


def test_predictive_is_the_exact_conditional():
    source = CopyVocabSource(3, 2, (1, 2), 0.4)
    length = 4
    law = _law(source, length)
    seqs = list(law)
    tokens = torch.tensor(seqs)
    pred = source.predictive(tokens)
    for i, seq in enumerate(seqs):
        for t in range(length):
            prefix = seq[:t]
            den = math.fsum(p for s, p in law.items() if s[:t] == prefix)
            for y in range(source.vocab):
                num = math.fsum(p for s, p in law.items() if s[: t + 1] == prefix + (y,))
                assert pred[i, t, y].item() == pytest.approx(num / den, abs=1e-12)


def test_sampler_follows_the_exact_law():
    source = CopyVocabSource(3, 2, (1, 2), 0.4)
    law = _law(source, 4)
    n = 40000
    tokens = source.sample(n, 4, torch.Generator().manual_seed(0))
    counts: dict = {}
    for row in tokens.tolist():
        counts[tuple(row)] = counts.get(tuple(row), 0) + 1
    assert set(counts) <= set(law)
    tv = 0.5 * sum(abs(counts.get(s, 0) / n - p) for s, p in law.items())
    # the expected total variation of n samples over 3**4 outcomes is about 0.02
    assert tv < 0.035, tv


def test_floor_equals_the_monte_carlo_loss_of_the_exact_predictive():
    source = CopyVocabSource()  # the lab's defaults
    length = 48
    x = source.sample(4000, length, torch.Generator().manual_seed(1))
    p = source.predictive(x).gather(-1, x.unsqueeze(-1)).squeeze(-1)
    nll = -p.log()
    mean, se = nll.mean(0), nll.std(0) / math.sqrt(x.shape[0])
    floor = source.entropy_floor(length)
    assert ((mean - floor).abs() < 5 * se + 1e-9).all()
    # and the floor is not trivial: it falls with context, from log(vocab) at t = 0
    assert floor[0].item() == pytest.approx(math.log(source.vocab), abs=1e-12)
    assert floor[-1] < floor[0] - 1.0


@settings(max_examples=25, deadline=None)
@given(
    vocab=st.integers(2, 12),
    data=st.data(),
    copy_prob=st.floats(0.0, 0.9),
    length=st.integers(1, 20),
)
def test_predictive_is_a_distribution_supported_on_what_can_occur(vocab, data, copy_prob, length):
    active = data.draw(st.integers(1, vocab))
    offsets = tuple(sorted(data.draw(st.sets(st.integers(1, 4), min_size=1, max_size=3))))
    source = CopyVocabSource(vocab, active, offsets, copy_prob)
    x = source.sample(3, length, torch.Generator().manual_seed(0))
    pred = source.predictive(x)
    assert torch.allclose(pred.sum(-1), torch.ones(3, length, dtype=torch.float64))
    assert (pred.gather(-1, x.unsqueeze(-1)) > 0).all()  # every sampled token was possible
    assert (x.unsqueeze(-1) == torch.arange(vocab)).any(-1).all()
    # at most `active` distinct tokens per sequence
    assert all(len(set(row)) <= active for row in x.tolist())


@pytest.mark.parametrize(
    "kwargs,match",
    [
        ({"vocab": 1}, "vocab"),
        ({"vocab": 4, "active": 5}, "active"),
        ({"offsets": (1, 1)}, "offsets"),
        ({"offsets": (0,)}, "offsets"),
        ({"copy_prob": 1.0}, "copy_prob"),
    ],
)
def test_source_refuses_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CopyVocabSource(**kwargs)


def test_source_refuses_a_length_below_one():
    with pytest.raises(ValueError, match="length"):
        CopyVocabSource().entropy_floor(0)
    with pytest.raises(ValueError, match="length"):
        CopyVocabSource().sample(2, 0, torch.Generator())


def test_passkey_places_the_value_at_the_drawn_distance():
    task = PasskeyTask(fillers=10, values=4)
    tokens, answers, distance = task.sample(64, 30, (3, 20), torch.Generator().manual_seed(0))
    assert tokens.shape == (64, 30)
    assert (tokens[:, -1] == task.query).all()
    rows = torch.arange(64)
    assert (tokens[rows, 29 - distance] == answers).all()
    assert ((distance >= 3) & (distance <= 20)).all()
    # exactly one value token per sequence, and it is the answer
    is_value = (tokens >= task.fillers) & (tokens < task.query)
    assert (is_value.sum(1) == 1).all()
    assert ((answers >= task.fillers) & (answers < task.query)).all()


def test_passkey_refuses_unreachable_distances():
    task = PasskeyTask()
    with pytest.raises(ValueError, match="distances"):
        task.sample(2, 10, (1, 10), torch.Generator())
    with pytest.raises(ValueError, match="distances"):
        task.sample(2, 10, (0, 5), torch.Generator())
