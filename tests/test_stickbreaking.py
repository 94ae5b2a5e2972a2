"""Tests for posenc.stickbreaking (Tan, Yang, Courville, Panda and Shen, ICLR 2025).

The golden values are the product formula evaluated directly in float64, key by key,
``A_ij = beta_ij * prod (1 - beta_ik)`` over the visible keys ``k`` after ``j``, with
``beta = sigmoid(scale * q . k)``: no logarithms, no cumulative sums, so it shares
nothing with the log-space code under test.  The visible keys follow the authors'
reference masks (``tests/test_attn.py``, ``ref_fwd``, of shawntan/stickbreaking-attention
at commit 3147a3841b025a31d271fc8f873120ff6fa0461b): ``j < i`` by default, ``j <= i``
with ``attend_current=True``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import (
    StickBreakingAttention,
    attention,
    attention_weights,
    stickbreaking_attention,
    stickbreaking_weights,
)

# --- the float64 reference: the product formula, key by key ---------------------------------


def betas(q, k, scale):
    """``sigmoid(scale * q . k)`` in float64; query head ``h`` uses key head ``h // group``."""
    group = q.shape[1] // k.shape[1]
    k = k[:, [h // group for h in range(q.shape[1])]]
    return torch.sigmoid(scale * q.double() @ k.double().mT)


def brute_causal(q, k, *, attend_current=False, scale=None):
    """Causal weights ``(batch, heads, q_len, k_len)``; queries are the last ``q_len`` keys."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    beta = betas(q, k, scale)
    q_len, k_len = beta.shape[-2:]
    out = torch.zeros_like(beta)
    for i in range(q_len):
        # keys 0 .. last-1 are visible: strictly before the query, or up to it
        last = k_len - q_len + i + (1 if attend_current else 0)
        for j in range(last):
            out[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, j + 1 : last], dim=-1)
    return out


def brute_visible(q, k, visible, *, scale=None):
    """Weights for any visible set ``(q_len, k_len)``: the stick is broken from the last key."""
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    beta = betas(q, k, scale)
    out = torch.zeros_like(beta)
    for i in range(beta.shape[-2]):
        for j in range(beta.shape[-1]):
            if visible[i, j]:
                later = [m for m in range(j + 1, beta.shape[-1]) if visible[i, m]]
                out[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, later], dim=-1)
    return out


def repeat(t, heads):
    return t.repeat_interleave(heads // t.shape[1], dim=1)


def draw_shapes(seed, count):
    """Shapes drawn by a seeded generator: lengths 1-300, head dims 16-128, GQA, batch > 1."""
    g = torch.Generator().manual_seed(seed)

    def pick(lo, hi):
        return int(torch.randint(lo, hi + 1, (), generator=g))

    shapes = []
    for n in range(count):
        kv_heads = pick(1, 3)
        heads = kv_heads * pick(1, 3)
        # the first draw is as long as allowed; the others anywhere in 1..300
        k_len = 300 if n == 0 else pick(1, 300)
        q_len = k_len if pick(0, 1) else pick(1, k_len)  # decoding: the last q_len tokens
        shapes.append((pick(2, 3), heads, kv_heads, q_len, k_len, pick(16, 128)))
    return shapes


def inputs(shape, seed, dtype=torch.float64):
    batch, heads, kv_heads, q_len, k_len, d = shape
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, heads, q_len, d, generator=g, dtype=torch.float64)
    k = torch.randn(batch, kv_heads, k_len, d, generator=g, dtype=torch.float64)
    v = torch.randn(batch, kv_heads, k_len, d, generator=g, dtype=torch.float64)
    # logits of a few units: a spread of break points between 0.01 and 0.99
    return (2 * q).to(dtype), k.to(dtype), v.to(dtype)


SHAPES = draw_shapes(seed=20250101, count=6)


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("n", range(len(SHAPES)))
def test_float64_equals_the_product_formula(n, attend_current):
    q, k, v = inputs(SHAPES[n], seed=n)
    want = brute_causal(q, k, attend_current=attend_current)
    w = stickbreaking_weights(q, k, attend_current=attend_current)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
    out = stickbreaking_attention(q, k, v, attend_current=attend_current)
    torch.testing.assert_close(out, want @ repeat(v, q.shape[1]), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attend_current", [False, True])
@pytest.mark.parametrize("n", range(len(SHAPES)))
def test_float32_is_close_to_the_product_formula(n, attend_current):
    q, k, v = inputs(SHAPES[n], seed=n, dtype=torch.float32)
    want = brute_causal(q, k, attend_current=attend_current)  # float64, same inputs
    w = stickbreaking_weights(q, k, attend_current=attend_current)
    assert w.dtype == torch.float32
    torch.testing.assert_close(w.double(), want, rtol=1e-5, atol=1e-5)
    out = stickbreaking_attention(q, k, v, attend_current=attend_current)
    torch.testing.assert_close(
        out.double(), want @ repeat(v, q.shape[1]).double(), rtol=1e-5, atol=1e-5
    )


def test_scale_multiplies_the_logits():
    q, k, _ = inputs((2, 2, 1, 7, 9, 16), seed=3)
    want = brute_causal(q, k, scale=0.37)
    torch.testing.assert_close(
        stickbreaking_weights(q, k, scale=0.37), want, rtol=1e-12, atol=1e-12
    )


# --- the leftover mass and attend_current ----------------------------------------------------


@settings(max_examples=30)
@given(
    n=st.integers(1, 40),
    z=st.floats(-20.0, 20.0, allow_nan=False),
    attend_current=st.booleans(),
)
def test_equal_break_points_give_a_geometric_decay(n, z, attend_current):
    """Equal logits: ``A_ij = beta (1 - beta)^(i - j - 1)``, ``^(i - j)`` with attend_current."""
    q = torch.full((1, 1, n, 1), z, dtype=torch.float64)
    k = torch.ones(1, 1, n, 1, dtype=torch.float64)
    w = stickbreaking_weights(q, k, attend_current=attend_current, scale=1.0)[0, 0]
    beta, rest = 1 / (1 + math.exp(-z)), 1 / (1 + math.exp(z))  # rest = 1 - beta, not rounded
    want = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(i + 1 if attend_current else i):
            want[i, j] = beta * rest ** (i - j - (0 if attend_current else 1))
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-300)


@settings(max_examples=30)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30), spread=st.floats(0.1, 30.0))
def test_rows_sum_to_one_minus_the_leftover_and_the_output_is_weights_times_v(seed, n, spread):
    """posenc drops the leftover ``prod_j (1 - beta_ij)``: the output is exactly ``A @ v``."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = spread * torch.randn(3, 2, 1, n, 8, generator=g, dtype=torch.float64)
    for attend_current in (False, True):
        w = stickbreaking_weights(q, k, attend_current=attend_current)
        beta = torch.sigmoid(q @ k.mT / math.sqrt(8)).tril(0 if attend_current else -1)
        leftover = (1 - beta).prod(-1)
        total = w.sum(-1)
        assert torch.all(total <= 1 + 1e-12)
        torch.testing.assert_close(1 - total, leftover, rtol=1e-10, atol=1e-12)
        out = stickbreaking_attention(q, k, v, attend_current=attend_current)
        torch.testing.assert_close(out, w @ v, rtol=1e-12, atol=1e-12)


@settings(max_examples=30)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30), spread=st.floats(0.1, 10.0))
def test_a_key_keeps_what_the_nearer_keys_leave(seed, n, spread):
    """``A_ij / beta_ij``, the stick left when key ``j`` is reached, never grows going back."""
    g = torch.Generator().manual_seed(seed)
    q, k = spread * torch.randn(2, 1, 2, n, 8, generator=g, dtype=torch.float64)
    w = stickbreaking_weights(q, k)
    beta = torch.sigmoid(q @ k.mT / math.sqrt(8))
    left = (w / beta).tril(-1)  # below the diagonal: the visible keys
    pairs = torch.ones(n, n - 1, dtype=torch.bool).tril(-2)  # keys j and j + 1 both visible
    # where a weight or a break point is below 1e-250 the ratio has lost its digits (a weight
    # of the order of 1e-330 is stored as 0, so its ratio reads 0)
    normal = (w[..., :-1] > 1e-250) & (w[..., 1:] > 1e-250)
    normal &= (beta[..., :-1] > 1e-250) & (beta[..., 1:] > 1e-250)
    grows = left[..., 1:] >= left[..., :-1] * (1 - 1e-12)
    assert torch.all(grows | ~(normal & pairs))
    assert torch.all(left <= 1 + 1e-12)


@settings(max_examples=30)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(1, 30))
def test_attend_current_breaks_the_stick_at_the_query_first(seed, n):
    """``attend_current=True``: ``A_ii = beta_ii``, and the earlier keys share ``1 - beta_ii``."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2, 3, n, 8, generator=g, dtype=torch.float64)
    before = stickbreaking_weights(q, k)
    with_current = stickbreaking_weights(q, k, attend_current=True)
    beta_ii = torch.sigmoid((q * k).sum(-1) / math.sqrt(8))
    torch.testing.assert_close(with_current.diagonal(dim1=-2, dim2=-1), beta_ii, rtol=1e-12, atol=0)
    torch.testing.assert_close(
        with_current.tril(-1), before * (1 - beta_ii)[..., None], rtol=1e-12, atol=1e-300
    )
    assert torch.all(before.triu() == 0) and torch.all(with_current.triu(1) == 0)


def test_the_first_token_without_attend_current_sees_nothing():
    q, k, v = inputs((2, 2, 2, 5, 5, 16), seed=1)
    out = stickbreaking_attention(q, k, v)
    assert torch.all(out[:, :, 0] == 0)
    assert not torch.any(stickbreaking_attention(q, k, v, attend_current=True)[:, :, 0] == 0)


def test_the_authors_convention_of_adding_the_leftover_to_the_current_value():
    """posenc drops the leftover; the authors' tests add ``leftover * v_i`` (the query's own
    value), as if the rest of the stick went to v_i after the earliest key.  From posenc's
    weights: ``out + (1 - w.sum(-1)) * v``, against the product formula."""
    q, k, v = inputs((2, 2, 2, 6, 6, 16), seed=2)
    w = stickbreaking_weights(q, k)
    out = stickbreaking_attention(q, k, v) + (1 - w.sum(-1))[..., None] * v
    rest = (1 - betas(q, k, 1 / 4)).tril(-1) + torch.ones(6, 6, dtype=torch.float64).triu()
    want = brute_causal(q, k) @ v + rest.prod(-1)[..., None] * v
    torch.testing.assert_close(out, want, rtol=1e-12, atol=1e-12)


# --- masks and the non-causal extension ------------------------------------------------------


def test_a_masked_key_neither_takes_weight_nor_breaks_the_stick():
    q, k, v = inputs((2, 2, 1, 6, 6, 16), seed=4)
    keep = torch.tensor([True, False, True, True, False, True])
    w = attention_weights(
        q, k, encoding=StickBreakingAttention(), causal=True, mask=keep.expand(6, 6)
    )
    visible = torch.ones(6, 6, dtype=torch.bool).tril(-1) & keep
    torch.testing.assert_close(w, brute_visible(q, k, visible), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("attend_current", [False, True])
def test_non_causal_breaks_the_stick_from_the_last_key(attend_current):
    """causal=False: every key takes part, the last one first; without attend_current the
    key at the query's own position is left out."""
    q, k, v = inputs((2, 2, 2, 4, 7, 16), seed=5)
    scheme = StickBreakingAttention(attend_current=attend_current)
    q_pos = torch.tensor([6, 1, 3, 9])  # 9: a query with no key at its position
    w = attention_weights(q, k, encoding=scheme, q_positions=q_pos)
    visible = torch.ones(4, 7, dtype=torch.bool)
    if not attend_current:
        visible &= q_pos[:, None] != torch.arange(7)[None, :]
    torch.testing.assert_close(w, brute_visible(q, k, visible), rtol=1e-12, atol=1e-12)


def test_a_non_causal_query_at_the_last_key_equals_the_causal_one():
    q, k, v = inputs((2, 2, 2, 6, 6, 16), seed=6)
    scheme = StickBreakingAttention()
    full = attention(q, k, v, encoding=scheme, causal=True)
    last = attention(q[:, :, -1:], k, v, encoding=scheme)
    torch.testing.assert_close(last, full[:, :, -1:], rtol=1e-12, atol=1e-12)


def test_a_finite_bias_is_added_to_the_logits():
    q, k, v = inputs((1, 2, 2, 5, 5, 16), seed=7)
    bias = torch.randn(5, 5, dtype=torch.float64)
    scheme = StickBreakingAttention()
    w = attention_weights(q, k, encoding=scheme, bias=bias, causal=True)
    z = q @ k.mT / 4 + bias
    beta = torch.sigmoid(z)
    want = torch.zeros_like(beta)
    for i in range(5):
        for j in range(i):
            want[..., i, j] = beta[..., i, j] * torch.prod(1 - beta[..., i, j + 1 : i], dim=-1)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)


# --- precision and extreme inputs ------------------------------------------------------------


def test_long_float32_sequences_with_large_logits_stay_finite_and_accurate():
    """2048 tokens, logits up to ~+-100: the weights of a float32 run agree with float64."""
    g = torch.Generator().manual_seed(8)
    q = 30 * torch.randn(1, 1, 2048, 64, generator=g)
    k, v = torch.randn(2, 1, 1, 2048, 64, generator=g)
    w = stickbreaking_weights(q, k)
    want = stickbreaking_weights(q.double(), k.double())
    assert torch.isfinite(w).all() and torch.all(w.sum(-1) <= 1 + 1e-6)
    torch.testing.assert_close(w.double(), want, rtol=0, atol=1e-5)
    out = stickbreaking_attention(q, k, v)
    torch.testing.assert_close(
        out.double(), stickbreaking_attention(q.double(), k.double(), v.double()),
        rtol=0, atol=1e-4,
    )  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_inputs_are_computed_in_float32_and_rounded_once(dtype):
    q, k, v = inputs((2, 2, 1, 40, 40, 32), seed=9, dtype=dtype)
    out = stickbreaking_attention(q, k, v)
    assert out.dtype == dtype
    want = stickbreaking_attention(q.double(), k.double(), v.double())
    # one rounding to the half format, plus float32 roundoff
    eps = torch.finfo(dtype).eps
    assert torch.all((out.double() - want).abs() <= eps * want.abs() + 1e-6)


def test_float64_stays_float64():
    q, k, v = inputs((1, 1, 1, 3, 3, 16), seed=10)
    assert stickbreaking_attention(q, k, v).dtype == torch.float64
    assert stickbreaking_weights(q, k).dtype == torch.float64


@pytest.mark.parametrize("size", [1e2, 1e4, 1e30])
def test_gradients_are_finite_at_extreme_logits(size):
    g = torch.Generator().manual_seed(11)
    q, k, v = torch.randn(3, 2, 4, 12, 16, generator=g)
    q = (size * q).requires_grad_()
    k, v = k.requires_grad_(), v.requires_grad_()
    out = stickbreaking_attention(q, k, v, attend_current=True)
    assert torch.isfinite(out).all()
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all()


# --- the scheme in posenc ---------------------------------------------------------------------


def test_the_functions_are_the_scheme_through_attention():
    q, k, v = inputs((2, 4, 2, 5, 8, 16), seed=12)
    for attend_current in (False, True):
        scheme = StickBreakingAttention(attend_current=attend_current)
        got = stickbreaking_attention(q, k, v, attend_current=attend_current)
        torch.testing.assert_close(
            got, attention(q, k, v, encoding=scheme, causal=True), rtol=0, atol=0
        )
        torch.testing.assert_close(got, scheme(q, k, v, causal=True), rtol=0, atol=0)


def test_registry_metadata():
    cls = posenc.SCHEMES["stickbreaking"]
    assert cls is StickBreakingAttention
    assert cls.hooks() == ("attend",) and not cls.fused() and not posenc.supports_flex(cls())
    assert cls.quadratic_memory and not cls.weights_sum_to_one and cls.output_is_weights_times_v
    assert cls.reference == "tan2025stickbreaking"
    built = cls.build(8, 64, max_len=128, causal=True, attend_current=True)
    assert built.attend_current and not list(built.parameters())
    assert "attend_current=True" in repr(built)


def test_flex_backend_refuses_by_name():
    q, k, v = inputs((1, 2, 2, 4, 4, 16), seed=13, dtype=torch.float32)
    with pytest.raises(ValueError, match="cannot express encoding StickBreakingAttention"):
        attention(q, k, v, encoding=StickBreakingAttention(), causal=True, backend="flex")


def test_meta_tensors_and_torch_compile():
    q, k, v = (t.to("meta") for t in inputs((2, 4, 2, 6, 6, 16), seed=14, dtype=torch.float32))
    out = stickbreaking_attention(q, k, v)
    assert out.device.type == "meta" and out.shape == (2, 4, 6, 16)
    assert stickbreaking_weights(q, k).shape == (2, 4, 6, 6)
    q, k, v = inputs((2, 4, 2, 6, 6, 16), seed=14, dtype=torch.float32)
    torch._dynamo.reset()
    try:
        compiled = torch.compile(stickbreaking_attention, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(q, k, v), stickbreaking_attention(q, k, v))
    finally:
        torch._dynamo.reset()


BOOL = "^attend_current must be a bool"


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda q: StickBreakingAttention(attend_current=1), BOOL),
        (lambda q: stickbreaking_attention(q, q, q, attend_current="no"), BOOL),
        (lambda q: stickbreaking_weights(q, q, attend_current=None), BOOL),
        (lambda q: StickBreakingAttention.build(4, 16, attend_current=0), BOOL),
        (lambda q: StickBreakingAttention.build(0, 16), "^num_heads must be"),
        (lambda q: StickBreakingAttention.build(4, 16, causal="yes"), "^causal must be"),
        (lambda q: stickbreaking_attention(q, q, q, scale=-1.0), "^scale must be"),
        (lambda q: stickbreaking_attention(q, q[:, :, :3], q[:, :, :3]), "q_len <= k_len"),
        (lambda q: stickbreaking_attention(q, q[:, :3], q[:, :3]), "k and v must have a number"),
        (lambda q: stickbreaking_attention(q, q, q[..., :2, :]), "k and v must have the same len"),
        (lambda q: stickbreaking_attention(q.long(), q, q), "^q must be"),
    ],
)
def test_errors_name_the_parameter(call, message):
    q = torch.randn(1, 4, 5, 16)
    with pytest.raises((TypeError, ValueError), match=message):
        call(q)
