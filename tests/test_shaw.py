"""Tests for posenc.shaw: edge labels and attention with relative key/value representations."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc


def naive_shaw(q, k, v, a_k, a_v, *, max_distance, causal, q_offset, scale, bias=None):
    """Per-pair float64 loops straight from Shaw et al. eqs. (3)-(5); q (H, Lq, d)."""
    heads, q_len, d = q.shape
    k_len = k.shape[1]
    out = torch.zeros(heads, q_len, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        for i in range(q_len):
            labels, scores = [], []
            for j in range(k_len):
                r = min(max(j - (q_offset + i), -max_distance), max_distance) + max_distance
                labels.append(r)
                if causal and j > q_offset + i:
                    scores.append(-math.inf)
                    continue
                e = scale * (float(q[h, i] @ k[h, j]) + float(q[h, i] @ a_k[r]))
                scores.append(e + (0.0 if bias is None else float(bias[i, j])))
            top = max(scores)
            w = [math.exp(s - top) for s in scores]
            for j in range(k_len):
                value = v[h, j].double() + (0 if a_v is None else a_v[labels[j]].double())
                out[h, i] += w[j] / sum(w) * value
    return out


# ---- indices ----------------------------------------------------------------


def test_indices_by_hand():
    # k_len = 4, q_len = 2: queries at positions 2 and 3; labels clip(j - p, -1, 1) + 1.
    got = posenc.shaw_relative_indices(2, 4, 1)
    assert got.tolist() == [[0, 0, 1, 2], [0, 0, 0, 1]] and got.dtype == torch.int64
    assert posenc.shaw_relative_indices(3, 3, 5).tolist() == [[5, 6, 7], [4, 5, 6], [3, 4, 5]]


@given(
    q_len=st.integers(0, 12),
    k_len=st.integers(0, 12),
    k=st.integers(0, 6),
    offset=st.one_of(st.none(), st.integers(-5, 15)),
)
def test_indices_match_definition(q_len, k_len, k, offset):
    got = posenc.shaw_relative_indices(q_len, k_len, k, q_offset=offset)
    assert got.shape == (q_len, k_len)
    o = k_len - q_len if offset is None else offset
    for i in range(q_len):
        for j in range(k_len):
            assert int(got[i, j]) == min(max(j - (o + i), -k), k) + k


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((-1, 3, 2), "q_len must be a non-negative integer"),
        ((3, -1, 2), "k_len must be a non-negative integer"),
        ((3, 3, -2), "max_distance must be a non-negative integer"),
    ],
)
def test_indices_reject_negative(args, match):
    with pytest.raises(ValueError, match=match):
        posenc.shaw_relative_indices(*args)


# ---- attention --------------------------------------------------------------


def make(head_dim=6, max_distance=2, values=True):
    return posenc.ShawRelativeAttention(
        head_dim, max_distance, values=values, init_std=1.0
    ).double()


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize(
    ("q_len", "k_len", "causal", "q_offset", "scale"),
    [
        (5, 5, False, None, None),
        (5, 5, True, None, None),
        (2, 7, True, None, None),
        (3, 8, True, 2, 0.7),
        (4, 6, False, 0, None),
    ],
)
def test_matches_naive_per_pair_loops(values, q_len, k_len, causal, q_offset, scale):
    m = make(values=values)
    q = torch.randn(2, q_len, 6, dtype=torch.float64)
    k = torch.randn(2, k_len, 6, dtype=torch.float64)
    v = torch.randn(2, k_len, 6, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=m, causal=causal, q_offset=q_offset, scale=scale)
    o = k_len - q_len if q_offset is None else q_offset
    a_v = m.value_embeddings.detach() if values else None
    want = naive_shaw(
        q, k, v, m.key_embeddings.detach(), a_v, max_distance=2, causal=causal, q_offset=o,
        scale=1 / math.sqrt(6) if scale is None else scale,
    )  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("values", [True, False])
@pytest.mark.parametrize(("q_len", "k_len", "causal"), [(5, 5, False), (3, 7, True)])
def test_attention_weights_are_the_softmax_weights(values, q_len, k_len, causal):
    # The value term shifts the output, not the weights; k_len != head_dim on purpose.
    m = make(values=values)
    q = torch.randn(2, q_len, 6, dtype=torch.float64)
    k = torch.randn(2, k_len, 6, dtype=torch.float64)
    v = torch.randn(2, k_len, 6, dtype=torch.float64)
    got = posenc.attention_weights(q, k, encoding=m, causal=causal)
    eye = torch.eye(k_len, dtype=torch.float64).expand(2, k_len, k_len)
    want = naive_shaw(
        q, k, eye, m.key_embeddings.detach(), None, max_distance=2, causal=causal,
        q_offset=k_len - q_len, scale=1 / math.sqrt(6),
    )  # fmt: skip
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    # and the output decomposes as alpha @ v plus the label-binned value embeddings
    out = posenc.attention(q, k, v, encoding=m, causal=causal)
    labels = posenc.shaw_relative_indices(q_len, k_len, 2)
    a_v = m.value_embeddings.detach()[labels] if values else torch.zeros(q_len, k_len, 6)
    extra = torch.einsum("hij,ijd->hid", want, a_v.double())
    torch.testing.assert_close(out, want @ v + extra, rtol=1e-12, atol=1e-12)


def test_external_bias_float_and_bool():
    m = make()
    q, k, v = (torch.randn(2, 4, 6, dtype=torch.float64) for _ in range(3))
    bias = torch.randn(4, 4, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=m, bias=bias)
    a_k, a_v = m.key_embeddings.detach(), m.value_embeddings.detach()
    kw = dict(max_distance=2, causal=False, q_offset=0, scale=1 / math.sqrt(6))
    torch.testing.assert_close(got, naive_shaw(q, k, v, a_k, a_v, bias=bias, **kw))
    keep = torch.rand(4, 4) > 0.3
    keep[:, 0] = True
    got = posenc.attention(q, k, v, encoding=m, bias=keep)
    masked = torch.zeros(4, 4, dtype=torch.float64).masked_fill(~keep, -math.inf)
    torch.testing.assert_close(got, naive_shaw(q, k, v, a_k, a_v, bias=masked, **kw))


def test_batch_dims_and_float32():
    m = posenc.ShawRelativeAttention(8, 3)
    q, k, v = (torch.randn(2, 3, 5, 8) for _ in range(3))
    got = posenc.attention(q, k, v, encoding=m, causal=True)
    want = posenc.attention(q.double(), k.double(), v.double(), encoding=m.double(), causal=True)
    assert got.dtype == torch.float32 and got.shape == (2, 3, 5, 8)
    torch.testing.assert_close(got, want.float(), rtol=1e-5, atol=1e-5)
    # Each batch element and head is the same computation with shared embeddings.
    one = posenc.attention(
        q[1, 2].double(), k[1, 2].double(), v[1, 2].double(), encoding=m, causal=True
    )
    torch.testing.assert_close(want[1, 2], one, rtol=1e-12, atol=1e-12)


def test_far_keys_share_the_clipped_label():
    # The query sits at position 5; keys 0..3 are >= 2 behind it, at or beyond max_distance = 2,
    # so they share one label: with identical content they get identical weights.
    m = make(max_distance=2, values=False)
    q = torch.randn(1, 1, 6, dtype=torch.float64)
    k = torch.randn(1, 6, 6, dtype=torch.float64)
    k[:, 1:4] = k[:, 0:1]
    w = posenc.attention_weights(q, k, encoding=m)[0, 0].detach()
    torch.testing.assert_close(w[1:4], w[0:1].expand(3), rtol=1e-14, atol=0)
    # Closer keys (distances 1 and 0) have their own labels: same content, different weights.
    k[:, 4:6] = k[:, 0:1]
    w = posenc.attention_weights(q, k, encoding=m)[0, 0].detach()
    assert abs(float(w[4] - w[0])) > 1e-6 and abs(float(w[5] - w[4])) > 1e-6


def test_gradcheck():
    m = posenc.ShawRelativeAttention(3, 2).double()
    q = torch.randn(2, 3, 3, dtype=torch.float64, requires_grad=True)
    k = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    v = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    a_k = m.key_embeddings.detach().clone().requires_grad_(True)
    a_v = m.value_embeddings.detach().clone().requires_grad_(True)

    def f(q, k, v, a_k, a_v):
        params = {"key_embeddings": a_k, "value_embeddings": a_v}
        with torch.nn.utils.stateless._reparametrize_module(m, params):
            return posenc.attention(q, k, v, encoding=m, causal=True)

    assert torch.autograd.gradcheck(f, (q, k, v, a_k, a_v))


def test_bad_input():
    with pytest.raises(ValueError, match="max_distance must be a positive integer"):
        posenc.ShawRelativeAttention(8, 0)
    with pytest.raises(ValueError, match="head_dim must be a positive integer"):
        posenc.ShawRelativeAttention(0, 2)
    with pytest.raises(TypeError, match="values must be a bool"):
        posenc.ShawRelativeAttention(8, 2, values="yes")
    m = posenc.ShawRelativeAttention(8, 2)
    q = torch.randn(2, 4, 6)
    with pytest.raises(ValueError, match="q must have head_dim=8"):
        posenc.attention(q, q, q, encoding=m)
    q, v = torch.randn(2, 4, 8), torch.randn(2, 4, 5)
    with pytest.raises(ValueError, match="v must have head_dim=8"):
        posenc.attention(q, q, v, encoding=m)
    with pytest.raises(ValueError, match="q_len <= k_len"):
        posenc.attention(
            torch.randn(5, 8), torch.randn(3, 8), torch.randn(3, 8), encoding=m, causal=True
        )


def test_per_sample_positions_key_term_by_loops():
    """Positions (batch, len): scale * q_bhi . a^K[clip(s_bj - p_bi)] per sample."""
    m = make(head_dim=4, max_distance=2)
    q = torch.randn(2, 3, 2, 4, dtype=torch.float64)
    q_pos = torch.tensor([[3, 4], [0, 9]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 5, 9]])
    ctx = posenc.CallContext.of(q, q, q_positions=q_pos, k_positions=k_pos, scale=0.5)
    bias = m.bias(q, q, ctx).detach()
    a_k = m.key_embeddings.detach()
    assert bias.shape == (2, 3, 2, 5)
    for b in range(2):
        for h in range(3):
            for i in range(2):
                for j in range(5):
                    label = max(-2, min(2, int(k_pos[b, j]) - int(q_pos[b, i]))) + 2
                    want = 0.5 * sum(
                        float(x) * float(y) for x, y in zip(q[b, h, i], a_k[label], strict=True)
                    )
                    assert float(bias[b, h, i, j]) == pytest.approx(want, abs=1e-12)


def test_the_old_positional_bias_form_warns_and_still_works():
    m = make(head_dim=4, max_distance=2)
    q, pos = torch.randn(1, 3, 3, 4), torch.arange(3)
    with pytest.warns(DeprecationWarning, match=r"ShawRelativeAttention\.bias\(q, k, q_pos"):
        old = m.bias(q, q, pos, pos, 0.5)
    assert torch.equal(old, m.bias(q, q, posenc.CallContext.of(q, q, scale=0.5)))
