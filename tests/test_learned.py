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


def test_gradient_accumulates_into_the_looked_up_rows():
    """Against an explicit float64 loop: row r collects the upstream gradient of every
    occurrence of r (repeated positions add up), rows never looked up get exactly zero."""
    emb = posenc.LearnedEmbedding(7, 3, dtype=torch.float64)
    pos = torch.tensor([[1, 3, 3], [6, 3, 1]])
    upstream = torch.randn(2, 3, 3, dtype=torch.float64)
    (emb(pos) * upstream).sum().backward()
    want = torch.zeros(7, 3, dtype=torch.float64)
    for i in range(2):
        for j in range(3):
            for f in range(3):
                want[int(pos[i, j]), f] += float(upstream[i, j, f])
    assert (emb.weight.grad - want).abs().max().item() < 1e-15
    assert emb.weight.grad[[0, 2, 4, 5]].abs().max() == 0
    assert emb.weight.grad[3].abs().min() > 0  # three occurrences, summed


def test_compile_and_export():
    emb = posenc.LearnedEmbedding(10, 4)
    pos = torch.tensor([[1, 2, 9], [0, 0, 5]])
    torch._dynamo.reset()
    compiled = torch.compile(emb, fullgraph=True, backend="aot_eager")
    assert torch.equal(compiled(pos), emb(pos))
    assert torch.equal(compiled(3), emb(3))
    exported = torch.export.export(emb, (pos,)).module()
    assert torch.equal(exported(pos), emb(pos))
    # traced, values cannot be checked up front; the lookup still refuses, never wraps
    for bad in (torch.tensor([1, 10]), torch.tensor([-1, 2])):
        with pytest.raises((RuntimeError, IndexError), match="out of"):
            compiled(bad)
    # an int length is checked without reading tensors (fullgraph reports it as unsupported)
    with pytest.raises(ValueError, match="max_positions=10"):
        torch.compile(emb, backend="aot_eager")(4, offset=7)


def test_meta():
    emb = posenc.LearnedEmbedding(10, 4, device="meta")
    out = emb(torch.tensor([[1, 2, 9]], device="meta"))
    assert out.shape == (1, 3, 4) and out.device.type == "meta"


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
