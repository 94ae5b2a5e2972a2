"""CoPE (Golovneva et al., 2024): contextual positions against float64 loops.

The reference is written from the paper's definitions, one query at a time
with ``math``: gates g_ij = sigmoid(scale q_i.k_j) on the keys the query sees
(0 elsewhere), p_ij = sum of g_it over the visible keys t >= j, clamped to
P - 1, the table interpolated linearly at p_ij, and the score
scale * q_i.(k_j + e(p_ij)).  It shares no code with posenc.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import posenc
from posenc import CoPE


def _cope(num_heads=2, head_dim=4, max_positions=5, seed=0, dtype=torch.float64):
    cope = CoPE(num_heads, head_dim, max_positions).to(dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        cope.pos_emb.copy_(torch.randn(cope.pos_emb.shape, generator=g, dtype=dtype))
    return cope


def _reference(cope, q, k, v, keep):
    """Attention output ``(heads, q_len, d_v)`` for one sample; ``keep[h][i][j]`` = visible."""
    heads, q_len, d = q.shape
    k_len = k.shape[1]
    table = cope.pos_emb.tolist()
    top = len(table) - 1
    scale = 1 / math.sqrt(d)
    out = torch.zeros(heads, q_len, v.shape[-1], dtype=torch.float64)
    for h in range(heads):
        kh = h // (heads // k.shape[0])
        for i in range(q_len):
            qi = q[h, i].tolist()
            seen = [j for j in range(k_len) if keep[h][i][j]]
            dots = {j: sum(a * b for a, b in zip(qi, k[kh, j].tolist(), strict=True)) for j in seen}
            gates = {j: 1 / (1 + math.exp(-scale * dots[j])) for j in seen}
            logits = {}
            for j in seen:
                p = min(sum(gates[t] for t in seen if t >= j), top)
                lo = math.floor(p)
                hi = min(lo + 1, top)
                e = [
                    (1 - (p - lo)) * a + (p - lo) * b
                    for a, b in zip(table[lo], table[hi], strict=True)
                ]
                logits[j] = scale * (dots[j] + sum(a * b for a, b in zip(qi, e, strict=True)))
            if not seen:
                continue
            m = max(logits.values())
            total = sum(math.exp(x - m) for x in logits.values())
            for j in seen:
                out[h, i] += math.exp(logits[j] - m) / total * v[kh, j]
    return out


def _qkv(heads=2, kv_heads=2, q_len=6, k_len=6, d=4, seed=1):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(heads, q_len, d, generator=g, dtype=torch.float64)
    k = torch.randn(kv_heads, k_len, d, generator=g, dtype=torch.float64)
    v = torch.randn(kv_heads, k_len, d, generator=g, dtype=torch.float64)
    return q, k, v


# --- the definitions -------------------------------------------------------------------------


@pytest.mark.parametrize("kv_heads", [2, 1])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_equals_float64_loops(causal, kv_heads):
    cope = _cope(max_positions=4)  # rows of 6 keys: some counts are clamped at 3
    q, k, v = _qkv(kv_heads=kv_heads)
    keep = [[[not causal or j <= i for j in range(6)] for i in range(6)] for _ in range(2)]
    want = _reference(cope, q, k, v, keep)
    got = posenc.attention(q, k, v, encoding=cope, causal=causal)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_masked_keys_are_not_counted():
    """A padded key has gate 0: the loops skip it, so posenc must too."""
    cope = _cope(max_positions=8)
    q, k, v = _qkv(q_len=5, k_len=7)
    pad = torch.tensor([False, True, True, False, True, True, True])
    keep = [[[bool(pad[j]) and j <= i + 2 for j in range(7)] for i in range(5)] for _ in range(2)]
    want = _reference(cope, q, k, v, keep)
    got = posenc.attention(q, k, v, encoding=cope, causal=True, mask=pad.expand(5, 7))
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


# --- the defining property -------------------------------------------------------------------


def _saturated(q_len, d=4, heads=2):
    """Queries and keys whose scaled dot products exceed 37: sigmoid rounds to 1.0 in float64."""
    g = torch.Generator().manual_seed(4)
    q = 10 + torch.rand(1, heads, q_len, d, generator=g, dtype=torch.float64)
    k = 10 + torch.rand(1, heads, q_len, d, generator=g, dtype=torch.float64)
    return q, k


def test_with_every_gate_at_one_positions_are_relative_positions():
    cope = _cope(max_positions=12)
    q, k = _saturated(9)
    ctx = posenc.CallContext.of(q, k, causal=True)
    p = cope.positions(q, k, ctx)
    i, j = torch.arange(9)[:, None], torch.arange(9)[None, :]
    want = torch.where(j <= i, i - j + 1, 0).to(torch.float64)
    assert torch.equal(p[0, 0], want)
    # the term is q_i . e[i - j + 1]: a relative encoding, looked up by the distance
    rel = (q[0] @ cope.pos_emb.T).gather(-1, (i - j + 1).clamp(0, 11).expand(2, 9, 9))
    got = (cope.logits(q, k, ctx) - ctx.scale * (q @ k.transpose(-1, -2)))[0]
    visible = (j <= i).expand(2, 9, 9)
    torch.testing.assert_close(got[visible], (rel * ctx.scale)[visible], rtol=1e-13, atol=1e-13)


@settings(max_examples=25, deadline=None)
@given(length=st.integers(3, 10), dropped=st.data())
def test_masking_a_key_lowers_every_earlier_count_by_its_gate(length, dropped):
    """p_ij counts the gates of the keys from j on: masking key t removes exactly g_it from
    p_ij for every j <= t and leaves the counts of later keys alone."""
    t = dropped.draw(st.integers(1, length - 1))
    cope = _cope(max_positions=length + 2)
    g = torch.Generator().manual_seed(length)
    q = torch.randn(1, 2, 1, 4, generator=g, dtype=torch.float64)  # the last query
    k = torch.randn(1, 2, length, 4, generator=g, dtype=torch.float64)
    full = cope.positions(q, k, posenc.CallContext.of(q, k))
    keep = torch.ones(length, dtype=torch.bool)
    keep[t] = False
    ctx = posenc.CallContext.of(q, k, mask=keep[None, None, None, :])
    masked = cope.positions(q, k, ctx)
    gate = torch.sigmoid(ctx.scale * (q @ k.transpose(-1, -2)))[..., t]
    removed = full[..., : t + 1] - masked[..., : t + 1]
    torch.testing.assert_close(removed, gate[..., None].expand_as(removed), rtol=0, atol=1e-13)
    torch.testing.assert_close(full[..., t + 1 :], masked[..., t + 1 :], rtol=0, atol=0)


# --- decoding and gradients ------------------------------------------------------------------


def test_decoding_through_the_kv_cache_equals_the_full_pass():
    cope = _cope(max_positions=5)
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 2, 8, 4, generator=g, dtype=torch.float64)
    k = torch.randn(2, 1, 8, 4, generator=g, dtype=torch.float64)
    v = torch.randn(2, 1, 8, 4, generator=g, dtype=torch.float64)
    full = posenc.attention(q, k, v, encoding=cope, causal=True)
    cache = posenc.KVCache(cope)
    qr, _, _ = cache.update(q[:, :, :3], k[:, :, :3], v[:, :, :3])  # a prompt of 3 tokens
    steps = [cache.attention(qr)]
    for t in range(3, 8):
        qr, _, _ = cache.update(q[:, :, t : t + 1], k[:, :, t : t + 1], v[:, :, t : t + 1])
        steps.append(cache.attention(qr))
    torch.testing.assert_close(torch.cat(steps, dim=2), full, rtol=1e-12, atol=1e-12)


def test_gradcheck_through_inputs_and_table():
    cope = _cope(max_positions=4)
    q, k, v = (t[None].clone().requires_grad_() for t in _qkv(q_len=5, k_len=5))
    table = cope.pos_emb.detach().clone().requires_grad_()

    def f(q, k, v, table):
        return torch.func.functional_call(cope, {"pos_emb": table}, (q, k, v), {"causal": True})

    assert torch.autograd.gradcheck(f, (q, k, v, table))


# --- paths and bad input ---------------------------------------------------------------------


def test_flex_backend_refuses_and_says_why():
    cope = _cope(dtype=torch.float32)
    q, k, v = (t.float() for t in _qkv())
    with pytest.raises(ValueError, match="cannot express encoding CoPE: CoPE replaces attention"):
        posenc.attention(q, k, v, encoding=cope, causal=True, backend="flex")
    assert not posenc.supports_flex(cope)
    auto = posenc.attention(q, k, v, encoding=cope, causal=True)  # auto: the eager path
    torch.testing.assert_close(auto, posenc.attention(q, k, v, encoding=cope, causal=True,
                                                      backend="eager"))  # fmt: skip


def test_an_untrained_cope_changes_nothing():
    """The table starts at zero, as in the released code: plain attention."""
    q, k, v = _qkv()
    got = posenc.attention(q, k, v, encoding=CoPE(2, 4, 8).double(), causal=True)
    torch.testing.assert_close(got, posenc.attention(q, k, v, causal=True), rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((0, 4, 8), "num_heads must be a positive integer"),
        ((2, 0, 8), "head_dim must be a positive integer"),
        ((2, 4, 0), "max_positions must be a positive integer"),
    ],
)
def test_bad_arguments_are_refused(args, match):
    with pytest.raises(ValueError, match=match):
        CoPE(*args)


def test_bad_types_and_shapes_are_refused():
    with pytest.raises(TypeError, match="max_positions must be an integer"):
        CoPE(2, 4, 8.0)
    q = torch.zeros(1, 2, 3, 6)
    with pytest.raises(ValueError, match="q must have num_heads=2 heads of head_dim=4"):
        posenc.attention(q, q, q, encoding=CoPE(2, 4, 8))
    q = torch.zeros(1, 3, 3, 4)
    with pytest.raises(ValueError, match="q must have num_heads=2 heads of head_dim=4"):
        posenc.attention(q, q, q, encoding=CoPE(2, 4, 8))
