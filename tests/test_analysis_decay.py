"""Tests for posenc.analysis.decay: golden values from independent quadrature and loops."""

import cmath
import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from scipy.integrate import quad

from posenc.analysis import (
    TrainableFrequencies,
    fit_frequencies,
    oscillatory_integral,
    rope_decay_bound,
    sinusoid_decay_integral,
    sinusoid_dot_product,
)


def _quad_reference(x, base):
    """int_0^1 exp(i x base^-t) dt, real and imaginary parts integrated separately."""
    kw = dict(epsabs=1e-15, epsrel=1e-13, limit=2000)
    edges = np.linspace(0.0, 1.0, 17)  # panels keep each quad call's oscillation count small
    panels = list(zip(edges[:-1], edges[1:], strict=True))
    re = sum(quad(lambda t: math.cos(x * base**-t), a, b, **kw)[0] for a, b in panels)
    im = sum(quad(lambda t: math.sin(x * base**-t), a, b, **kw)[0] for a, b in panels)
    return complex(re, im)


@pytest.mark.parametrize("base", [10.0, 1000.0, 10000.0, 500000.0])
@pytest.mark.parametrize("x", [-300.0, -7.5, -1.0, 1e-3, 0.5, 3.0, 40.0, 128.0, 2500.0])
def test_closed_form_matches_quadrature(x, base):
    got = sinusoid_decay_integral(x, base)
    assert abs(got - _quad_reference(x, base)) < 1e-11


def test_zero_tiny_and_conjugate_symmetry():
    assert sinusoid_decay_integral(0.0) == 1.0
    # The Taylor branch below 1e-5 and the Si/Ci branch above it agree.
    for x in (0.999999e-5, 1.000001e-5):
        assert abs(sinusoid_decay_integral(x) - _quad_reference(x, 10000.0)) < 1e-15
    assert abs(sinusoid_decay_integral(1e-300) - 1.0) < 1e-16
    x = np.linspace(0.1, 200.0, 57)
    pos, neg = sinusoid_decay_integral(x), sinusoid_decay_integral(-x)
    np.testing.assert_allclose(neg, np.conj(pos), rtol=0, atol=1e-15)


def test_small_x_taylor():
    # I(x) = 1 + i x E[theta] - x^2 E[theta^2] / 2 + O(x^3), E[b^-t] = (1 - 1/b)/ln b.
    b, x = 10000.0, 1e-4
    m1 = (1 - 1 / b) / math.log(b)
    m2 = (1 - 1 / b**2) / (2 * math.log(b))
    expected = complex(1 - x * x * m2 / 2, x * m1)
    assert abs(sinusoid_decay_integral(x, b) - expected) < 1e-12


def test_types_shapes_and_devices():
    x = torch.linspace(-5, 5, 12).reshape(3, 4)
    out = sinusoid_decay_integral(x)
    assert isinstance(out, torch.Tensor) and out.dtype == torch.complex128
    assert out.shape == (3, 4) and out.device == x.device
    arr = sinusoid_decay_integral(np.arange(6).reshape(2, 3))
    assert isinstance(arr, np.ndarray) and arr.shape == (2, 3)
    expected = sinusoid_decay_integral(torch.arange(6.0)).numpy()
    np.testing.assert_allclose(arr.reshape(-1), expected, rtol=0, atol=0)
    assert isinstance(sinusoid_decay_integral(2), complex)


def test_decay_integral_errors():
    with pytest.raises(ValueError, match="base must be > 1"):
        sinusoid_decay_integral(1.0, base=1.0)
    with pytest.raises(TypeError, match="x must hold real numbers"):
        sinusoid_decay_integral(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(TypeError, match="x must be a real number"):
        sinusoid_decay_integral(["a"])


def test_oscillatory_integral_linear_phase_closed_form():
    x = np.array([-20.0, -1.0, 0.5, 3.0, 64.0, 300.0])
    got = oscillatory_integral(lambda t: t, x)
    expected = (np.exp(1j * x) - 1) / (1j * x)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_oscillatory_integral_with_weight_closed_form():
    # int_0^1 t e^{ixt} dt = e^{ix}/(ix) + (e^{ix} - 1)/x^2, by parts.
    x = np.array([0.7, 5.0, 90.0])
    got = oscillatory_integral(lambda t: t, torch.tensor(x), weight=lambda t: t)
    expected = np.exp(1j * x) / (1j * x) + (np.exp(1j * x) - 1) / x**2
    assert isinstance(got, torch.Tensor)
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-12)


def test_oscillatory_integral_agrees_with_closed_form():
    x = np.linspace(-128, 128, 41)
    got = oscillatory_integral(lambda t: 1000.0**-t, x)
    np.testing.assert_allclose(got, sinusoid_decay_integral(x, 1000.0), rtol=0, atol=1e-12)


def test_oscillatory_integral_errors():
    with pytest.raises(TypeError, match="theta must be callable"):
        oscillatory_integral(3.0, 1.0)
    with pytest.raises(TypeError, match="weight must be callable"):
        oscillatory_integral(lambda t: t, 1.0, weight=2.0)
    with pytest.raises(ValueError, match="epsabs must be > 0"):
        oscillatory_integral(lambda t: t, 1.0, epsabs=0.0)


def test_dot_product_matches_explicit_vectors():
    dim, base = 10, 100.0
    for m, n in [(0, 0), (3, 7), (12, 1), (40, 39)]:
        # Interleaved table of Vaswani et al.: (sin, cos) pairs.
        def vec(p):
            out = []
            for i in range(dim // 2):
                w = base ** (-2 * i / dim)
                out += [math.sin(p * w), math.cos(p * w)]
            return out

        expected = sum(a * b for a, b in zip(vec(m), vec(n), strict=True))
        got = sinusoid_dot_product(m - n, dim, base)
        assert got.dtype == torch.float64 and abs(got.item() - expected) < 1e-13


def test_dot_product_riemann_sum_converges_to_integral():
    # (2/d) <p_m, p_n> is a left Riemann sum of Re f, f(t) = exp(i x b^-t), with n = d/2
    # nodes.  Euler-Maclaurin: sum - integral = Re(f(0) - f(1)) / (2n) + O(1/n^2).
    x, b = 40.0, 10000.0
    constant = (math.cos(x) - math.cos(x / b)) / 2
    scaled = []
    for d in (1024, 4096, 16384):
        n = d // 2
        err = sinusoid_dot_product(x, d, b).item() / n - sinusoid_decay_integral(x, b).real
        scaled.append(abs(n * err - constant))
    assert scaled[0] > 3.5 * scaled[1] > 3.5**2 * scaled[2]  # the remainder is O(1/n)
    assert scaled[2] < 0.01 * abs(constant)


def _bound_loop(x, dim, base):
    n = dim // 2
    partial, total = 0j, 0.0
    for k in range(n):
        partial += cmath.exp(1j * x * base ** (-2 * k / dim))
        total += abs(partial)
    return total / n


@pytest.mark.parametrize("dim,base", [(128, 10000.0), (16, 10.0), (2, 10000.0)])
def test_rope_decay_bound_matches_loop(dim, base):
    x = torch.tensor([0, 1, 5, 37, 100, 250, -37])
    got = rope_decay_bound(x, dim, base)
    expected = torch.tensor([_bound_loop(float(v), dim, base) for v in x], dtype=torch.float64)
    assert got.dtype == torch.float64 and got.shape == x.shape
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    assert abs(rope_decay_bound(0, dim, base).item() - (dim // 2 + 1) / 2) < 1e-12


@given(
    x=st.floats(-500, 500, allow_nan=False),
    seed=st.integers(0, 2**31 - 1),
    dim=st.sampled_from([2, 8, 64, 128]),
)
def test_abel_inequality(x, seed, dim):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(dim // 2, dtype=torch.complex128, generator=g)
    theta = 10000.0 ** (-2 * torch.arange(dim // 2, dtype=torch.float64) / dim)
    lhs = (h * torch.exp(1j * x * theta)).sum().abs()
    steps = torch.diff(torch.cat([h, h.new_zeros(1)])).abs().max()
    rhs = steps * (dim // 2) * rope_decay_bound(x, dim)
    assert lhs <= rhs * (1 + 1e-12) + 1e-12


def test_rope_decay_bound_errors():
    with pytest.raises(ValueError, match="dim must be an even integer"):
        rope_decay_bound(3, dim=7)
    with pytest.raises(TypeError, match="distance must"):
        rope_decay_bound("far")
    with pytest.raises(TypeError, match="distance must hold real numbers"):
        rope_decay_bound(torch.ones(2, dtype=torch.bool))


def test_trainable_frequencies_init_and_gradcheck():
    module = TrainableFrequencies(16, base=100.0)
    x = torch.arange(-5, 30)
    expected = sinusoid_dot_product(x, 16, 100.0) / 8
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-15)
    xd = torch.linspace(0, 20, 7, dtype=torch.float64)
    assert torch.autograd.gradcheck(lambda th: torch.cos(xd[:, None] * th).mean(-1), module.theta)
    module(xd).sum().backward()
    # d/dtheta_i mean_j cos(x theta_i) summed over x: -(1/8) sum_x x sin(x theta_i).
    manual = -(xd[:, None] * torch.sin(xd[:, None] * module.theta.detach())).sum(0) / 8
    torch.testing.assert_close(module.theta.grad, manual, rtol=1e-12, atol=1e-14)


def test_fit_frequencies_lowers_loss_deterministically():
    x = torch.arange(0, 64, dtype=torch.float64)
    target = torch.exp(-x / 16)

    def run():
        m = TrainableFrequencies(16)
        return m, fit_frequencies(m, x, target, steps=50, lr=1e-2)

    (m1, l1), (m2, l2) = run(), run()
    assert len(l1) == 51 and l1[-1] < 0.5 * l1[0]
    assert l1 == l2 and torch.equal(m1.theta, m2.theta)


def test_trainable_errors():
    with pytest.raises(ValueError, match="dim must be an even integer"):
        TrainableFrequencies(5)
    with pytest.raises(ValueError, match="dtype must be"):
        TrainableFrequencies(4, dtype=torch.float16)
    m = TrainableFrequencies(4)
    with pytest.raises(ValueError, match="target must have"):
        fit_frequencies(m, torch.zeros(3), torch.zeros(4))
    with pytest.raises(TypeError, match="module must be"):
        fit_frequencies(torch.nn.Linear(1, 1), torch.zeros(3), torch.zeros(3))
