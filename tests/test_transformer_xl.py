"""Tests for posenc.transformer_xl (Dai et al., 2019)."""

import math

import pytest
import torch

from posenc import (
    TransformerXLAttention,
    TransformerXLScheme,
    attention,
    rel_shift,
    relative_sinusoids,
)


def shifted_by_formula(x):
    """y[..., i, j] = x[..., i, j + q_len - 1 - i] where that column exists, else NaN."""
    q_len, k_len = x.shape[-2:]
    y = torch.full_like(x, math.nan)
    for i in range(q_len):
        for j in range(k_len):
            r = j + q_len - 1 - i
            if r < k_len:
                y[..., i, j] = x[..., i, r]
    return y


# --- rel_shift ---------------------------------------------------------------------------------


def test_rel_shift_small_matrix():
    """3 queries, 4 keys: row i of x lists distances 3, 2, 1, 0; y puts distance m + i - j at j."""
    x = torch.tensor(
        [[0.3, 0.2, 0.1, 0.0], [1.3, 1.2, 1.1, 1.0], [2.3, 2.2, 2.1, 2.0]], dtype=torch.float64
    )
    y = rel_shift(x)
    # query i sits at position 1 + i; key j at j; distance 1 + i - j, value i + distance / 10
    for i in range(3):
        for j in range(4):
            if j <= i + 1:
                assert y[i, j] == pytest.approx(i + (1 + i - j) / 10, abs=1e-15)


@pytest.mark.parametrize(("q_len", "k_len"), [(1, 1), (1, 5), (4, 4), (3, 7), (5, 9), (6, 6)])
def test_rel_shift_matches_index_formula(q_len, k_len):
    x = torch.randn(2, 3, q_len, k_len, dtype=torch.float64)
    y = rel_shift(x)
    want = shifted_by_formula(x)
    keep = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + k_len - q_len
    assert y.shape == x.shape
    assert torch.equal(y[..., keep], want[..., keep])  # a pure data movement: exact
    assert torch.isfinite(y).all()  # the unspecified entries are still finite


def test_rel_shift_not_the_other_way_round():
    """The mirrored shift (labml#185) disagrees with the formula on the kept entries."""
    x = torch.randn(4, 6, dtype=torch.float64)
    mirrored = torch.nn.functional.pad(x, (0, 1)).reshape(6 + 1, 4)[:-1].reshape(4, 6)
    keep = torch.arange(6)[None, :] <= torch.arange(4)[:, None] + 2
    assert not torch.equal(mirrored[keep], rel_shift(x)[keep])


def test_rel_shift_rejects_bad_input():
    with pytest.raises(ValueError, match="x must have at least 2 dimensions"):
        rel_shift(torch.zeros(3))
    with pytest.raises(TypeError, match="x must be a floating-point"):
        rel_shift(torch.zeros(3, 3, dtype=torch.long))


def test_relative_sinusoids_concat_layout_and_sign():
    d = torch.tensor([3, 0, -2, 5])
    r = relative_sinusoids(d, 6, dtype=torch.float64)
    for row, dist in enumerate(d.tolist()):
        for i in range(3):
            w = 10000.0 ** (-2 * i / 6)
            assert r[row, i] == pytest.approx(math.sin(dist * w), abs=1e-15)
            assert r[row, 3 + i] == pytest.approx(math.cos(dist * w), abs=1e-15)
    with pytest.raises(ValueError, match="dim must be an even integer"):
        relative_sinusoids(d, 5)
    with pytest.raises(TypeError, match="distances must hold integers"):
        relative_sinusoids(d.double(), 6)


# --- the module --------------------------------------------------------------------------------


def make(d_model=8, heads=2, head_dim=3, **kw):
    torch.manual_seed(1)
    m = TransformerXLAttention(d_model, heads, head_dim, **kw).double()
    with torch.no_grad():  # larger biases than the init, so every term matters
        m.scheme.u.normal_()
        m.scheme.v.normal_()
    return m


def explicit_logits(m, x, mems):
    """Scaled four-term logits from the paper's formula, one (i, j) pair at a time."""
    ctx = x if mems is None else torch.cat([mems, x], 1)
    H, dh, d_model = m.num_heads, m.head_dim, m.d_model
    q = (x @ m.w_q.weight.T).view(*x.shape[:2], H, dh)
    k = (ctx @ m.w_ke.weight.T).view(*ctx.shape[:2], H, dh)
    u, v, w_r = m.scheme.u, m.scheme.v, m.scheme.w_kr.weight
    q_len, k_len, off = x.shape[1], ctx.shape[1], ctx.shape[1] - x.shape[1]
    out = torch.zeros(x.shape[0], H, q_len, k_len, dtype=torch.float64)
    for i in range(q_len):
        for j in range(k_len):
            dist = off + i - j
            r = torch.tensor(
                [math.sin(dist * 10000.0 ** (-2 * t / d_model)) for t in range(d_model // 2)]
                + [math.cos(dist * 10000.0 ** (-2 * t / d_model)) for t in range(d_model // 2)],
                dtype=torch.float64,
            )
            rk = (w_r @ r).view(H, dh)
            s = ((q[:, i] + u) * k[:, j]).sum(-1) + ((q[:, i] + v) * rk).sum(-1)
            out[:, :, i, j] = s / math.sqrt(dh)
    return out


def explicit_forward(m, x, mems):
    ctx = x if mems is None else torch.cat([mems, x], 1)
    logits = explicit_logits(m, x, mems)
    q_len, k_len = x.shape[1], ctx.shape[1]
    keep = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + k_len - q_len
    w = torch.softmax(logits.masked_fill(~keep, -math.inf), -1)
    val = (ctx @ m.w_v.weight.T).view(*ctx.shape[:2], m.num_heads, m.head_dim).transpose(1, 2)
    out = (w @ val).transpose(1, 2).reshape(x.shape[0], q_len, -1)
    return out @ m.w_o.weight.T


@pytest.mark.parametrize("mem", [0, 3])
def test_forward_matches_explicit_formula(mem):
    m = make()
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    mems = torch.randn(2, mem, 8, dtype=torch.float64) if mem else None
    out, _ = m(x, mems)
    torch.testing.assert_close(out, explicit_forward(m, x, mems), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mem", [0, 2])
def test_four_terms_sum_to_fast_form(mem):
    m = make()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    mems = torch.randn(2, mem, 8, dtype=torch.float64) if mem else None
    a, b, c, d = m.score_terms(x, mems)
    k_len = 5 + mem
    assert a.shape == b.shape == c.shape == d.shape == (2, 2, 5, k_len)
    keep = torch.arange(k_len)[None, :] <= torch.arange(5)[:, None] + mem
    logits = (a + b + c + d) / math.sqrt(m.head_dim)
    torch.testing.assert_close(
        logits[..., keep], explicit_logits(m, x, mems)[..., keep], rtol=1e-12, atol=1e-12
    )
    # the fast form: (a)+(c) as (q+u)k^T, (b)+(d) as rel_shift((q+v)(W_R R)^T)
    q, k, _ = m.project(x, mems)
    u, v = m.scheme.u[:, None, :], m.scheme.v[:, None, :]
    ac = (q + u) @ k.transpose(-1, -2)
    bd = m.scheme.position_scores(q + v, k_len, mem, causal=True)
    torch.testing.assert_close((a + c)[..., keep], ac[..., keep], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close((b + d)[..., keep], bd[..., keep], rtol=1e-12, atol=1e-12)
    # and each term on its own means what it says
    torch.testing.assert_close(a, q @ k.transpose(-1, -2), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(c, (u @ k.transpose(-1, -2)).expand_as(c), rtol=1e-12, atol=1e-12)
    assert torch.allclose(d[0], d[1])  # (d) does not depend on content
    # (d) depends on i - j only
    for i in range(1, 5):
        for j in range(1, k_len):
            torch.testing.assert_close(d[..., i, j], d[..., i - 1, j - 1])


def test_memory_equals_rows_of_attention_over_the_concatenation():
    m = make()
    seg1 = torch.randn(2, 3, 8, dtype=torch.float64)
    seg2 = torch.randn(2, 4, 8, dtype=torch.float64)
    full, _ = m(torch.cat([seg1, seg2], 1))
    out1, mems = m(seg1)
    out2, _ = m(seg2, mems)
    torch.testing.assert_close(out1, full[:, :3], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out2, full[:, 3:], rtol=1e-12, atol=1e-12)


def test_new_mems_are_detached_and_sized():
    m = make(mem_len=5)
    x = torch.randn(2, 3, 8, dtype=torch.float64, requires_grad=True)
    out, mems = m(x)
    assert mems.shape == (2, 3, 8) and not mems.requires_grad
    out2, mems2 = m(torch.randn(2, 4, 8, dtype=torch.float64), mems)
    assert mems2.shape == (2, 5, 8)
    torch.testing.assert_close(mems2[:, :1], x[:, 2:].detach())
    out2.sum().backward()  # no gradient reaches the previous segment through the memory
    assert x.grad is None
    _, none = make(mem_len=0)(x)
    assert none.shape == (2, 0, 8)
    _, default = make()(x)
    assert torch.equal(default, x.detach())


def test_gradcheck_all_parameters():
    m = make(d_model=4, heads=2, head_dim=2)
    x = torch.randn(1, 3, 4, dtype=torch.float64)
    mems = torch.randn(1, 2, 4, dtype=torch.float64)
    params = [m.scheme.u, m.scheme.v, m.scheme.w_kr.weight, m.w_q.weight, m.w_ke.weight]

    def f(u, v, w_r, w_q, w_k):
        return torch.func.functional_call(
            m,
            {
                "scheme.u": u,
                "scheme.v": v,
                "scheme.w_kr.weight": w_r,
                "w_q.weight": w_q,
                "w_ke.weight": w_k,
            },
            (x, mems),
        )[0]

    assert torch.autograd.gradcheck(f, [p.detach().clone().requires_grad_() for p in params])


# --- the scheme through posenc.attention ------------------------------------------------------


def scheme_reference(s, q, k, v, causal, q_offset):
    """The four-term logits with distance q_offset + i - j, from the formula, in a loop."""
    H, q_len, k_len, dh = q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]
    logits = torch.zeros(*q.shape[:-1], k_len, dtype=torch.float64)
    for i in range(q_len):
        for j in range(k_len):
            dist = q_offset + i - j
            r = relative_sinusoids(torch.tensor([dist]), s.d_model, dtype=torch.float64)[0]
            rk = (s.w_kr.weight @ r).view(H, dh)
            logits[..., i, j] = ((q[..., i, :] + s.u) * k[..., j, :]).sum(-1) + (
                (q[..., i, :] + s.v) * rk
            ).sum(-1)
    logits = logits / math.sqrt(dh)
    if causal:
        keep = torch.arange(k_len)[None, :] <= torch.arange(q_len)[:, None] + q_offset
        logits = logits.masked_fill(~keep, -math.inf)
    return torch.softmax(logits, -1) @ v


@pytest.mark.parametrize(
    ("causal", "q_len", "k_len", "q_offset"),
    [(True, 4, 6, None), (True, 3, 6, 1), (True, 2, 5, 7), (False, 4, 6, None), (False, 3, 5, -2)],
)
def test_scheme_through_attention(causal, q_len, k_len, q_offset):
    s = TransformerXLScheme(2, 3, d_model=6).double()
    with torch.no_grad():
        s.u.normal_()
        s.v.normal_()
    q = torch.randn(2, 2, q_len, 3, dtype=torch.float64)
    k = torch.randn(2, 2, k_len, 3, dtype=torch.float64)
    v = torch.randn(2, 2, k_len, 4, dtype=torch.float64)
    got = attention(q, k, v, encoding=s, causal=causal, q_offset=q_offset)
    off = k_len - q_len if q_offset is None else q_offset
    want = scheme_reference(s, q, k, v, causal, off)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_scheme_float32_close_to_float64():
    s = TransformerXLScheme(2, 4).double()
    q, k, v = (torch.randn(1, 2, 6, 4, dtype=torch.float64) for _ in range(3))
    want = attention(q, k, v, encoding=s, causal=True)
    got = attention(q.float(), k.float(), v.float(), encoding=s, causal=True)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


# --- validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_heads": 0}, ValueError, "num_heads must be a positive integer"),
        ({"head_dim": -1}, ValueError, "head_dim must be a positive integer"),
        ({"d_model": 7}, ValueError, "d_model must be an even integer"),
        ({"mem_len": -1}, ValueError, "mem_len must be a non-negative integer"),
        ({"num_heads": 2.0}, TypeError, "num_heads must be an integer"),
    ],
)
def test_module_validation(kwargs, error, match):
    args = {"d_model": 8, "num_heads": 2, "head_dim": 3} | kwargs
    mem_len = args.pop("mem_len", None)
    with pytest.raises(error, match=match):
        TransformerXLAttention(**args, mem_len=mem_len)


def test_forward_validation():
    m = make()
    with pytest.raises(ValueError, match="x must have shape"):
        m(torch.randn(2, 4, 6, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must hold at least one position"):
        m(torch.randn(2, 0, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="mems must have shape"):
        m(torch.randn(2, 4, 8, dtype=torch.float64), torch.randn(3, 2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="TransformerXLScheme needs q of shape"):
        attention(*(torch.randn(1, 3, 4, 3) for _ in range(3)), encoding=m.scheme.float())
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        TransformerXLScheme(0, 4)
