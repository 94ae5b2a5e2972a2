"""Tests for posenc.analysis.taylor: the symmetric model and its second-order expansion."""

import itertools

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.analysis.taylor import (
    AttentionReadout,
    mixed_difference,
    second_order_expansion,
    taylor_remainders,
)

D = torch.float64


def _reference_readout(model, x):
    """Explicit float64 loops: softmax attention with scale 1/sqrt(d), then w . out summed."""
    q, k, v = x @ model.wq, x @ model.wk, x @ model.wv
    n, d = x.shape
    total = 0.0
    for i in range(n):
        scores = [float(q[i] @ k[j]) / d**0.5 for j in range(n)]
        top = max(scores)
        weights = [torch.tensor(s - top, dtype=D).exp().item() for s in scores]
        z = sum(weights)
        out = sum(w / z * v[j] for j, w in enumerate(weights))
        total += float(out @ model.readout)
    return total


def test_readout_matches_explicit_loop():
    model = AttentionReadout(3, seed=1)
    x = torch.randn(5, 3, dtype=D)
    assert abs(model(x).item() - _reference_readout(model, x)) < 1e-12


@given(st.integers(2, 6), st.integers(0, 10**6))
def test_readout_is_symmetric_under_any_permutation(n, seed):
    gen = torch.Generator().manual_seed(seed)
    model = AttentionReadout(4, seed=seed % 7)
    x = torch.randn(n, 4, generator=gen, dtype=D)
    perm = torch.randperm(n, generator=gen)
    assert abs(model(x) - model(x[perm])).item() < 1e-12


def test_readout_same_weights_for_same_seed_and_batches():
    a, b = AttentionReadout(4, seed=3), AttentionReadout(4, seed=3)
    assert torch.equal(a.wq, b.wq) and not torch.equal(a.wq, AttentionReadout(4, seed=4).wq)
    x = torch.randn(2, 5, 4, dtype=D)
    batched = a(x)
    assert batched.shape == (2,)
    assert torch.allclose(batched, torch.stack([a(x[0]), a(x[1])]), atol=1e-14)


def test_expansion_derivatives_match_finite_differences():
    model = AttentionReadout(3, seed=2)
    x = torch.randn(4, 3, dtype=D)
    m, n = 0, 2
    e = second_order_expansion(model, x, m, n)
    h = 1e-5

    def f_at(dm, dn):
        y = x.clone()
        y[m] += dm
        y[n] += dn
        return model(y).item()

    eye = torch.eye(3, dtype=D)
    zero = torch.zeros(3, dtype=D)
    for i in range(3):
        gm = (f_at(h * eye[i], zero) - f_at(-h * eye[i], zero)) / (2 * h)
        gn = (f_at(zero, h * eye[i]) - f_at(zero, -h * eye[i])) / (2 * h)
        assert abs(gm - e.grad_m[i].item()) < 1e-8
        assert abs(gn - e.grad_n[i].item()) < 1e-8
    hh = 1e-4
    for i, j in itertools.product(range(3), range(3)):
        a, b = hh * eye[i], hh * eye[j]
        mixed = (f_at(a, b) - f_at(a, -b) - f_at(-a, b) + f_at(-a, -b)) / (4 * hh * hh)
        mm = (f_at(a + b, zero) - f_at(a - b, zero) - f_at(b - a, zero) + f_at(-a - b, zero)) / (
            4 * hh * hh
        )
        assert abs(mixed - e.hess_mn[i, j].item()) < 1e-6
        assert abs(mm - e.hess_mm[i, j].item()) < 1e-6
    assert abs(e.value.item() - model(x).item()) < 1e-14


def test_expansion_of_a_quadratic_is_exact():
    # f = sum_i c_i . x_i + 1/2 ||sum_i x_i||^2: a symmetric quadratic with H_mn = I.
    c = torch.randn(3, dtype=D)

    def f(x):
        return (x @ c).sum() + 0.5 * x.sum(0).pow(2).sum()

    x = torch.randn(5, 3, dtype=D)
    e = second_order_expansion(f, x, 1, 3)
    eye = torch.eye(3, dtype=D)
    assert torch.allclose(e.hess_mn, eye, atol=1e-14)
    assert torch.allclose(e.hess_mm, eye, atol=1e-14)
    p_m, p_n = torch.randn(3, dtype=D), torch.randn(3, dtype=D)
    y = x.clone()
    y[1] += p_m
    y[3] += p_n
    assert abs(f(y) - e(p_m, p_n)).item() < 1e-12
    assert abs(e.terms(p_m, p_n)[5] - p_m @ p_n).item() < 1e-14


def test_remainder_is_third_order():
    model = AttentionReadout(4, seed=0)
    x = torch.randn(6, 4, dtype=D)
    p_m, p_n = torch.randn(4, dtype=D), torch.randn(4, dtype=D)
    eps = [0.1 / 2**i for i in range(5)]
    r = taylor_remainders(model, x, 1, 4, p_m, p_n, eps)
    ratios = r[:-1] / r[1:]
    assert ((ratios - 8).abs() < 0.5).all(), ratios


def test_only_the_interaction_term_couples_positions():
    model = AttentionReadout(4, seed=5)
    x = torch.randn(5, 4, dtype=D)
    e = second_order_expansion(model, x, 0, 3)
    p_m, p_n = torch.randn(4, dtype=D), torch.randn(4, dtype=D)
    for t in range(5):
        assert abs(mixed_difference(lambda a, b, t=t: e.terms(a, b)[t], p_m, p_n)) < 1e-14
    inter = mixed_difference(lambda a, b: e.terms(a, b)[5], p_m, p_n)
    assert abs(inter - p_m @ e.hess_mn @ p_n) < 1e-14
    assert abs(inter) > 1e-6


def test_mixed_difference_known_values():
    g = lambda a, b: (a * b).sum() + a.pow(3).sum() + b.exp().sum()  # noqa: E731
    a, b = torch.tensor([2.0, 3.0], dtype=D), torch.tensor([5.0, 7.0], dtype=D)
    assert mixed_difference(g, a, b).item() == pytest.approx(2 * 5 + 3 * 7, abs=1e-12)


def test_errors():
    model = AttentionReadout(3)
    x = torch.randn(4, 3, dtype=D)
    with pytest.raises(ValueError, match="distinct"):
        second_order_expansion(model, x, 1, 1)
    with pytest.raises(ValueError, match="num_tokens"):
        second_order_expansion(model, x, 0, 4)
    with pytest.raises(ValueError, match="m must be a non-negative"):
        second_order_expansion(model, x, -1, 2)
    with pytest.raises(ValueError, match="x must have shape"):
        second_order_expansion(model, x[None], 0, 1)
    with pytest.raises(TypeError, match="x must be a floating"):
        second_order_expansion(model, x.long(), 0, 1)
    with pytest.raises(ValueError, match="dim must be a positive"):
        AttentionReadout(0)
    with pytest.raises(TypeError, match="dtype"):
        AttentionReadout(3, dtype=torch.int64)
    with pytest.raises(ValueError, match="last dimension 3"):
        model(torch.randn(4, 5, dtype=D))
    with pytest.raises(ValueError, match="eps must be > 0"):
        taylor_remainders(model, x, 0, 1, x[0], x[1], [0.1, 0.0])
    with pytest.raises(ValueError, match="p_m and p_n must have shape"):
        taylor_remainders(model, x, 0, 1, x[0, :2], x[1], [0.1])
