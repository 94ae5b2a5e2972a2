"""FIRE (Li et al., 2024): the bias against float64 loops of the paper's formula.

The reference below is written from the formula, b_h(i, j) = f(psi(i - j) /
(psi(max(L, i)) + eps))[h] with psi(x) = log(|c x| + 1) and f a ReLU MLP, one
scalar at a time with ``math``; it shares no code with posenc.  The defining
property (the bias depends on (i, j) only through that ratio) is checked on
pairs whose ratios are equal by construction, (i + 1, i - j + 1) = (a^n, a^m)
with c = 1, for which the ratio is m / n whatever the base a.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import FIRE


def _fire(num_heads=3, *, width=5, c=0.7, L=3.0, seed=0, dtype=torch.float64):  # noqa: N803
    fire = FIRE(num_heads, mlp_width=width, init_c=c, init_L=L).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in fire.mlp.parameters():
            p.copy_(torch.randn(p.shape, generator=g, dtype=dtype))
    return fire


def _reference_bias(fire, q_positions, k_positions):
    """``(heads, q_len, k_len)`` from the formula, in float64 scalar loops."""
    c = fire.c.item()
    L = abs(fire.L_multiplier.item() * fire.init_L.item())  # noqa: N806
    w1 = fire.mlp[0].weight[:, 0].tolist()
    b1 = fire.mlp[0].bias.tolist()
    w2 = fire.mlp[2].weight.tolist()
    b2 = fire.mlp[2].bias.tolist()
    out = torch.zeros(fire.num_heads, len(q_positions), len(k_positions), dtype=torch.float64)
    for a, i in enumerate(q_positions):
        for b, j in enumerate(k_positions):
            r = math.log(abs(c * (i - j)) + 1) / (math.log(abs(c * max(L, i)) + 1) + fire.eps)
            hidden = [max(0.0, w * r + bias) for w, bias in zip(w1, b1, strict=True)]
            for h in range(fire.num_heads):
                out[h, a, b] = b2[h] + sum(w * x for w, x in zip(w2[h], hidden, strict=True))
    return out


def _reference_attention(q, k, v, bias, causal):
    """Softmax attention by loops over one (heads, q_len, d) sample."""
    heads, q_len, d = q.shape
    k_len = k.shape[1]
    out = torch.zeros(heads, q_len, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        for i in range(q_len):
            keys = [j for j in range(k_len) if not causal or j <= k_len - q_len + i]
            logits = [float(q[h, i] @ k[h, j]) / math.sqrt(d) + float(bias[h, i, j]) for j in keys]
            top = max(logits)
            weights = [math.exp(x - top) for x in logits]
            total = sum(weights)
            for w, j in zip(weights, keys, strict=True):
                out[h, i] += w / total * v[h, j]
    return out


# --- the formula -----------------------------------------------------------------------------


@pytest.mark.parametrize("causal", [True, False])
def test_attention_equals_float64_loops_of_the_formula(causal):
    fire = _fire()
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(3, 7, 4, generator=g, dtype=torch.float64) for _ in range(3))
    positions = list(range(7))
    bias = _reference_bias(fire, positions, positions)  # L = 3: both regimes of the threshold
    want = _reference_attention(q, k, v, bias, causal)
    got = posenc.attention(q, k, v, encoding=fire, causal=causal, backend="eager")
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_bias_forms_equal_the_loops_at_explicit_positions():
    """The plain-MLP bias and the unrolled score_mod evaluated densely agree with the formula."""
    fire = _fire(L=20.0)
    q_pos, k_pos = [0, 5, 19, 20, 21, 300, 4000], [0, 3, 17, 20, 299, 3999, 5000]
    want = _reference_bias(fire, q_pos, k_pos)
    got = fire.bias_from_positions(torch.tensor(q_pos), torch.tensor(k_pos))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    q = torch.zeros(1, 3, len(q_pos), 4, dtype=torch.float64)
    k = torch.zeros(1, 3, len(k_pos), 4, dtype=torch.float64)
    ctx = posenc.CallContext.of(q, k, q_positions=q_pos, k_positions=k_pos)
    torch.testing.assert_close(fire.bias(q, k, ctx)[0], want, rtol=1e-12, atol=1e-12)


def test_keys_after_the_query_take_the_bias_of_the_same_distance_before_it():
    fire = _fire(L=2.0)
    bias = fire.bias_from_positions(torch.arange(40), torch.arange(40))
    i = torch.arange(10, 30)
    for t in (1, 4, 9):
        torch.testing.assert_close(bias[:, i, i + t], bias[:, i, i - t], rtol=0, atol=0)


# --- the defining property -------------------------------------------------------------------


@settings(max_examples=30, deadline=None)
@given(
    base=st.integers(2, 5),
    power=st.integers(2, 3),
    n=st.integers(1, 4),
    m=st.integers(0, 4),
    seed=st.integers(0, 2**16),
)
def test_bias_depends_only_on_the_ratio(base, power, n, m, seed):
    """With c = 1, (i + 1, i - j + 1) = (a^n, a^m) has ratio m/n for every base a, so bases a
    and a^power give pairs with different i and different distances but the same bias."""
    m = min(m, n)
    fire = _fire(c=1.0, L=1.0, seed=seed)
    pairs = [(a**n - 1, a**n - a**m) for a in (base, base**power)]
    (i1, j1), (i2, j2) = pairs
    b1 = fire.bias_from_positions(torch.tensor([i1]), torch.tensor([j1]))
    b2 = fire.bias_from_positions(torch.tensor([i2]), torch.tensor([j2]))
    # equal up to eps = 1e-6 in the denominators: the ratios differ by < 1e-6 relative
    torch.testing.assert_close(b1, b2, rtol=0, atol=1e-4)


def test_below_the_threshold_the_bias_is_a_function_of_the_distance_and_above_it_is_not():
    fire = _fire(L=64.0)
    bias = fire.bias_from_positions(torch.arange(200), torch.arange(200))
    for d in (0, 3, 17):
        below = torch.stack([bias[:, i, i - d] for i in range(max(d, 1), 64)])
        torch.testing.assert_close(below, below[:1].expand_as(below), rtol=0, atol=1e-12)
        above = torch.stack([bias[:, i, i - d] for i in (80, 199)])
        if d:  # progressive interpolation: the same distance counts for less at a later query
            assert (above[0] - above[1]).abs().max() > 1e-3


# --- gradients -------------------------------------------------------------------------------


def test_gradients_reach_theta_c_and_L():
    fire = _fire()
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 3, 6, 4, generator=g, dtype=torch.float64) for _ in range(3))
    names = [n for n, _ in fire.named_parameters()]
    assert sorted(names) == sorted(["c", "L_multiplier", *(f"mlp.{n}" for n, _ in
                                    fire.mlp.named_parameters())])  # fmt: skip
    params = tuple(p.detach().clone().requires_grad_() for p in fire.parameters())

    def f(*values):
        state = dict(zip(names, values, strict=True))
        return torch.func.functional_call(
            fire, state, (q, k, v), {"causal": True}
        )  # a scheme called is its eager attention

    assert torch.autograd.gradcheck(f, params)
    out = f(*params)
    grads = torch.autograd.grad(out.square().sum(), params)
    for name, grad in zip(names, grads, strict=True):
        if name == "mlp.2.bias":  # a constant per head and row: softmax cannot see it
            assert grad.abs().max() < 1e-12
        else:
            assert grad.abs().max() > 1e-6, name  # every other parameter moves the output


# --- fused path ------------------------------------------------------------------------------


@pytest.mark.skipif(not posenc.flex_available("cpu"), reason="FlexAttention cannot compile here")
def test_fused_path_equals_the_eager_path_across_the_threshold():
    """The MLP evaluated inside the kernel, score by score, at a length crossing L."""
    fire = _fire(num_heads=2, width=32, c=0.1, L=100.0, dtype=torch.float32)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 300, 16, generator=g) for _ in range(3))
    with torch.no_grad():
        got = posenc.attention(q, k, v, encoding=fire, causal=True, backend="flex")
        want = posenc.attention(
            q.double(), k.double(), v.double(), encoding=fire.double(), causal=True,
            backend="eager",
        )  # fmt: skip
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# --- bad input -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_heads": 0}, "num_heads must be a positive integer"),
        ({"mlp_width": 0}, "mlp_width must be a positive integer"),
        ({"init_c": 0.0}, "init_c must be > 0"),
        ({"init_c": float("nan")}, "init_c must be finite"),
        ({"init_L": -1.0}, "init_L must be > 0"),
        ({"eps": 0.0}, "eps must be > 0"),
    ],
)
def test_bad_arguments_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        FIRE(**{"num_heads": 2, **kwargs})


def test_bad_types_and_head_counts_are_refused():
    with pytest.raises(TypeError, match="num_heads must be an integer"):
        FIRE(2.0)
    q = torch.zeros(1, 3, 4, 8)
    with pytest.raises(ValueError, match="q must have num_heads=2 heads"):
        posenc.attention(q, q, q, encoding=FIRE(2))
