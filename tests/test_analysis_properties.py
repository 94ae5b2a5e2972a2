"""Tests for posenc.analysis.properties."""

import math

import pytest
import torch

from posenc.analysis import properties as pr


def test_naive_encodings():
    idx = pr.index_encoding(5)
    assert idx.shape == (5, 1) and idx.dtype == torch.float64
    assert idx[:, 0].tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]
    frac = pr.fraction_encoding(5)
    assert frac[:, 0].tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert pr.fraction_encoding(1).tolist() == [[0.0]]
    with pytest.raises(ValueError, match="seq_len"):
        pr.index_encoding(0)


def test_binary_encoding():
    b = pr.binary_encoding(10, 4)
    for p in range(10):
        assert sum(int(b[p, k]) << k for k in range(4)) == p
    assert pr.binary_encoding(17, 4)[16].sum() == 0  # wraps at 2**bits


def test_min_pair_distance_against_loop():
    t = torch.randn(12, 3, dtype=torch.float64)
    best = math.inf
    for i in range(12):
        for j in range(12):
            if i != j:
                best = min(best, math.dist(t[i].tolist(), t[j].tolist()))
    assert abs(pr.min_pair_distance(t) - best) < 1e-12
    t[7] = t[2]
    assert pr.min_pair_distance(t) == 0.0
    assert pr.min_pair_distance(t[:1]) == math.inf


def test_count_distinct():
    codes = torch.tensor(
        [[1.0, 2.0], [1.0, 2.0 + 1e-13], [2.0, 1.0], [1.0, 2.0]], dtype=torch.float64
    )
    assert pr.count_distinct(codes) == 2
    assert pr.count_distinct(codes, decimals=15) == 3
    assert pr.count_distinct(torch.tensor([3, 1, 3, 2])) == 3


def test_shift_map_recovers_a_known_rotation():
    theta = 0.3
    rot = torch.tensor(
        [[math.cos(theta), -math.sin(theta)], [math.sin(theta), math.cos(theta)]],
        dtype=torch.float64,
    )
    rows = [torch.tensor([1.0, 0.0], dtype=torch.float64)]
    for _ in range(20):
        rows.append(rot @ rows[-1])
    table = torch.stack(rows)
    m, res = pr.shift_map(table, 1)
    assert res < 1e-12 and (m - rot).abs().max() < 1e-12
    m3, _ = pr.shift_map(table, 3)
    assert (m3 - rot @ rot @ rot).abs().max() < 1e-12


def test_shift_map_fails_for_an_affine_code():
    # p -> p + k is affine, not linear, for the raw index: no single M fits
    _, res = pr.shift_map(pr.index_encoding(50), 2)
    # the best M is the least-squares slope of p + 2 on p; the codes move by 2
    p = torch.arange(48, dtype=torch.float64)
    slope = ((p + 2) * p).sum() / (p * p).sum()
    expected = ((slope * p - (p + 2)).abs().max() / 2).item()
    assert abs(res - expected) < 1e-12 and res > 0.5
    with pytest.raises(ValueError, match="shift must be <"):
        pr.shift_map(pr.index_encoding(3), 3)


def test_offset_head_attention_against_loop():
    codes = torch.randn(6, 4, dtype=torch.float64)
    w_q, w_k = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)
    a = pr.offset_head_attention(codes, w_q, w_k)
    for i in range(6):
        s = [float((codes[i] @ w_q) @ (codes[j] @ w_k)) / math.sqrt(3) for j in range(i + 1)]
        z = sum(math.exp(x) for x in s)
        for j in range(6):
            want = math.exp(s[j]) / z if j <= i else 0.0
            assert abs(a[i, j].item() - want) < 1e-12


def test_train_offset_head_learns_the_offset_and_leaves_unused_rows():
    import posenc

    emb = posenc.LearnedEmbedding(12, 6, dtype=torch.float64)
    before = emb.weight.detach().clone()
    out = pr.train_offset_head(emb, emb.parameters(), dim=6, seq_len=8, shift=1, steps=150, lr=0.05)
    assert out["losses"][-1] < 0.1 * out["losses"][0]
    a = pr.offset_head_attention(emb(8), out["w_q"], out["w_k"])
    p = torch.arange(1, 8)
    assert torch.equal(a.argmax(1)[p], p - 1)
    assert torch.equal(emb.weight.detach()[8:], before[8:])  # rows never used never move
    with pytest.raises(ValueError, match="shift must be < seq_len"):
        pr.train_offset_head(emb, [], dim=6, seq_len=4, shift=4)
