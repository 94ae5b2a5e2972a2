"""Tests for posenc.kv_cache: decoding through the rotate-once cache equals the full pass."""

import math

import pytest
import torch

import posenc


def full_pass_reference(q, k, v, keep=None):
    """Causal attention in float64 with explicit heads, mask and softmax.

    q (B, Hq, T, d), k/v (B, Hkv, T, .): key head h // (Hq // Hkv) serves query head h;
    keep (B, T) marks real (unpadded) keys.
    """
    q, k, v = q.double(), k.double(), v.double()
    groups = q.shape[1] // k.shape[1]
    out = torch.zeros(*q.shape[:-1], v.shape[-1], dtype=torch.float64)
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            kh, vh = k[b, h // groups], v[b, h // groups]
            for i in range(q.shape[2]):
                seen = [j for j in range(i + 1) if keep is None or keep[b, j]]
                if not seen:
                    continue
                s = torch.stack([q[b, h, i] @ kh[j] for j in seen]) / math.sqrt(q.shape[-1])
                w = torch.softmax(s, 0)
                out[b, h, i] = sum(w[n] * vh[j] for n, j in enumerate(seen))
    return out


@pytest.mark.parametrize("kv_heads", [4, 2, 1])  # MHA, GQA, MQA
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_step_by_step_decoding_equals_the_full_causal_pass(kv_heads, layout):
    torch.manual_seed(1)
    B, H, T, d = 2, 4, 12, 8
    q = torch.randn(B, H, T, d, dtype=torch.float64)
    k = torch.randn(B, kv_heads, T, d, dtype=torch.float64)
    v = torch.randn(B, kv_heads, T, 5, dtype=torch.float64)
    rope = posenc.RotaryEmbedding(d, layout=layout, rotary_dim=6)
    qr, kr = rope.rotate(q, k, posenc.CallContext.of(q, k))
    want = full_pass_reference(qr, kr, v)
    # prompt of 5, two single steps, a chunk of 3, then single steps; capacity 2 forces growth
    cache = posenc.KVCache(rope, capacity=2)
    bounds = [0, 5, 6, 7, 10, 11, 12]
    for a, b in zip(bounds, bounds[1:], strict=False):
        q_rot, keys, values = cache.update(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
        assert keys.shape == (B, kv_heads, b, d) and values.shape == (B, kv_heads, b, 5)
        out = posenc.attention(q_rot, keys, values, causal=True)
        assert (out - want[:, :, a:b]).abs().max().item() < 1e-12
    assert cache.length == T and cache.capacity >= T
    assert torch.equal(cache.positions, torch.arange(T).expand(B, T))
    # keys are stored rotated: the cache equals the fully rotated keys
    assert (cache.keys - kr).abs().max().item() < 1e-15


def test_left_padded_batch_with_per_item_positions():
    """Item 0 has 3 padding tokens in front; each item counts its own positions."""
    torch.manual_seed(2)
    H, T, d = 2, 9, 8
    pad = 3
    q = torch.randn(2, H, T, d, dtype=torch.float64)
    k = torch.randn(2, 1, T, d, dtype=torch.float64)
    v = torch.randn(2, 1, T, 4, dtype=torch.float64)
    keep = torch.ones(2, T, dtype=torch.bool)
    keep[0, :pad] = False
    positions = torch.stack([(torch.arange(T) - pad).clamp(min=0), torch.arange(T)])
    rope = posenc.RotaryEmbedding(d, layout="half")
    cache = posenc.KVCache(rope, capacity=4)
    outs = []
    for a, b in [(0, 6), (6, 7), (7, 8), (8, 9)]:
        q_rot, keys, values = cache.update(
            q[:, :, a:b], k[:, :, a:b], v[:, :, a:b], positions[:, a:b]
        )
        mask = keep[:, None, None, :b]  # (batch, 1, 1, keys): padded keys removed
        outs.append(posenc.attention(q_rot, keys, values, mask=mask, causal=True))
    got = torch.cat(outs, dim=2)
    assert torch.equal(cache.positions, positions)
    # independent reference: each item alone, without padding, at positions 0 .. n-1
    for b, start in ((0, pad), (1, 0)):
        qb, kb = q[b : b + 1, :, start:], k[b : b + 1, :, start:]
        qr, kr = rope.rotate(qb, kb, posenc.CallContext.of(qb, kb))
        want = full_pass_reference(qr, kr, v[b : b + 1, :, start:])
        assert (got[b : b + 1, :, start:] - want).abs().max().item() < 1e-12


def test_bf16_cache_rotates_once_and_rounds_once():
    q = torch.randn(1, 2, 6, 64).to(torch.bfloat16)
    k = torch.randn(1, 2, 6, 64).to(torch.bfloat16)
    rope = posenc.RotaryEmbedding(64)
    cache = posenc.KVCache(rope)
    for p in range(6):
        cache.update(q[:, :, p : p + 1], k[:, :, p : p + 1], k[:, :, p : p + 1])
    assert cache.keys.dtype == torch.bfloat16
    assert torch.equal(cache.keys, rope(k))  # the same rounding as rotating the whole at once


def test_a_step_at_three_million_costs_one_position():
    rope = posenc.RotaryEmbedding(16)
    cache = posenc.KVCache(rope)
    q, k = torch.randn(1, 1, 1, 16, dtype=torch.float64), torch.randn(1, 1, 1, 16)
    q_rot, keys, _ = cache.update(q, k.double(), k.double(), torch.tensor([3_000_000]))
    assert rope._cache is None  # no table over the 3e6 positions before it
    assert keys.shape == (1, 1, 1, 16) and cache.capacity == 256
    w = [10000.0 ** (-2 * i / 16) for i in range(8)]
    a, b = q[0, 0, 0, 0::2], q[0, 0, 0, 1::2]
    t = torch.tensor([3_000_000 * wi for wi in w], dtype=torch.float64)
    want = torch.stack((a * t.cos() - b * t.sin(), a * t.sin() + b * t.cos()), -1).flatten()
    assert (q_rot[0, 0, 0] - want).abs().max().item() < 1e-8


def test_growth_is_amortised_and_views_stay_valid():
    cache = posenc.KVCache(None, capacity=3)
    caps, snapshots = [], []
    for t in range(40):
        x = torch.full((1, 1, 1, 2), float(t))
        _, keys, _ = cache.update(x, x, x)
        caps.append(cache.capacity)
        snapshots.append(keys)
    assert sorted(set(caps)) == [3, 6, 12, 24, 48]  # doubling: log2 reallocations
    for t, snap in enumerate(snapshots):  # later updates never change an earlier view
        assert torch.equal(snap[0, 0, :, 0], torch.arange(t + 1, dtype=torch.float32))
    cache.reset()
    assert cache.length == 0 and cache.keys is None


def test_backpropagates_through_every_step_of_a_decode():
    """Gradients of a step-by-step decode equal those of the full causal pass."""
    torch.manual_seed(5)
    leaves = [torch.randn(2, *shape, dtype=torch.float64) for shape in ((4, 7, 8), (2, 7, 8))]
    leaves.append(torch.randn(2, 2, 7, 5, dtype=torch.float64))
    rope = posenc.RotaryEmbedding(8)
    weights = torch.randn(2, 4, 7, 5, dtype=torch.float64)

    def grads(decode):
        q, k, v = (t.clone().requires_grad_() for t in leaves)
        if decode:
            cache = posenc.KVCache(rope, capacity=2)
            outs = []
            for a, b in ((0, 3), (3, 4), (4, 5), (5, 7)):
                qr, keys, values = cache.update(q[:, :, a:b], k[:, :, a:b], v[:, :, a:b])
                outs.append(posenc.attention(qr, keys, values, causal=True))
            out = torch.cat(outs, dim=2)
            assert torch.equal(cache.positions, torch.arange(7).expand(2, 7))
        else:
            out = posenc.attention(q, k, v, encoding=rope, causal=True)
        (out * weights).sum().backward()
        return out.detach(), q.grad, k.grad, v.grad

    for got, want in zip(grads(True), grads(False), strict=True):
        assert (got - want).abs().max().item() < 1e-12


def test_bad_input():
    rope = posenc.RotaryEmbedding(8)
    cache = posenc.KVCache(rope)
    q, k, v = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 3, 8), torch.randn(2, 2, 3, 5)
    with pytest.raises(TypeError, match="encoding must be a posenc.PositionalScheme"):
        posenc.KVCache(rope.inv_freq)
    with pytest.raises(ValueError, match="encoding or its alias rope"):
        with pytest.warns(DeprecationWarning):
            posenc.KVCache(rope, rope=rope)
    with pytest.raises(ValueError, match="capacity"):
        posenc.KVCache(rope, capacity=0)
    with pytest.raises(ValueError, match="4-D"):
        cache.update(q[0], k[0], v[0])
    with pytest.raises(ValueError, match="kv_heads"):
        cache.update(q[:, :3], k, v)
    with pytest.raises(ValueError, match="agree"):
        cache.update(q, k[:, :, :2], v[:, :, :2])
    with pytest.raises(TypeError, match="dtype"):
        cache.update(q, k.double(), v)
    with pytest.raises(ValueError, match="positions"):
        cache.update(q, k, v, torch.zeros(3, 3, dtype=torch.long))
    with pytest.raises(ValueError, match="positions must lie strictly within"):
        cache.update(q, k, v, torch.tensor([0, 1, 2**63 - 1]))
    cache.update(q, k, v)
    with pytest.raises(ValueError, match="reset"):
        cache.update(q[:1], k[:1], v[:1])


# ---------------------------------------------------------------- dynamic NTK: transformers


# Frozen from transformers 4.57.6 (torch 2.13.0): LlamaAttention with a DynamicCache and
# LlamaRotaryEmbedding, config LlamaConfig(hidden_size=16, num_attention_heads=2,
# num_key_value_heads=1, head_dim=8, max_position_embeddings=16, rope_theta=10000.0,
# rope_scaling={"rope_type": "dynamic", "factor": 2.0}); q_proj = I, k_proj = [I | 0],
# hidden[0, s, j] = sin(0.3 s + 0.7 j + 0.1).  A prompt of 10 tokens, then one token per
# step up to position 23, as generate does.  Rows of the cached (rotated) keys:
HF_CACHED_KEYS = {
    0: [0.0998334, 0.7173561, 0.9974950, 0.8084964, 0.2392493, -0.4425204, -0.9161659, -0.9589243],
    9: [
        -0.0450612,
        -0.2312211,
        -0.9270973,
        -0.9913062,
        0.7132210,
        -0.2643263,
        0.5759916,
        0.9792863,
    ],
    15: [
        0.1704761,
        -1.0263325,
        -0.3636869,
        0.4059316,
        -1.3289229,
        -0.7615753,
        0.5365939,
        -0.0690702,
    ],
    16: [
        1.2253520,
        -0.8745978,
        -0.0303979,
        0.6621321,
        -0.6634773,
        -0.6032540,
        0.3180919,
        -0.3570985,
    ],
    17: [1.1942608, -0.6602057, 0.3045874, 0.8588586, 0.5771160, -0.3787353, 0.0699882, -0.6134472],
    23: [
        -0.6601863,
        0.6023242,
        0.9870222,
        0.3261857,
        -0.3606833,
        1.1779417,
        -0.8455267,
        -0.6144267,
    ],
}
# The same keys rotated in one full pass over the 24 tokens (LlamaRotaryEmbedding with
# position_ids 0 .. 23): every row with the frequencies of length 24.
HF_FULL_PASS_KEYS = {
    0: [0.0998334, 0.7173561, 0.9974950, 0.8084964, 0.2392493, -0.4425204, -0.9161659, -0.9589243],
    9: [
        -0.0450612,
        -0.2760429,
        -0.9074042,
        -0.9868894,
        0.7132210,
        -0.2170988,
        0.6065422,
        0.9837372,
    ],
    15: [
        0.1704761,
        -1.2095088,
        -0.3333579,
        0.4054022,
        -1.3289229,
        -0.4128484,
        0.5559439,
        -0.0721127,
    ],
    16: [
        1.2253520,
        -1.0032880,
        -0.0153801,
        0.6598973,
        -0.6634773,
        -0.3496425,
        0.3191707,
        -0.3612115,
    ],
    17: [1.1942608, -0.7289116, 0.3071083, 0.8557190, 0.5771160, -0.2190887, 0.0579337, -0.6178194],
    23: [
        -0.6601863,
        0.6023242,
        0.9870222,
        0.3261857,
        -0.3606833,
        1.1779417,
        -0.8455267,
        -0.6144267,
    ],
}
# Query head 0 of the step at position 20, rotated with that step's cos/sin.
HF_QUERY_AT_20 = [
    -0.5317419,
    0.1086147,
    1.0388925,
    0.9529666,
    0.0381532,
    0.5125824,
    -0.6244100,
    -0.9883366,
]


def hf_hidden():
    s = torch.arange(24, dtype=torch.float64)[:, None]
    j = torch.arange(16, dtype=torch.float64)
    return torch.sin(0.3 * s + 0.7 * j + 0.1).float()[None]  # (1, 24, 16)


def test_dynamic_ntk_cached_decoding_matches_transformers_generate():
    hidden = hf_hidden()
    q = hidden.view(1, 24, 2, 8).transpose(1, 2)  # q_proj = I: 2 heads of 8
    k = hidden[:, None, :, :8]  # k_proj = [I | 0]: one key head
    v = hidden[:, None, :, 8:]
    rope = posenc.RotaryEmbedding(8, layout="half", scaling=posenc.RopeScaling.dynamic_ntk(2.0, 16))
    cache = posenc.KVCache(rope)
    cache.update(q[:, :, :10], k[:, :, :10], v[:, :, :10])
    for p in range(10, 24):
        q_rot, _, _ = cache.update(q[:, :, p : p + 1], k[:, :, p : p + 1], v[:, :, p : p + 1])
        if p == 20:
            assert (q_rot[0, 0, 0] - torch.tensor(HF_QUERY_AT_20)).abs().max().item() < 2e-6
    for row, want in HF_CACHED_KEYS.items():
        assert (cache.keys[0, 0, row] - torch.tensor(want)).abs().max().item() < 2e-6, row
    # the full pass rotates every position with the frequencies of the whole length
    full = rope(k)
    for row, want in HF_FULL_PASS_KEYS.items():
        assert (full[0, 0, row] - torch.tensor(want)).abs().max().item() < 2e-6, row
    # and the two really differ past the original length (the test can tell them apart)
    assert (cache.keys[0, 0, 16] - full[0, 0, 16]).abs().max().item() > 0.1


def test_meta_tensors():
    rope = posenc.RotaryEmbedding(8, scaling=posenc.RopeScaling.dynamic_ntk(2.0, 4))
    cache = posenc.KVCache(rope)

    def meta(*shape):
        return torch.empty(*shape, device="meta")

    pos = torch.zeros(2, 3, dtype=torch.long, device="meta")
    q, k, v = cache.update(meta(2, 4, 3, 8), meta(2, 2, 3, 8), meta(2, 2, 3, 5), pos)
    assert q.shape == (2, 4, 3, 8) and k.shape == (2, 2, 3, 8) and v.device.type == "meta"
    _, k, _ = cache.update(meta(2, 4, 1, 8), meta(2, 2, 1, 8), meta(2, 2, 1, 5))
    assert k.shape == (2, 2, 4, 8) and cache.positions.device.type == "meta"


def test_the_rope_alias_warns_and_names_encoding():
    rope = posenc.RotaryEmbedding(8)
    with pytest.warns(DeprecationWarning, match=r"KVCache\(rope=\.\.\.\) is deprecated.*encoding="):
        cache = posenc.KVCache(rope=rope)
    assert cache.encoding is rope
    with pytest.warns(DeprecationWarning, match=r"KVCache\.rope is deprecated.*KVCache\.encoding"):
        assert cache.rope is rope
