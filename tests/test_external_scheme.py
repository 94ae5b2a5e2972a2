"""A scheme written outside posenc (tests/external_scheme.py) gets every path unchanged."""

from __future__ import annotations

import pytest
import torch
from external_scheme import LearnedSlopeALiBi

import posenc

HEADS, DIM = 4, 16


def qkv(length=40, kv_heads=2, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, HEADS, length, DIM, generator=g, dtype=dtype)
    k = torch.randn(2, kv_heads, length, DIM, generator=g, dtype=dtype)
    v = torch.randn(2, kv_heads, length, DIM, generator=g, dtype=dtype)
    return q, k, v


def test_it_starts_as_alibi_and_its_slopes_learn():
    scheme = LearnedSlopeALiBi(HEADS).double()
    q, k, v = qkv(dtype=torch.float64)
    want = posenc.attention(q, k, v, encoding=posenc.ALiBi(HEADS), causal=True)
    got = posenc.attention(q, k, v, encoding=scheme, causal=True)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    got.pow(2).sum().backward()
    assert scheme.rho.grad is not None and scheme.rho.grad.abs().min() > 0


@pytest.mark.skipif(not posenc.flex_available("cpu"), reason="FlexAttention cannot be compiled")
def test_flex_equals_eager():
    scheme = LearnedSlopeALiBi(HEADS)
    with torch.no_grad():
        scheme.rho.add_(torch.linspace(-0.5, 0.5, HEADS))  # away from ALiBi's slopes
    assert posenc.supports_flex(scheme)
    q, k, v = qkv(length=160)
    keep = torch.ones(2, 160, dtype=torch.bool)
    keep[1, :7] = False
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    kwargs = dict(encoding=scheme, causal=True, mask=keep[:, None, None, :], k_positions=positions)
    with torch.no_grad():
        got = posenc.attention(q, k, v, backend="flex", **kwargs)
        eager = posenc.attention(q, k, v, backend="eager", **kwargs)
    torch.testing.assert_close(got, eager, rtol=0, atol=2e-5)


def test_kv_cache_decoding_equals_the_full_pass():
    scheme = LearnedSlopeALiBi(HEADS).double()
    q, k, v = qkv(length=9, dtype=torch.float64)
    full = posenc.attention(q, k, v, encoding=scheme, causal=True)
    cache = posenc.KVCache(scheme)
    outs = []
    for a, b in ((0, 5), (5, 6), (6, 9)):
        q_new, _, _ = cache.update(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
        outs.append(cache.attention(q_new))
    torch.testing.assert_close(torch.cat(outs, dim=2), full, rtol=1e-12, atol=1e-12)


def test_compiles_with_no_graph_break():
    scheme = LearnedSlopeALiBi(HEADS)
    q, k, v = qkv(length=12)

    def f(q, k, v):
        return posenc.attention(q, k, v, encoding=scheme, causal=True)

    torch._dynamo.reset()
    try:
        got = torch.compile(f, fullgraph=True, backend="eager")(q, k, v)
    finally:
        torch._dynamo.reset()
    torch.testing.assert_close(got, f(q, k, v), rtol=1e-6, atol=1e-6)
