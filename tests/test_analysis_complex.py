"""Tests for posenc.analysis.complex_solution: Toeplitz deviation and the complex derivation."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc.analysis.complex_solution import (
    complex_sinusoid,
    complex_to_pairs,
    fit_relative_solution,
    pairs_to_complex,
    polar_from_gram,
    toeplitz_distance,
    toeplitz_projection,
)

D = torch.float64


def _reference_projection(g):
    """Explicit loops: average every diagonal j - i = k."""
    n, k = g.shape
    out = torch.empty_like(g)
    for off in range(-(n - 1), k):
        cells = [(i, i + off) for i in range(n) if 0 <= i + off < k]
        mean = sum(g[i, j] for i, j in cells) / len(cells)
        for i, j in cells:
            out[i, j] = mean
    return out


@pytest.mark.parametrize("shape", [(4, 4), (3, 6), (6, 2), (1, 5)])
def test_projection_matches_explicit_loop(shape):
    g = torch.randn(*shape, dtype=D)
    assert torch.allclose(toeplitz_projection(g), _reference_projection(g), atol=1e-14)
    gc = torch.randn(*shape, dtype=torch.complex128)
    assert torch.allclose(toeplitz_projection(gc), _reference_projection(gc), atol=1e-14)


def test_deviation_golden_value():
    # [[1, 0], [0, 3]]: the main diagonal averages to 2, residual (-1, 1), norm sqrt(2)/sqrt(10).
    g = torch.tensor([[1.0, 0.0], [0.0, 3.0]], dtype=D)
    assert abs(toeplitz_distance(g).item() - math.sqrt(2 / 10)) < 1e-15


@given(st.integers(1, 7), st.integers(1, 7), st.floats(0.1, 100.0), st.integers(0, 10**6))
def test_deviation_properties(n, k, scale, seed):
    gen = torch.Generator().manual_seed(seed)
    g = torch.randn(2, n, k, generator=gen, dtype=D)
    dev = toeplitz_distance(g)
    assert dev.shape == (2,)
    assert ((dev >= 0) & (dev <= 1 + 1e-12)).all()
    assert torch.allclose(toeplitz_distance(scale * g), dev, atol=1e-12)
    assert (toeplitz_distance(toeplitz_projection(g)) < 1e-14).all()
    # The residual is orthogonal to every Toeplitz matrix (projection property).
    t = toeplitz_projection(torch.randn(n, k, generator=gen, dtype=D))
    residual = g - toeplitz_projection(g)
    assert ((residual * t).sum((-2, -1)).abs() < 1e-12).all()


def test_deviation_of_zero_and_of_sinusoid_gram():
    assert toeplitz_distance(torch.zeros(3, 3, dtype=D)).item() == 0.0
    n, d = 64, 16
    # Written from the paper: PE[p, 2i] = sin(p / 10000^(2i/d)), PE[p, 2i+1] = cos(same).
    pe = torch.zeros(n, d, dtype=D)
    for p in range(n):
        for i in range(d // 2):
            a = p / 10000 ** (2 * i / d)
            pe[p, 2 * i], pe[p, 2 * i + 1] = math.sin(a), math.cos(a)
    assert toeplitz_distance(pe @ pe.T).item() < 1e-14
    rand = torch.randn(n, d, dtype=D)
    assert toeplitz_distance(rand @ rand.T).item() > 0.3


def test_complex_sinusoid_is_the_article_table():
    n, d, base = 40, 8, 100.0
    z = complex_sinusoid(n, d, base=base)
    assert z.shape == (n, d // 2) and z.dtype == torch.complex128
    table = complex_to_pairs(z)
    for m in range(n):
        for i in range(d // 2):
            theta = base ** (-2 * i / d)
            assert abs(table[m, 2 * i].item() - math.cos(m * theta)) < 1e-14
            assert abs(table[m, 2 * i + 1].item() - math.sin(m * theta)) < 1e-14
    z32 = complex_sinusoid(n, d, base=base, dtype=torch.complex64)
    assert z32.dtype == torch.complex64
    assert (z32.to(torch.complex128) - z).abs().max() < 1e-6


def test_pairs_round_trip_and_inner_product():
    x = torch.randn(5, 6, dtype=D)
    z = pairs_to_complex(x)
    assert z.dtype == torch.complex128 and z.shape == (5, 3)
    assert torch.equal(complex_to_pairs(z), x)
    assert pairs_to_complex(x.half()).dtype == torch.complex64
    # <a, b> = Re[sum_j a_j conj(b_j)]
    inner = (z[0] * z[1].conj()).sum().real
    assert abs(inner - x[0] @ x[1]) < 1e-14


def test_polar_from_gram_golden():
    r, theta = 1.7, 0.3
    p = torch.tensor(
        [r * complex(math.cos(m * theta), math.sin(m * theta)) for m in range(6)],
        dtype=torch.complex128,
    )
    gram = p[:, None] * p.conj()[None, :]
    modulus, step = polar_from_gram(gram)
    assert torch.allclose(modulus, torch.full((6,), r, dtype=D), atol=1e-14)
    assert torch.allclose(step, torch.full((5,), theta, dtype=D), atol=1e-14)
    # A non-constant modulus shows up on the diagonal and breaks the Toeplitz property.
    q = p * torch.linspace(1, 2, 6, dtype=D)
    gq = q[:, None] * q.conj()[None, :]
    assert (polar_from_gram(gq)[0] - r).abs().max() > 1
    assert toeplitz_distance(gq) > 0.05


def test_fit_finds_constant_modulus_and_arithmetic_phase():
    solved = 0
    for seed in range(4):
        p = fit_relative_solution(8, seed=seed)
        assert p.shape == (8,) and p[0] == 1
        gram = p[:, None] * p.conj()[None, :]
        if toeplitz_distance(gram) < 1e-8:
            solved += 1
            modulus, step = polar_from_gram(gram)
            assert (modulus - 1).abs().max() < 1e-6
            assert (step - step[0]).abs().max() < 1e-6
    assert solved >= 2


def test_errors():
    with pytest.raises(ValueError, match="gram must have at least 2"):
        toeplitz_distance(torch.zeros(3))
    with pytest.raises(TypeError, match="gram must be a floating or complex"):
        toeplitz_distance(torch.zeros(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="dim must be an even"):
        complex_sinusoid(4, 7)
    with pytest.raises(ValueError, match="base must be > 0"):
        complex_sinusoid(4, 8, base=-1.0)
    with pytest.raises(TypeError, match="dtype must be torch.complex64"):
        complex_sinusoid(4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="must be an even"):
        pairs_to_complex(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="z must be a complex"):
        complex_to_pairs(torch.zeros(3, 4))
    with pytest.raises(TypeError, match="gram must be a complex"):
        polar_from_gram(torch.zeros(3, 3))
    with pytest.raises(ValueError, match="gram must be square"):
        polar_from_gram(torch.zeros(3, 4, dtype=torch.complex128))
    with pytest.raises(ValueError, match="num_positions must be an integer >= 2"):
        fit_relative_solution(1)
