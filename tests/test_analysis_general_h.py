"""Tests for posenc.analysis.general_h: explicit loops over features, hand-built matrices."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import sinusoidal_table
from posenc.analysis import (
    DiagonalDominance,
    OrderModel,
    diagonal_dominance,
    diagonal_form_terms,
    order_task_batch,
    train_order_model,
)


@given(seed=st.integers(0, 2**31 - 1), m=st.integers(0, 60), n=st.integers(0, 60))
def test_terms_add_up_to_bilinear_form(seed, m, n):
    dim = 12
    h = torch.randn(dim, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    table = sinusoidal_table(61, dim, dtype=torch.float64)
    relative, absolute = diagonal_form_terms(h, torch.tensor(m), torch.tensor(n))
    expected = table[m] @ torch.diag(h) @ table[n]
    assert abs(relative + absolute - expected) < 1e-12


def test_terms_match_explicit_product_to_sum_loop():
    dim, base = 8, 100.0
    h = torch.tensor([0.3, -1.2, 2.0, 0.5, 1.0, 1.0, -0.7, 0.1], dtype=torch.float64)
    m, n = 7, 3
    rel = ab = 0.0
    for i in range(dim // 2):
        w = base ** (-2 * i / dim)
        # sin(mw) sin(nw) = (cos((m-n)w) - cos((m+n)w)) / 2; cos cos has a plus sign.
        rel += 0.5 * (h[2 * i].item() + h[2 * i + 1].item()) * math.cos((m - n) * w)
        ab += 0.5 * (h[2 * i + 1].item() - h[2 * i].item()) * math.cos((m + n) * w)
    got_rel, got_ab = diagonal_form_terms(h, m, n, base=base)
    assert abs(got_rel.item() - rel) < 1e-14 and abs(got_ab.item() - ab) < 1e-14


def test_absolute_part_vanishes_iff_pair_coefficients_equal():
    m = torch.arange(20)[:, None]
    n = torch.arange(20)[None, :]
    equal = torch.tensor([2.0, 2.0, -1.0, -1.0, 0.5, 0.5], dtype=torch.float64)
    _, absolute = diagonal_form_terms(equal, m, n)
    assert absolute.abs().max() < 1e-14
    unequal = equal.clone()
    unequal[3] += 1e-3  # one pair differs
    _, absolute = diagonal_form_terms(unequal, m, n)
    assert absolute.abs().max() > 1e-4
    assert absolute.shape == (20, 20)


def test_diagonal_form_errors():
    with pytest.raises(ValueError, match="h must be the"):
        diagonal_form_terms(torch.eye(4), 0, 1)
    with pytest.raises(ValueError, match="len\\(h\\) must be an even integer"):
        diagonal_form_terms(torch.ones(5), 0, 1)
    with pytest.raises(TypeError, match="h must be a floating-point tensor"):
        diagonal_form_terms(torch.ones(4, dtype=torch.int64), 0, 1)


def test_diagonal_dominance_hand_matrix():
    h = torch.tensor([[4.0, 1.0, -1.0], [0.5, 1.0, 1.0], [0.0, -2.0, 3.0]])
    score = diagonal_dominance(h)
    assert isinstance(score, DiagonalDominance)
    # mean |diag| = 8/3; mean |offdiag| = 5.5/6; rows 0 and 2 strictly dominant.
    assert abs(score.magnitude_ratio - (8 / 3) / (5.5 / 6)) < 1e-12
    assert abs(score.dominant_rows - 2 / 3) < 1e-12
    assert diagonal_dominance(torch.eye(5, dtype=torch.float64)).dominant_rows == 1.0


def test_diagonal_dominance_errors():
    with pytest.raises(ValueError, match="matrix must be square"):
        diagonal_dominance(torch.ones(2, 3))
    with pytest.raises(ValueError, match="matrix must be square"):
        diagonal_dominance(torch.ones(1, 1))


def test_order_task_labels_follow_token_order():
    tokens, labels = order_task_batch(200, 7, 9, generator=torch.Generator().manual_seed(3))
    assert tokens.shape == (200, 7) and labels.shape == (200,)
    for row, label in zip(tokens.tolist(), labels.tolist(), strict=True):
        assert row.count(1) == 1 and row.count(2) == 1 and all(t < 9 for t in row)
        assert label == int(row.index(1) < row.index(2))
    assert 0.3 < labels.double().mean() < 0.7
    with pytest.raises(ValueError, match="vocab must be"):
        order_task_batch(2, 4, 3)


def test_order_model_inputs_and_gradcheck():
    model = OrderModel(6, 4, 5)
    tokens = torch.tensor([[1, 2, 3, 4, 5]])
    expected = model.embedding.weight[tokens[0]] + sinusoidal_table(5, 4, dtype=torch.float64)
    torch.testing.assert_close(model.inputs(tokens)[0], expected, rtol=0, atol=0)
    # Without positions the readout is invariant to permuting tokens.
    x = model.embedding(tokens)
    perm = torch.tensor([4, 2, 0, 1, 3])
    torch.testing.assert_close(model.readout(x), model.readout(x[:, perm]), rtol=1e-12, atol=1e-14)
    xr = torch.randn(2, 5, 4, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(model.readout, (xr,))


def test_training_learns_order_and_is_deterministic():
    m1, l1 = train_order_model(steps=100, seed=0)
    m2, l2 = train_order_model(steps=100, seed=0)
    assert l1 == l2
    assert torch.equal(m1.embedding.weight, m2.embedding.weight)
    tokens, labels = order_task_batch(500, 8, 12, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        acc = ((m1(tokens) > 0).long() == labels).double().mean().item()
    assert l1[-1] < 0.1 * l1[0] and acc > 0.95
