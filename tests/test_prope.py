"""Tests for posenc.prope: p-RoPE (Barbero et al., 2025) and HoPE's cut (Chen et al., 2025).

Golden values come from outside the module: transformers' own ``proportional`` frequency
function (called, not copied), float64 loops of the rule ``theta_i = base**(-2i/d)`` for
``i < floor(p d / 2)``, else 0, and the HoPE cut recomputed from its definition (a pair
rotates iff its period ``2 pi / theta_i`` is at most the training length).
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc
from posenc import CallContext, PartialRotaryEmbedding, RotaryEmbedding

LAYOUTS = ["interleaved", "half"]


def _pairs_rule(p: float, dim: int) -> int:
    # floor(p * d / 2) as transformers writes it: int(p * head_dim // 2)
    return int(p * dim // 2)


def _hope_pairs_float64(dim: int, base: float, length: int) -> int:
    """Pairs whose period 2 pi / theta_i is at most ``length``, theta_i = base**(-2i/dim)."""
    theta = torch.tensor([base ** (-2.0 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    period = 2 * math.pi / theta
    kept = period <= length
    # the kept pairs must be a prefix (theta decreases), or "the first n" means nothing
    n = int(kept.sum())
    assert bool(kept[:n].all()) and not bool(kept[n:].any())
    return n


def _feature_of_pair(i: int, dim: int, layout: str) -> list[int]:
    return [2 * i, 2 * i + 1] if layout == "interleaved" else [i, i + dim // 2]


# ------------------------------------------------------------------ transformers' proportional


@pytest.mark.parametrize(
    ("dim", "p", "base"),
    [(64, 0.25, 1e6), (64, 0.3, 10000.0), (128, 0.75, 500000.0), (34, 0.5, 10000.0),
     (256, 0.25, 1e6), (16, 1.0, 10000.0), (16, 0.0, 10000.0)],
)  # fmt: skip
def test_frequencies_equal_transformers_proportional(dim, p, base):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=4 * dim, num_attention_heads=4, head_dim=dim,
        rope_parameters={"rope_type": "proportional", "rope_theta": base,
                         "partial_rotary_factor": p},
    )  # fmt: skip
    want, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](config, "cpu")
    assert attention_factor == 1.0
    got = PartialRotaryEmbedding(dim, p=p, base=base, layout="half").inv_freq
    assert got.shape == want.shape == (dim // 2,)
    assert torch.equal(got == 0, want == 0)  # the same pairs are still, exactly
    # transformers computes in float32 (exponent, pow and reciprocal each rounded): a few
    # ulps of 6e-8; a wrong exponent denominator (2n instead of d) moves them by >1e-2
    torch.testing.assert_close(got.float(), want, rtol=1e-6, atol=0)


def _draws(seed: int, count: int) -> list[tuple[int, float, float]]:
    """(dim, p, base) drawn by a seeded generator: even dims 2-512, p in [0, 1], bases
    10^2-10^7 (the test fixes the ranges, not the cases)."""
    g = torch.Generator().manual_seed(seed)
    draws = []
    for _ in range(count):
        dim = 2 * int(torch.randint(1, 257, (), generator=g))
        p = round(float(torch.rand((), generator=g)), 3)
        base = float(10 ** (2 + 5 * float(torch.rand((), generator=g))))
        draws.append((dim, p, base))
    return draws


@pytest.mark.parametrize(("dim", "p", "base"), _draws(2026, 25))
def test_frequencies_equal_transformers_proportional_on_drawn_configs(dim, p, base):
    test_frequencies_equal_transformers_proportional(dim, p, base)


def test_transformers_config_reads_back_as_this_scheme():
    # posenc's own transformers reader builds the same frequencies from Gemma 4's config
    params = {"rope_type": "proportional", "rope_theta": 1e6, "partial_rotary_factor": 0.25}
    rope = posenc.rope_from_transformers(params, head_dim=64)
    mine = PartialRotaryEmbedding(64, p=0.25, base=1e6, layout="half")
    assert torch.equal(rope.inv_freq, mine.inv_freq)


# ------------------------------------------------------------------ the rule


@pytest.mark.parametrize("dim", [2, 8, 34, 64, 128])
@pytest.mark.parametrize("p", [0.0, 0.1, 0.25, 0.3, 0.5, 0.75, 0.99, 1.0])
def test_keeps_the_fastest_pairs_of_the_full_ladder(dim, p):
    base = 10000.0
    n = _pairs_rule(p, dim)
    want = [base ** (-2 * i / dim) if i < n else 0.0 for i in range(dim // 2)]
    module = PartialRotaryEmbedding(dim, p=p, base=base)
    assert module.rotated_pairs == n == math.floor(p * dim / 2 + 1e-12)
    got = module.inv_freq.tolist()
    assert [g == 0.0 for g in got] == [w == 0.0 for w in want]
    for g, w in zip(got, want, strict=True):
        assert g == pytest.approx(w, rel=1e-14, abs=0.0)
    # the zeroed pairs are the slowest ones: every kept frequency exceeds every removed one
    plain = posenc.rope_frequencies(dim, base=base)
    assert torch.equal(module.inv_freq[:n], plain[:n])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_p_one_is_rope_exactly(layout, dtype):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 3, 37, 64, generator=g).to(dtype)
    k = torch.randn(2, 1, 37, 64, generator=g).to(dtype)
    positions = torch.tensor([0, 5, 4096, 70_000, 3_000_000])
    ours = PartialRotaryEmbedding(64, p=1.0, layout=layout)
    rope = RotaryEmbedding(64, layout=layout)
    assert torch.equal(ours.inv_freq, rope.inv_freq)
    ctx = CallContext.of(q, k, q_positions=torch.arange(37) + 11)
    for a, b in zip(ours.rotate(q, k, ctx), rope.rotate(q, k, ctx), strict=True):
        assert torch.equal(a, b)
    x = torch.randn(5, 64, generator=g).to(dtype)
    assert torch.equal(ours(x, positions), rope(x, positions))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16])
def test_removed_pairs_pass_through_unchanged_and_kept_ones_rotate_as_rope(layout, dtype):
    dim, p = 32, 0.4  # 6 of 16 pairs rotate
    module = PartialRotaryEmbedding(dim, p=p, layout=layout)
    n = module.rotated_pairs
    assert n == 6
    g = torch.Generator().manual_seed(2)
    q = torch.randn(1, 2, 9, dim, generator=g).to(dtype)
    k = torch.randn(1, 2, 9, dim, generator=g).to(dtype)
    ctx = CallContext.of(q, k, q_positions=torch.arange(9) * 1000, k_positions=torch.arange(9))
    qr, kr = module.rotate(q, k, ctx)
    rope = RotaryEmbedding(dim, layout=layout)
    qf, kf = rope.rotate(q, k, ctx)  # full RoPE: the same angles on the kept pairs
    for i in range(dim // 2):
        f = _feature_of_pair(i, dim, layout)
        if i < n:
            assert torch.equal(qr[..., f], qf[..., f]) and torch.equal(kr[..., f], kf[..., f])
            assert not torch.equal(qr[..., f], q[..., f])
        else:  # bitwise identical: a rotation by angle 0
            assert torch.equal(qr[..., f], q[..., f]) and torch.equal(kr[..., f], k[..., f])


def test_p_zero_is_nope():
    module = PartialRotaryEmbedding(16, p=0.0)
    assert module.rotated_pairs == 0 and bool((module.inv_freq == 0).all())
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(3, 1, 2, 12, 16, generator=g, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=module, causal=True)
    want = posenc.attention(q, k, v, encoding=posenc.NoPE(), causal=True)
    assert torch.equal(got, want)


# ------------------------------------------------------------------ HoPE's cut


@pytest.mark.parametrize(
    ("dim", "base", "length"),
    [(64, 10000.0, 512), (64, 10000.0, 2048), (128, 500000.0, 8192), (128, 10000.0, 4096),
     (8, 100.0, 64), (64, 10000.0, 6), (64, 10000.0, 7), (64, 10000.0, 10**9)],
)  # fmt: skip
def test_hope_cut_keeps_the_pairs_that_complete_a_turn(dim, base, length):
    module = PartialRotaryEmbedding(dim, cut="hope", training_length=length, base=base)
    n = _hope_pairs_float64(dim, base, length)
    assert module.rotated_pairs == n
    assert module.p == n / (dim // 2)
    plain = posenc.rope_frequencies(dim, base=base)
    assert torch.equal(module.inv_freq[:n], plain[:n])
    assert bool((module.inv_freq[n:] == 0).all())
    # every kept pair turns at least once within the training length, no removed one does
    assert bool((plain[:n] * length >= 2 * math.pi).all())
    assert bool((plain[n:] * length < 2 * math.pi).all())


def test_hope_cut_edge_cases():
    # L = 6 < 2 pi: not even the fastest pair (period 2 pi) completes a turn
    assert PartialRotaryEmbedding(64, cut="hope", training_length=6).rotated_pairs == 0
    assert PartialRotaryEmbedding(64, cut="hope", training_length=7).rotated_pairs == 1
    # a length past every period keeps all pairs: RoPE
    whole = PartialRotaryEmbedding(64, cut="hope", training_length=10**9)
    assert whole.rotated_pairs == 32 and torch.equal(whole.inv_freq, RotaryEmbedding(64).inv_freq)


@given(dim=st.integers(1, 200).map(lambda h: 2 * h), length=st.integers(1, 10**7),
       base=st.sampled_from([100.0, 10000.0, 500000.0, 1e6]))  # fmt: skip
def test_hope_cut_matches_its_definition_for_drawn_sizes(dim, length, base):
    module = PartialRotaryEmbedding(dim, cut="hope", training_length=length, base=base)
    assert module.rotated_pairs == _hope_pairs_float64(dim, base, length)
    # the fraction handed to the proportional scaling gives back exactly that count
    assert int(module.scaling.rotated_fraction * dim // 2) == module.rotated_pairs


# ------------------------------------------------------------------ shapes and invariants


@given(
    batch=st.integers(1, 3), heads=st.integers(1, 3), seq=st.integers(1, 9),
    half=st.integers(1, 12), p=st.floats(0.0, 1.0), layout=st.sampled_from(LAYOUTS),
)  # fmt: skip
def test_drawn_shapes(batch, heads, seq, half, p, layout):
    dim = 2 * half
    module = PartialRotaryEmbedding(dim, p=p, layout=layout)
    q = torch.randn(batch, heads, seq, dim)
    k = torch.randn(batch, 1, seq, dim)
    qr, kr = module.rotate(q, k, CallContext.of(q, k))
    assert qr.shape == q.shape and kr.shape == k.shape
    assert qr.dtype == q.dtype and kr.dtype == k.dtype
    v = torch.randn(batch, 1, seq, dim)
    assert posenc.attention(q, k, v, encoding=module).shape == q.shape


@given(
    shift=st.integers(-(10**6), 10**6), p=st.floats(0.0, 1.0),
    layout=st.sampled_from(LAYOUTS), hope=st.booleans(),
)  # fmt: skip
def test_scores_depend_only_on_the_position_difference(shift, p, layout, hope):
    if hope:
        module = PartialRotaryEmbedding(16, cut="hope", training_length=512, layout=layout)
    else:
        module = PartialRotaryEmbedding(16, p=p, layout=layout)
    g = torch.Generator().manual_seed(4)
    q, k = torch.randn(2, 1, 1, 6, 16, generator=g, dtype=torch.float64)
    qp, kp = torch.tensor([0, 3, 7, 20, 21, 100]), torch.tensor([1, 2, 9, 50, 80, 99])
    shifted = CallContext.of(q, k, q_positions=qp + 10**6 + shift, k_positions=kp + 10**6 + shift)
    qa, ka = module.rotate(q, k, CallContext.of(q, k, q_positions=qp, k_positions=kp))
    qb, kb = module.rotate(q, k, shifted)
    torch.testing.assert_close(qa @ ka.mT, qb @ kb.mT, rtol=0, atol=1e-9)


# ------------------------------------------------------------------ errors and metadata


def test_errors_name_the_parameter():
    with pytest.raises(ValueError, match=r"training_length .* is required for cut='hope'"):
        PartialRotaryEmbedding(64, cut="hope")
    with pytest.raises(ValueError, match="training_length applies only to cut='hope'"):
        PartialRotaryEmbedding(64, p=0.5, training_length=512)
    with pytest.raises(ValueError, match="p does not apply to cut='hope'"):
        PartialRotaryEmbedding(64, p=0.5, cut="hope", training_length=512)
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match=r"p \(the share of pairs that rotate\) must be in"):
            PartialRotaryEmbedding(64, p=bad)
    with pytest.raises(ValueError, match="cut"):
        PartialRotaryEmbedding(64, cut="half")
    with pytest.raises(ValueError, match="training_length"):
        PartialRotaryEmbedding(64, cut="hope", training_length=0)
    with pytest.raises(ValueError, match="dim"):
        PartialRotaryEmbedding(63)
    with pytest.raises(ValueError, match="layout"):
        PartialRotaryEmbedding(64, layout="pairs")
    with pytest.raises(ValueError, match="base"):
        PartialRotaryEmbedding(64, base=-1.0)
    with pytest.raises((TypeError, ValueError), match="p"):
        PartialRotaryEmbedding(64, p="half")  # type: ignore[arg-type]


def test_metadata_and_repr():
    assert posenc.SCHEMES["p_rope"] is PartialRotaryEmbedding
    assert PartialRotaryEmbedding.reference == "barbero2025round"
    assert PartialRotaryEmbedding(64).p == 0.25  # Gemma 4's default
    assert repr(PartialRotaryEmbedding(8, p=0.5)) == (
        "PartialRotaryEmbedding(dim=8, base=10000.0, layout='interleaved', p=0.5, rotated_pairs=2)"
    )
    hope = PartialRotaryEmbedding(64, cut="hope", training_length=512)
    assert "cut='hope', training_length=512, rotated_pairs=16" in repr(hope)
