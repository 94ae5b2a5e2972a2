"""Tests for posenc.t5: relative-position buckets and the learned per-head bias."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc


def reference_bucket(rel, *, bidirectional, num_buckets, max_distance):
    """T5's bucket of ``rel = key - query`` in exact integer arithmetic (no logarithms).

    floor(L * log(n/E) / log(D/E)) is the largest m with (D/E)^m <= (n/E)^L,
    i.e. D^m * E^L <= n^L * E^m, which Python ints decide exactly.
    """
    per = num_buckets // 2 if bidirectional else num_buckets
    base = per if (bidirectional and rel > 0) else 0
    n = abs(rel) if bidirectional else max(-rel, 0)
    e = per // 2
    if n < e:
        return base + n
    span = per - e
    m = 0
    while m < span and max_distance ** (m + 1) * e**span <= n**span * e ** (m + 1):
        m += 1
    return base + min(e + m, per - 1)


def reference_attention(q, k, v, bias, *, causal, q_offset, scale):
    """Explicit float64 softmax loop; q (H, Lq, d), bias (H, Lq, Lk)."""
    heads, q_len, _ = q.shape
    k_len = k.shape[1]
    out = torch.zeros(heads, q_len, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        for i in range(q_len):
            scores = [
                -math.inf
                if causal and j > q_offset + i
                else scale * float(q[h, i] @ k[h, j]) + float(bias[h, i, j])
                for j in range(k_len)
            ]
            top = max(scores)
            w = [math.exp(s - top) for s in scores]
            for j in range(k_len):
                out[h, i] += w[j] / sum(w) * v[h, j].double()
    return out


# ---- buckets ----------------------------------------------------------------


def test_small_table_by_hand():
    # 8 buckets, 4 per direction, exact for distances 0 and 1, log buckets 2 and 3 up to 10.
    rel = torch.arange(-10, 11)
    want_bi = [3] * 6 + [2, 2, 2, 1, 0] + [5, 6, 6, 6] + [7] * 6
    got = posenc.t5_relative_bucket(rel, num_buckets=8, max_distance=10)
    assert got.tolist() == want_bi and got.dtype == torch.int64
    # Unidirectional: 8 buckets for the past (exact for 0..3), every future key in bucket 0.
    want_uni = [7, 7, 7, 6, 5, 4, 4, 3, 2, 1, 0] + [0] * 10
    got = posenc.t5_relative_bucket(rel, bidirectional=False, num_buckets=8, max_distance=10)
    assert got.tolist() == want_uni


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(
    ("num_buckets", "max_distance"), [(32, 128), (16, 64), (64, 256), (32, 100), (10, 30), (6, 7)]
)
def test_buckets_match_exact_integer_reference(bidirectional, num_buckets, max_distance):
    rel = torch.arange(-700, 701)
    got = posenc.t5_relative_bucket(
        rel, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    want = [
        reference_bucket(
            r, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
        )
        for r in rel.tolist()
    ]
    assert got.tolist() == want


def test_default_bidirectional_boundaries():
    # Defaults: 16 buckets per direction, exact below 8, bucket = 8 + floor(2 log2(n / 8)).
    b = lambda r: int(posenc.t5_relative_bucket(torch.tensor(r)))  # noqa: E731
    assert [b(-n) for n in (0, 7, 8, 11, 12, 15, 16, 127, 128, 10**6)] == [
        0, 7, 8, 8, 9, 9, 10, 15, 15, 15,
    ]  # fmt: skip
    assert b(1) == 17 and b(-1) == 1 and b(128) == 31


bucket_args = st.one_of(
    st.tuples(st.just(True), st.integers(2, 40).map(lambda h: 2 * h)),
    st.tuples(st.just(False), st.integers(2, 80)),
).flatmap(
    lambda t: st.tuples(
        st.just(t[0]),
        st.just(t[1]),
        st.integers((t[1] // 2 if t[0] else t[1]) // 2 + 1, 2000),
    )
)


@given(bucket_args)
def test_bucket_properties(args):
    bidirectional, num_buckets, max_distance = args
    kw = dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance)
    n = torch.arange(0, 3 * max_distance + 5)
    past = posenc.t5_relative_bucket(-n, **kw)
    future = posenc.t5_relative_bucket(n, **kw)
    per = num_buckets // 2 if bidirectional else num_buckets
    exact = per // 2
    for b in (past, future):
        assert int(b.min()) >= 0 and int(b.max()) < num_buckets
        assert bool((b[1:] >= b[:-1]).all())  # monotone in |distance| per direction
    assert past[:exact].tolist() == list(range(exact))  # exact region
    assert int(past[-1]) == per - 1  # saturates beyond max_distance
    assert bool((past[max_distance:] == per - 1).all())
    if bidirectional:
        # Positive offsets (key after query) use the upper half, mirrored.
        assert bool((future[1:] == past[1:] + per).all()) and int(future[0]) == 0
    else:
        assert bool((future == 0).all())


def test_bucket_keeps_shape_and_accepts_sequences():
    rel = torch.arange(-6, 6).reshape(3, 4)
    assert posenc.t5_relative_bucket(rel).shape == (3, 4)
    assert posenc.t5_relative_bucket([-3, 0, 3]).tolist() == [3, 0, 19]


@pytest.mark.parametrize(
    ("kw", "err", "match"),
    [
        (dict(num_buckets=0), ValueError, "num_buckets must be a positive integer"),
        (dict(num_buckets=31), ValueError, "num_buckets must be an even integer >= 4"),
        (dict(num_buckets=2), ValueError, "num_buckets must be an even integer >= 4"),
        (dict(num_buckets=1, bidirectional=False), ValueError, "num_buckets must be >= 2"),
        (dict(max_distance=8), ValueError, "max_distance must exceed the exact range"),
        (dict(max_distance=0), ValueError, "max_distance must be a positive integer"),
        (dict(bidirectional=1), TypeError, "bidirectional must be a bool"),
    ],
)
def test_bucket_rejects_bad_arguments(kw, err, match):
    with pytest.raises(err, match=match):
        posenc.t5_relative_bucket(torch.arange(3), **kw)
    with pytest.raises(err, match=match):
        posenc.T5RelativeBias(2, **kw)


def test_bucket_rejects_float_positions():
    with pytest.raises(TypeError, match="relative_position must hold integers"):
        posenc.t5_relative_bucket(torch.tensor([0.5]))


# ---- module -----------------------------------------------------------------


@pytest.mark.parametrize("bidirectional", [True, False])
def test_forward_is_lookup_of_key_minus_query(bidirectional):
    m = posenc.T5RelativeBias(3, bidirectional=bidirectional, num_buckets=8, max_distance=10)
    q_len, k_len, offset = 4, 15, 11
    got = m(q_len, k_len).detach()
    assert got.shape == (3, q_len, k_len)
    for h in range(3):
        for i in range(q_len):
            for j in range(k_len):
                bucket = reference_bucket(
                    j - (offset + i), bidirectional=bidirectional, num_buckets=8, max_distance=10
                )
                assert float(got[h, i, j]) == float(m.weight[bucket, h].detach())
    torch.testing.assert_close(m(4, 15, q_offset=2), m(13, 15)[:, 0:4], rtol=0, atol=0)
    assert m(5).shape == (3, 5, 5)


def test_gradcheck_and_scheme_gradient():
    m = posenc.T5RelativeBias(2, num_buckets=8, max_distance=10).double()
    q = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 6, 4, dtype=torch.float64)
    v = torch.randn(2, 6, 4, dtype=torch.float64)
    w = m.weight.detach().clone().requires_grad_(True)

    def through_attention(w, q):
        bias = torch.func.functional_call(m, {"weight": w}, (3, 6))
        return posenc.attention(q, k, v, bias=bias, causal=True)

    assert torch.autograd.gradcheck(through_attention, (w, q))
    # The scheme hook gives the same output and the same weight gradient as the explicit bias.
    out = posenc.attention(q, k, v, encoding=m, causal=True)
    torch.testing.assert_close(out, through_attention(m.weight, q), rtol=1e-14, atol=1e-14)
    g = torch.randn_like(out)
    (grad_hook,) = torch.autograd.grad(out, m.weight, g)
    (grad_bias,) = torch.autograd.grad(through_attention(w, q), w, g)
    torch.testing.assert_close(grad_hook, grad_bias, rtol=1e-12, atol=1e-12)
    assert grad_hook.abs().sum() > 0


@pytest.mark.parametrize(
    ("causal", "q_len", "k_len", "q_offset", "scale"),
    [
        (False, 5, 5, None, None),
        (True, 3, 8, None, None),
        (True, 4, 9, 2, 1.0),
        (False, 4, 6, 1, 1.0),
    ],
)
def test_scheme_matches_explicit_softmax_loop(causal, q_len, k_len, q_offset, scale):
    m = posenc.T5RelativeBias(2, num_buckets=8, max_distance=6, init_std=1.0).double()
    q = torch.randn(2, q_len, 8, dtype=torch.float64)
    k = torch.randn(2, k_len, 8, dtype=torch.float64)
    v = torch.randn(2, k_len, 3, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=m, causal=causal, q_offset=q_offset, scale=scale)
    o = k_len - q_len if q_offset is None else q_offset
    bias = torch.empty(2, q_len, k_len, dtype=torch.float64)
    for h in range(2):
        for i in range(q_len):
            for j in range(k_len):
                b = reference_bucket(j - (o + i), bidirectional=True, num_buckets=8, max_distance=6)
                bias[h, i, j] = m.weight[b, h]
    s = 1 / math.sqrt(8) if scale is None else scale
    want = reference_attention(q, k, v, bias.detach(), causal=causal, q_offset=o, scale=s)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_scheme_rejects_mismatched_heads_and_bad_sizes():
    m = posenc.T5RelativeBias(4)
    q = torch.randn(3, 5, 8)
    with pytest.raises(ValueError, match="num_heads=4"):
        posenc.attention(q, q, q, encoding=m)
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        posenc.T5RelativeBias(0)
    with pytest.raises(ValueError, match="q_len must be a positive integer"):
        m(0)


def test_per_sample_positions_bias_by_loops():
    """Positions (batch, len): weight[bucket(s_bj - p_bi), h] per sample, heads before (q, k)."""
    m = posenc.T5RelativeBias(3, num_buckets=8, max_distance=20).double()
    q_pos = torch.tensor([[3, 4], [0, 30]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 5, 9]])
    bias = m.bias_from_positions(q_pos, k_pos).detach()
    assert bias.shape == (2, 3, 2, 5)
    for b in range(2):
        for i in range(2):
            for j in range(5):
                rel = int(k_pos[b, j]) - int(q_pos[b, i])
                bucket = int(posenc.t5_relative_bucket([rel], num_buckets=8, max_distance=20)[0])
                for h in range(3):
                    assert float(bias[b, h, i, j]) == float(m.weight[bucket, h].detach())


def test_the_old_positional_bias_form_warns_and_still_works():
    q, pos = torch.randn(1, 2, 3, 4), torch.arange(3)
    t5 = posenc.T5RelativeBias(2)
    with pytest.warns(DeprecationWarning, match=r"T5RelativeBias\.bias\(q, k, q_positions"):
        old = t5.bias(q, q, pos, pos, 1.0)
    assert torch.equal(old, t5.bias(q, q, posenc.CallContext.of(q, q, scale=1.0)))
