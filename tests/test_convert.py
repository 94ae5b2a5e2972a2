"""Tests for posenc.convert: a converted checkpoint gives the same attention scores."""

import pytest
import torch

import posenc


def test_permutation_written_out():
    # head_dim 8, r = 6: half slots 0,1,2 <- 0,2,4 and slots 3,4,5 <- 1,3,5; 6, 7 stay
    perm = posenc.rope_layout_permutation(8, rotary_dim=6)
    assert perm.tolist() == [0, 2, 4, 1, 3, 5, 6, 7]
    back = posenc.rope_layout_permutation(8, src="half", dst="interleaved", rotary_dim=6)
    assert perm[back].tolist() == list(range(8))  # inverse of each other
    assert posenc.rope_layout_permutation(6, src="half", dst="half").tolist() == list(range(6))


def scores(x, wq, bq, wk, bk, heads, layout, r):
    """Attention logits (heads, seq, seq) of a toy projection with RoPE, float64."""
    seq = x.shape[0]
    q = (x @ wq.T + bq).view(seq, heads, -1).transpose(0, 1)
    k = (x @ wk.T + bk).view(seq, heads, -1).transpose(0, 1)
    q = posenc.apply_rope(q, layout=layout, rotary_dim=r)
    k = posenc.apply_rope(k, layout=layout, rotary_dim=r)
    return q @ k.transpose(-1, -2)


@pytest.mark.parametrize("r", [None, 4])
@pytest.mark.parametrize(
    "src, dst, convert, back",
    [
        ("interleaved", "half", posenc.interleaved_to_half, posenc.half_to_interleaved),
        # the port that lets a half-layout checkpoint run the faster interleaved path
        ("half", "interleaved", posenc.half_to_interleaved, posenc.interleaved_to_half),
    ],
)
def test_converted_checkpoint_keeps_scores(r, src, dst, convert, back):
    hidden, heads, head_dim, seq = 24, 3, 8, 11
    x = torch.randn(seq, hidden, dtype=torch.float64)
    wq, wk = torch.randn(2, heads * head_dim, hidden, dtype=torch.float64)
    bq, bk = torch.randn(2, heads * head_dim, dtype=torch.float64)
    original = scores(x, wq, bq, wk, bk, heads, src, r)
    conv = [convert(t, heads, rotary_dim=r) for t in (wq, bq, wk, bk)]
    converted = scores(x, *conv, heads, dst, r)
    assert (converted - original).abs().max().item() < 1e-12
    # the pitfall: the other layout's RoPE on unconverted weights changes the scores
    wrong = scores(x, wq, bq, wk, bk, heads, dst, r)
    assert (wrong - original).abs().max().item() > 1e-2
    # and back again, exactly
    assert torch.equal(back(conv[0], heads, rotary_dim=r), wq)


def test_grouped_query_heads_convert_separately():
    hidden, head_dim = 16, 4
    wk = torch.randn(2 * head_dim, hidden)  # 2 key heads
    got = posenc.interleaved_to_half(wk, 2)
    for h in range(2):
        block = wk[h * head_dim : (h + 1) * head_dim]
        assert torch.equal(got[h * head_dim : (h + 1) * head_dim], block[[0, 2, 1, 3]])


def test_bad_input():
    w = torch.randn(12, 5)
    with pytest.raises(ValueError, match="num_heads"):
        posenc.interleaved_to_half(w, 5)
    with pytest.raises(ValueError, match="num_heads"):
        posenc.interleaved_to_half(w, 0)
    with pytest.raises(ValueError, match="head_dim"):
        posenc.interleaved_to_half(w, 4)  # head_dim 3 is odd
    with pytest.raises(ValueError, match="rotary_dim"):
        posenc.interleaved_to_half(w, 2, rotary_dim=8)
    with pytest.raises(ValueError, match="rotary_dim"):
        posenc.half_to_interleaved(w, 2, rotary_dim=3)
    with pytest.raises(TypeError, match="weight"):
        posenc.interleaved_to_half(w.tolist(), 2)
    with pytest.raises(ValueError, match="src"):
        posenc.rope_layout_permutation(8, src="neox")
    with pytest.raises(ValueError, match="head_dim"):
        posenc.rope_layout_permutation(-2)
