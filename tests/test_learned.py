"""Tests for posenc.learned.LearnedEmbedding."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc


def test_lookup_by_int_and_by_positions():
    emb = posenc.LearnedEmbedding(10, 4)
    w = emb.weight.detach()
    assert torch.equal(emb(3), torch.stack([w[0], w[1], w[2]]))
    assert torch.equal(emb(2, offset=7), torch.stack([w[7], w[8]]))
    pos = torch.tensor([[9, 0], [4, 4]])
    out = emb(pos)
    assert out.shape == (2, 2, 4)
    for i in range(2):
        for j in range(2):
            assert torch.equal(out[i, j], w[pos[i, j]])
    assert emb([1, 2]).shape == (2, 4)
    assert emb(0).shape == (0, 4)


def test_init_statistics():
    emb = posenc.LearnedEmbedding(2000, 64)
    w = emb.weight.detach().double()
    assert abs(w.mean().item()) < 5 * 0.02 / (2000 * 64) ** 0.5  # 5 standard errors
    assert abs(w.std().item() - 0.02) < 1e-3
    assert list(emb.state_dict()) == ["weight"]
    assert sum(p.numel() for p in emb.parameters()) == 2000 * 64


def test_gradcheck_and_only_used_rows_get_gradient():
    emb = posenc.LearnedEmbedding(6, 3, dtype=torch.float64)
    pos = torch.tensor([1, 3, 3])
    assert torch.autograd.gradcheck(lambda w: w[pos], (emb.weight,))
    emb(pos).sum().backward()
    g = emb.weight.grad
    assert torch.equal(g[3], torch.full((3,), 2.0, dtype=torch.float64))
    assert torch.equal(g[1], torch.ones(3, dtype=torch.float64))
    assert g[[0, 2, 4, 5]].abs().max() == 0  # rows never looked up learn nothing


def test_gradcheck_through_forward():
    emb = posenc.LearnedEmbedding(5, 2, dtype=torch.float64)
    pos = torch.tensor([[0, 4], [4, 2]])

    def f(w):
        return torch.func.functional_call(emb, {"weight": w}, (pos,))

    assert torch.autograd.gradcheck(f, (emb.weight.detach().clone().requires_grad_(True),))


@given(st.integers(1, 50), st.integers(0, 200))
def test_past_the_table_raises(max_positions, p):
    emb = posenc.LearnedEmbedding(max_positions, 2)
    if p < max_positions:
        assert emb(torch.tensor([p])).shape == (1, 2)
    else:
        with pytest.raises(ValueError, match=f"max_positions={max_positions}"):
            emb(torch.tensor([p]))


def test_errors():
    emb = posenc.LearnedEmbedding(8, 2)
    with pytest.raises(ValueError, match="max_positions=8"):
        emb(9)
    with pytest.raises(ValueError, match="max_positions=8"):
        emb(2, offset=7)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        emb(torch.tensor([-1, 2]))
    with pytest.raises(TypeError, match="positions must hold integers"):
        emb(torch.tensor([0.5]))
    with pytest.raises(ValueError, match="seq_len"):
        emb(-3)
    with pytest.raises(ValueError, match="max_positions"):
        posenc.LearnedEmbedding(0, 4)
    with pytest.raises(TypeError, match="dtype"):
        posenc.LearnedEmbedding(4, 4, dtype=torch.int32)
