"""Tests for posenc.da_transformer (Wu, Wu and Huang, 2021)."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import DAAttention, attention, attention_weights, learnable_sigmoid

finite = st.floats(min_value=-50.0, max_value=50.0, allow_nan=False)


def sigmoid_formula(x: float, v: float) -> float:
    """The paper's formula, evaluated directly (fine for moderate arguments)."""
    return (1.0 + math.exp(v)) / (1.0 + math.exp(v - x))


# --- the learnable sigmoid -------------------------------------------------------------------


@given(finite, finite)
def test_sigmoid_matches_formula(x, v):
    got = float(learnable_sigmoid(torch.tensor(x, dtype=torch.float64), v))
    assert got == pytest.approx(sigmoid_formula(x, v), rel=1e-12)


@given(finite)
def test_sigmoid_is_one_at_zero(v):
    assert float(learnable_sigmoid(torch.zeros((), dtype=torch.float64), v)) == 1.0


@pytest.mark.parametrize("v", [-3.0, 0.0, 2.0, 40.0])
def test_sigmoid_vanishes_at_minus_infinity_and_is_bounded(v):
    x = torch.tensor([-1e3, -1e6, -math.inf], dtype=torch.float64)
    f = learnable_sigmoid(x, v)
    assert torch.all(f >= 0) and torch.all(f < 1e-100)
    top = learnable_sigmoid(torch.tensor([1e6, math.inf], dtype=torch.float64), v)
    torch.testing.assert_close(top, torch.full((2,), 1 + math.exp(v), dtype=torch.float64))


@given(finite, finite)
def test_sigmoid_below_its_bound(x, v):
    f = float(learnable_sigmoid(torch.tensor(x, dtype=torch.float64), v))
    bound = 1 + math.exp(v)
    assert 0 < f <= bound * (1 + 1e-15)
    if v - x > -30:  # the relative gap e^(v-x) / (1 + e^(v-x)) is resolvable in float64
        assert f < bound


@given(finite, finite, finite)
def test_sigmoid_monotone(x1, x2, v):
    lo, hi = sorted([x1, x2])
    f = learnable_sigmoid(torch.tensor([lo, hi], dtype=torch.float64), v)
    assert f[0] <= f[1]


def test_sigmoid_extreme_arguments_stay_finite():
    x = torch.tensor([-1e4, -10.0, 0.0, 10.0, 1e4], dtype=torch.float32)
    for v in (-80.0, 0.0, 80.0):
        f = learnable_sigmoid(x, v)
        assert torch.isfinite(f).all() and f.dtype == torch.float32


def test_sigmoid_broadcasts_per_head():
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    v = torch.tensor([-1.0, 0.0, 2.0], dtype=torch.float64)[:, None, None]
    f = learnable_sigmoid(x, v)
    for h in range(3):
        for i in range(4):
            for j in range(5):
                want = sigmoid_formula(float(x[h, i, j]), float(v[h, 0, 0]))
                assert float(f[h, i, j]) == pytest.approx(want, rel=1e-12)


def test_sigmoid_validation():
    with pytest.raises(TypeError, match="x must be a floating-point"):
        learnable_sigmoid(torch.arange(3), 0.0)
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        learnable_sigmoid(1.0, 0.0)


# --- the attention -----------------------------------------------------------------------------

NORMALIZE = ["softmax", "row_sum"]


def make(heads=3, normalize="softmax"):
    m = DAAttention(heads, normalize=normalize).double()
    with torch.no_grad():
        m.w.copy_(torch.tensor([-0.7, 0.0, 0.4])[:heads])
        m.v.copy_(torch.tensor([1.5, -0.5, 0.2])[:heads])
    return m


def loop_weights(m, q, k, causal, q_offset, scale, normalize="softmax", bias=None):
    """The weights of Wu et al. (2021) by explicit float64 loops over (b, h, i, j).

    ``"softmax"``, the paper: logit ``max(0, q.k) * f(w |p - s|; v) * scale``, plus
    ``bias[i][j]``, then a softmax over the visible keys.  ``"row_sum"``:
    ``max(0, scale q.k + bias) * f(...)`` over the row sum.  A row with no visible
    key (or, for ``"row_sum"``, a zero sum) is all zeros.  ``bias`` is a nested
    list of floats (``-inf`` masks) or None.
    """
    *lead, heads, q_len, _ = q.shape
    k_len = k.shape[-2]
    out = torch.zeros(*lead, heads, q_len, k_len, dtype=torch.float64)
    for b in range(lead[0]):
        for h in range(heads):
            w, v = float(m.w[h].detach()), float(m.v[h].detach())
            for i in range(q_len):
                p = q_offset + i
                row = []  # None marks a masked key
                for j in range(k_len):
                    extra = 0.0 if bias is None else bias[i][j]
                    if (causal and j > p) or extra == -math.inf:
                        row.append(None)
                        continue
                    dot = sum(
                        float(q[b, h, i, c]) * float(k[b, h, j, c]) for c in range(q.shape[-1])
                    )
                    coef = sigmoid_formula(w * abs(p - j), v)
                    if normalize == "softmax":
                        row.append(max(0.0, dot) * coef * scale + extra)
                    else:
                        row.append(max(0.0, scale * dot + extra) * coef)
                seen = [x for x in row if x is not None]
                if not seen:
                    continue
                if normalize == "softmax":
                    top = max(seen)
                    total = sum(math.exp(x - top) for x in seen)
                    for j, x in enumerate(row):
                        out[b, h, i, j] = 0.0 if x is None else math.exp(x - top) / total
                else:
                    total = sum(seen)
                    for j, x in enumerate(row):
                        out[b, h, i, j] = x / total if x is not None and total > 0 else 0.0
    return out


def test_default_is_the_papers_softmax():
    assert DAAttention(2).normalize == "softmax"
    assert "normalize='softmax'" in repr(DAAttention(2))


@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize(
    ("causal", "q_len", "k_len", "q_offset"),
    [
        (False, 5, 5, None),
        (True, 5, 5, None),
        (True, 3, 7, None),
        (True, 2, 6, 1),
        (False, 3, 4, -1),
    ],
)
def test_matches_explicit_loop(normalize, causal, q_len, k_len, q_offset):
    m = make(normalize=normalize)
    q = torch.randn(2, 3, q_len, 4, dtype=torch.float64)
    k = torch.randn(2, 3, k_len, 4, dtype=torch.float64)
    v = torch.randn(2, 3, k_len, 2, dtype=torch.float64)
    off = k_len - q_len if q_offset is None else q_offset
    want = loop_weights(m, q, k, causal, off, 0.5, normalize)
    w = attention_weights(q, k, encoding=m, causal=causal, q_offset=q_offset)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
    out = attention(q, k, v, encoding=m, causal=causal, q_offset=q_offset)
    torch.testing.assert_close(out, want @ v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(m(q, k, v, causal=causal, q_offset=q_offset), out)


@pytest.mark.parametrize("normalize", NORMALIZE)
def test_finite_bias_and_masked_keys_match_loop(normalize):
    m = make(normalize=normalize)
    q, k, v = (torch.randn(1, 3, 4, 3, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(4, 4, dtype=torch.float64)
    bias[:, 1] = -math.inf
    want = loop_weights(m, q, k, True, 0, 3**-0.5, normalize, bias=bias.tolist())
    w = attention_weights(q, k, encoding=m, bias=bias, causal=True)
    torch.testing.assert_close(w, want, rtol=1e-12, atol=1e-12)
    assert torch.all(w[..., 1] == 0)


def test_softmax_rows_sum_to_one_and_keep_non_positive_scores():
    """The paper's softmax: a key whose score is <= 0 still gets weight, and rows sum to 1."""
    m = make()
    q = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    w = attention_weights(q, k, encoding=m)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 3, 6, dtype=torch.float64))
    non_positive = (q @ k.transpose(-1, -2)) <= 0
    assert non_positive.any() and torch.all(w[non_positive] > 0)


def test_softmax_all_negative_row_is_uniform():
    """Every score <= 0: every logit is ReLU(.) * R^ = 0, so the softmax is uniform."""
    m = make()
    q = torch.randn(1, 3, 2, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 5, 4, dtype=torch.float64).abs()
    q[..., 0, :] = -1.0
    w = attention_weights(q, k, encoding=m)
    torch.testing.assert_close(w[..., 0, :], torch.full((1, 3, 5), 0.2, dtype=torch.float64))


def test_row_sum_rows_normalised():
    m = make(normalize="row_sum")
    q = torch.randn(2, 3, 6, 8, dtype=torch.float64)
    k = torch.randn(2, 3, 9, 8, dtype=torch.float64)
    w = attention_weights(q, k, encoding=m, causal=True)
    sums = w.sum(-1)
    assert torch.all(w >= 0)
    # rows sum to 1, except rows with no positive score, which are all zero
    no_positive = ((q @ k.transpose(-1, -2)) <= 0).all(-1)
    torch.testing.assert_close(sums, torch.where(no_positive, 0.0, 1.0).double())
    assert not no_positive.all()


def test_row_sum_all_zero_row_gives_zero_output_without_nan():
    m = make(normalize="row_sum")
    q = torch.randn(1, 3, 2, 4, dtype=torch.float64)
    k = torch.randn(1, 3, 5, 4, dtype=torch.float64)
    k = k.abs()
    q[..., 0, :] = -1.0  # every score of query 0 is negative, so ReLU zeroes its row
    v = torch.randn(1, 3, 5, 2, dtype=torch.float64, requires_grad=True)
    out = attention(q, k, v, encoding=m)
    assert torch.isfinite(out).all()
    assert torch.all(out[..., 0, :] == 0)
    out.sum().backward()
    assert torch.isfinite(v.grad).all()


@pytest.mark.parametrize("normalize", NORMALIZE)
def test_fully_masked_row_is_zero_without_nan(normalize):
    m = make(normalize=normalize)
    q = torch.randn(1, 3, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(1, 3, 5, 4, dtype=torch.float64)
    v = torch.randn(1, 3, 5, 2, dtype=torch.float64)
    keep = torch.ones(3, 5, dtype=torch.bool)
    keep[1] = False  # query 1 sees no key
    out = attention(q, k, v, encoding=m, bias=keep)
    assert torch.all(out[..., 1, :] == 0) and torch.isfinite(out).all()
    out.sum().backward()
    assert torch.isfinite(q.grad).all()


@pytest.mark.parametrize("normalize", NORMALIZE)
def test_distance_zero_and_w_zero_give_plain_relu_attention(normalize):
    m = DAAttention(2, normalize=normalize).double()  # w = 0: every coefficient is f(0) = 1
    q, k, v = (torch.randn(1, 2, 4, 3, dtype=torch.float64) for _ in range(3))
    a = torch.relu(q @ k.transpose(-1, -2))
    if normalize == "softmax":
        want = torch.softmax(a / math.sqrt(3), -1) @ v
    else:
        total = a.sum(-1, keepdim=True)
        want = torch.where(total > 0, a / total, 0.0) @ v
    torch.testing.assert_close(attention(q, k, v, encoding=m), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalize", NORMALIZE)
def test_masking_bias_is_respected(normalize):
    m = make(normalize=normalize)
    q, k, v = (torch.randn(1, 3, 4, 3, dtype=torch.float64) for _ in range(3))
    bias = torch.zeros(4, 4, dtype=torch.float64)
    bias[:, 1] = -math.inf
    w = attention_weights(q, k, encoding=m, bias=bias)
    assert torch.all(w[..., 1] == 0)
    torch.testing.assert_close(w, attention_weights(q, k, encoding=m, bias=bias != -math.inf))


@pytest.mark.parametrize("normalize", NORMALIZE)
def test_gradcheck_w_and_v(normalize):
    q = torch.randn(1, 2, 3, 4, dtype=torch.float64)
    k = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    val = torch.randn(1, 2, 5, 2, dtype=torch.float64)
    m = DAAttention(2, normalize=normalize).double()

    def f(w, v):
        return torch.func.functional_call(m, {"w": w, "v": v}, (q, k, val), {"causal": True})

    w0 = torch.tensor([-0.4, 0.3], dtype=torch.float64, requires_grad=True)
    v0 = torch.tensor([0.7, -1.2], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(f, (w0, v0))
    x = torch.randn(7, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(learnable_sigmoid, (x, v0[:1].detach().requires_grad_()))


@pytest.mark.parametrize("normalize", NORMALIZE)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_low_precision_inputs(normalize, dtype):
    m = make(normalize=normalize)
    q, k, v = (torch.randn(1, 3, 5, 4, dtype=torch.float64) for _ in range(3))
    want = attention(q, k, v, encoding=m, causal=True)
    got = attention(q.to(dtype), k.to(dtype), v.to(dtype), encoding=m, causal=True)
    assert got.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 1e-1
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol)


def test_validation():
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        DAAttention(0)
    with pytest.raises(ValueError, match="w_init must be finite"):
        DAAttention(2, w_init=math.inf)
    with pytest.raises(ValueError, match="normalize must be one of 'softmax', 'row_sum'"):
        DAAttention(2, normalize="relu")
    with pytest.raises(ValueError, match=r"DAAttention\(3\) needs q of shape \(..., num_heads=3"):
        attention(*(torch.randn(1, 2, 4, 3) for _ in range(3)), encoding=DAAttention(3))


def test_per_sample_positions_coefficients_by_loops():
    """Positions (batch, len): f(w_h |p_bi - s_bj|; v_h) per sample, heads before (q, k)."""
    m = make()
    q_pos = torch.tensor([[3, 4], [0, 9]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 5, 9]])
    coef = m.coefficients(q_pos, k_pos, torch.float64).detach()
    assert coef.shape == (2, 3, 2, 5)
    for b in range(2):
        for h in range(3):
            w, v = float(m.w[h].detach()), float(m.v[h].detach())
            for i in range(2):
                for j in range(5):
                    want = sigmoid_formula(w * abs(int(q_pos[b, i]) - int(k_pos[b, j])), v)
                    assert float(coef[b, h, i, j]) == pytest.approx(want, rel=1e-12)
