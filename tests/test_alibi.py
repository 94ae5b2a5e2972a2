"""Tests for posenc.alibi: slopes, biases and the ALiBi attention scheme."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc


def reference_slopes(n):
    """The rule of the paper's code, written from its description (recursive on 2P)."""
    if math.log2(n).is_integer():
        return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]
    p = 2 ** math.floor(math.log2(n))
    return reference_slopes(p) + reference_slopes(2 * p)[0::2][: n - p]


def reference_attention(q, k, v, slopes, *, causal, q_offset):
    """Explicit float64 softmax loop with the symmetric ALiBi bias; q (H, Lq, d)."""
    heads, q_len, d = q.shape
    k_len = k.shape[1]
    out = torch.zeros(heads, q_len, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        for i in range(q_len):
            scores = []
            for j in range(k_len):
                if causal and j > q_offset + i:
                    scores.append(-math.inf)
                    continue
                s = float(q[h, i] @ k[h, j]) / math.sqrt(d)
                scores.append(s - float(slopes[h]) * abs(q_offset + i - j))
            top = max(scores)
            w = [math.exp(s - top) for s in scores]
            total = sum(w)
            for j in range(k_len):
                out[h, i] += w[j] / total * v[h, j].double()
    return out


# ---- slopes -----------------------------------------------------------------


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16, 32, 64])
def test_slopes_power_of_two_are_the_papers_geometric_sequence(n):
    got = posenc.alibi_slopes(n)
    want = torch.tensor([2.0 ** (-8.0 * h / n) for h in range(1, n + 1)], dtype=torch.float64)
    assert got.dtype == torch.float64 and got.shape == (n,)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)


def test_slopes_for_eight_heads_by_hand():
    torch.testing.assert_close(
        posenc.alibi_slopes(8), torch.tensor([2.0**-h for h in range(1, 9)], dtype=torch.float64)
    )


def test_slopes_for_twelve_heads_by_hand():
    # 8 slopes 2^-1..2^-8, then the odd-indexed slopes of 16 heads: 2^-0.5, 2^-1.5, ...
    exponents = [1, 2, 3, 4, 5, 6, 7, 8, 0.5, 1.5, 2.5, 3.5]
    want = torch.tensor([2.0**-e for e in exponents], dtype=torch.float64)
    torch.testing.assert_close(posenc.alibi_slopes(12), want, rtol=1e-15, atol=0)


@pytest.mark.parametrize("n", range(1, 70))
def test_slopes_follow_reference_rule(n):
    want = torch.tensor(reference_slopes(n), dtype=torch.float64)
    torch.testing.assert_close(posenc.alibi_slopes(n), want, rtol=1e-15, atol=0)


@given(st.integers(0, 9))
def test_power_of_two_slopes_geometric_decreasing_in_unit_interval(e):
    n = 2**e
    s = posenc.alibi_slopes(n)
    assert bool(((s > 0) & (s < 1)).all())
    assert bool((s[1:] < s[:-1]).all())
    # Start and ratio are both 2^(-8/n).
    ratio = 2.0 ** (-8.0 / n)
    assert abs(float(s[0]) - ratio) < 1e-15
    torch.testing.assert_close(s[1:] / s[:-1], torch.full((n - 1,), ratio, dtype=torch.float64))


@given(st.integers(1, 300))
def test_slopes_any_count_blocks_decreasing_distinct_in_unit_interval(n):
    s = posenc.alibi_slopes(n)
    p = 2 ** (n.bit_length() - 1)
    assert bool(((s > 0) & (s < 1)).all())
    assert len(set(s.tolist())) == n  # no two heads share a slope
    head, tail = s[:p], s[p:]
    torch.testing.assert_close(head, posenc.alibi_slopes(p), rtol=0, atol=0)
    assert bool((head[1:] < head[:-1]).all()) and bool((tail[1:] < tail[:-1]).all())
    # Each extra slope is the geometric mean of two neighbours of the first block.
    for r, t in enumerate(tail.tolist()):
        upper = 1.0 if r == 0 else float(head[r - 1])
        assert abs(t - math.sqrt(upper * float(head[r]))) < 1e-15


def test_slopes_not_monotone_overall_for_non_power_of_two():
    # Documented behaviour: the reference rule interleaves, it does not sort.
    s = posenc.alibi_slopes(12)
    assert float(s[8]) > float(s[0])


@pytest.mark.parametrize("bad", [0, -3])
def test_slopes_reject_non_positive_heads(bad):
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        posenc.alibi_slopes(bad)


def test_slopes_reject_non_integer_heads():
    with pytest.raises(TypeError, match="num_heads must be an integer"):
        posenc.alibi_slopes(4.0)


# ---- bias -------------------------------------------------------------------


@pytest.mark.parametrize(("heads", "q_len", "k_len"), [(4, 5, 5), (3, 2, 7), (6, 1, 9)])
def test_symmetric_bias_golden_loops(heads, q_len, k_len):
    slopes = reference_slopes(heads)
    want = torch.empty(heads, q_len, k_len, dtype=torch.float64)
    for h in range(heads):
        for i in range(q_len):
            for j in range(k_len):
                want[h, i, j] = -slopes[h] * abs((k_len - q_len + i) - j)
    got = posenc.alibi_bias(heads, q_len, k_len, causal=False, dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-15, atol=0)


def test_symmetric_bias_with_explicit_offset_and_default_k_len():
    got = posenc.alibi_bias(2, 3, 6, causal=False, q_offset=1, dtype=torch.float64)
    for i in range(3):
        for j in range(6):
            assert float(got[1, i, j]) == -(2.0**-8) * abs(1 + i - j)
    assert posenc.alibi_bias(2, 4).shape == (2, 4, 4)


def test_bias_is_rounded_once_from_float64():
    b64 = posenc.alibi_bias(12, 50, 300, causal=False, dtype=torch.float64)
    b32 = posenc.alibi_bias(12, 50, 300, causal=False)
    assert b32.dtype == torch.float32
    assert torch.equal(b32, b64.to(torch.float32))
    assert not bool(torch.signbit(b64).logical_and(b64 == 0).any())  # +0.0 on the diagonal


@given(
    heads=st.integers(1, 12),
    q_len=st.integers(1, 8),
    extra=st.integers(0, 8),
    offset=st.one_of(st.none(), st.integers(0, 10)),
)
def test_causal_bias_differs_only_by_row_constant_on_attended_entries(heads, q_len, extra, offset):
    k_len = q_len + extra
    cheap = posenc.alibi_bias(
        heads, q_len, k_len, causal=True, q_offset=offset, dtype=torch.float64
    )
    sym = posenc.alibi_bias(heads, q_len, k_len, causal=False, q_offset=offset, dtype=torch.float64)
    assert cheap.shape == sym.shape == (heads, q_len, k_len)
    o = k_len - q_len if offset is None else offset
    for h in range(heads):
        for i in range(q_len):
            attended = [j for j in range(k_len) if j <= o + i]
            diffs = [float(cheap[h, i, j] - sym[h, i, j]) for j in attended]
            assert max(diffs) - min(diffs) < 1e-12


@given(heads=st.integers(1, 6), q_len=st.integers(1, 6), extra=st.integers(0, 6))
def test_causal_and_symmetric_bias_give_same_attention(heads, q_len, extra):
    k_len = q_len + extra
    q = torch.randn(heads, q_len, 4, dtype=torch.float64)
    k = torch.randn(heads, k_len, 4, dtype=torch.float64)
    v = torch.randn(heads, k_len, 3, dtype=torch.float64)
    outs = [
        posenc.attention(
            q,
            k,
            v,
            bias=posenc.alibi_bias(heads, q_len, k_len, causal=c, dtype=q.dtype),
            causal=True,
        )
        for c in (True, False)
    ]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-12, atol=1e-12)


def test_bias_errors():
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        posenc.alibi_bias(0, 4)
    with pytest.raises(ValueError, match="q_len <= k_len"):
        posenc.alibi_bias(2, 5, 3, causal=True)
    with pytest.raises(ValueError, match="q_offset must be >= 0"):
        posenc.alibi_bias(2, 2, 3, causal=True, q_offset=-1)
    with pytest.raises(ValueError, match="q_len must be a positive integer"):
        posenc.alibi_bias(2, 0, 3)
    with pytest.raises(TypeError, match="dtype must be a floating-point"):
        posenc.alibi_bias(2, 2, 3, dtype=torch.int64)
    with pytest.raises(TypeError, match="causal must be a bool"):
        posenc.alibi_bias(2, 2, 3, causal=1)
    # Non-causal bias with more queries than keys is well defined.
    assert posenc.alibi_bias(2, 5, 3, causal=False).shape == (2, 5, 3)


# ---- scheme -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("heads", "q_len", "k_len", "causal", "q_offset"),
    [(4, 5, 5, True, None), (3, 2, 7, True, None), (6, 4, 4, False, None), (3, 3, 6, True, 1)],
)
def test_scheme_matches_explicit_softmax_loop(heads, q_len, k_len, causal, q_offset):
    q = torch.randn(heads, q_len, 8, dtype=torch.float64)
    k = torch.randn(heads, k_len, 8, dtype=torch.float64)
    v = torch.randn(heads, k_len, 5, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=posenc.ALiBi(heads), causal=causal, q_offset=q_offset)
    o = k_len - q_len if q_offset is None else q_offset
    want = reference_attention(q, k, v, reference_slopes(heads), causal=causal, q_offset=o)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_scheme_broadcasts_over_batch_and_runs_in_float32():
    scheme = posenc.ALiBi(4)
    q = torch.randn(2, 4, 6, 8)
    k = torch.randn(2, 4, 6, 8)
    v = torch.randn(2, 4, 6, 8)
    got = posenc.attention(q, k, v, encoding=scheme, causal=True)
    want = posenc.attention(
        q.double(), k.double(), v.double(), encoding=scheme, causal=True
    ).float()
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert repr(scheme) == "ALiBi(num_heads=4)"


def test_scheme_rejects_mismatched_heads():
    q = torch.randn(3, 5, 8)
    with pytest.raises(ValueError, match="num_heads=4"):
        posenc.attention(q, q, q, encoding=posenc.ALiBi(4))
    with pytest.raises(ValueError, match="num_heads must be a positive integer"):
        posenc.ALiBi(0)


def test_per_sample_positions_bias_by_loops():
    """Positions (batch, len), as for a left-padded batch: -m_h |p_bi - s_bj| per sample."""
    heads = 3
    q = torch.randn(2, heads, 2, 4, dtype=torch.float64)
    q_pos = torch.tensor([[3, 4], [0, 9]])
    k_pos = torch.tensor([[0, 1, 2, 3, 4], [0, 0, 0, 5, 9]])
    ctx = posenc.CallContext.of(q, q, q_positions=q_pos, k_positions=k_pos, scale=1.0)
    bias = posenc.ALiBi(heads).bias(q, q, ctx)
    slopes = reference_slopes(heads)
    assert bias.shape == (2, heads, 2, 5)
    for b in range(2):
        for h in range(heads):
            for i in range(2):
                for j in range(5):
                    want = -slopes[h] * abs(int(q_pos[b, i]) - int(k_pos[b, j]))
                    assert float(bias[b, h, i, j]) == pytest.approx(want, abs=1e-15)


def test_slopes_are_a_float64_buffer_that_casting_keeps():
    """``model.to(bf16)`` moves the slopes but never rounds them: the bias stays exact."""
    scheme = posenc.ALiBi(12)
    model = torch.nn.Sequential(scheme).to(torch.bfloat16)
    assert scheme.slopes.dtype == torch.float64
    torch.testing.assert_close(scheme.slopes, posenc.alibi_slopes(12), rtol=0, atol=0)
    assert "slopes" in dict(scheme.named_buffers()) and not scheme.state_dict()
    assert model[0].to("meta").slopes.device.type == "meta"


def test_errors_and_repr_name_a_subclass():
    class Steeper(posenc.ALiBi):
        pass

    q = torch.randn(3, 5, 8)
    with pytest.raises(ValueError, match=r"Steeper\(4\) needs q of shape"):
        posenc.attention(q, q, q, encoding=Steeper(4))
    assert repr(Steeper(4)) == "Steeper(num_heads=4)"


def test_the_old_positional_bias_form_warns_and_still_works():
    q, pos = torch.randn(1, 2, 3, 4), torch.arange(3)
    alibi = posenc.ALiBi(2)
    with pytest.warns(DeprecationWarning, match=r"ALiBi\.bias\(q, k, q_positions.*CallContext"):
        old = alibi.bias(q, q, pos, pos, 1.0)
    assert torch.equal(old, alibi.bias(q, q, posenc.CallContext.of(q, q, scale=1.0)))
