"""Tests for posenc.xpos: xPos against a float64 loop, a frozen peer and its defining property."""

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc

# --- references -----------------------------------------------------------------------------


def zeta(d):
    """The paper's per-pair decay, written from its formula: (i/(d/2) + 0.4) / 1.4."""
    return [(i / (d / 2) + 0.4) / 1.4 for i in range(d // 2)]


def pairs(d, layout):
    """Feature indices (a, b) of each rotated pair."""
    if layout == "interleaved":
        return [(2 * i, 2 * i + 1) for i in range(d // 2)]
    return [(i, i + d // 2) for i in range(d // 2)]


def reference_scores(q, k, qpos, kpos, *, base, scale_base, layout):
    """float64 loop: sum over pairs of zeta_i**((m - n)/scale_base) times RoPE's pair score.

    RoPE's pair score of query (a, b) at m and key (c, e) at n is
    Re(conj(a + ib) (c + ie) exp(i (n - m) w)) = (ac + be) cos t - (ae - bc) sin t, t = (n - m) w.
    q is (q_len, d), k is (k_len, d).
    """
    d = q.shape[-1]
    out = torch.zeros(len(qpos), len(kpos), dtype=torch.float64)
    for r, m in enumerate(qpos):
        for s, n in enumerate(kpos):
            total = 0.0
            for i, (ia, ib) in enumerate(pairs(d, layout)):
                w = base ** (-2 * i / d)
                t = (n - m) * w
                a, b = float(q[r, ia]), float(q[r, ib])
                c, e = float(k[s, ia]), float(k[s, ib])
                rope = (a * c + b * e) * math.cos(t) - (a * e - b * c) * math.sin(t)
                total += zeta(d)[i] ** ((m - n) / scale_base) * rope
            out[r, s] = total
    return out


def rotate(scheme, q, k, qpos, kpos):
    """The scheme's rotate hook on 4-D ``q`` and ``k`` at the given positions."""
    ctx = posenc.CallContext.of(q, k, q_positions=qpos, k_positions=kpos)
    return scheme.rotate(q, k, ctx)


def xpos_scores(xpos, q, k, qpos, kpos):
    """Scores q' k'^T of posenc's transformed queries and keys (2-D in, 2-D out)."""
    qr, kr = rotate(xpos, q[None, None], k[None, None], qpos, kpos)
    return (qr @ kr.transpose(-1, -2))[0, 0]


# --- the peer: rotary-embedding-torch ----------------------------------------------------------

# Frozen once from rotary-embedding-torch 0.9.1 (lucidrains/rotary-embedding-torch on PyPI),
#   RotaryEmbedding(8, use_xpos=True, xpos_scale_base=4).rotate_queries_and_keys(q, k)
# with q and k float32 (1, 1, 6, 8) from peer_inputs() below, printed to 9 significant digits
# (exact for float32).  That library pairs features (2i, 2i+1) and centres positions at
# seq_len // 2 = 3: it scales queries by zeta ** ((p - 3) / 4) and keys by the reciprocal.
PEER_Q = [
    [0.255462378, 1.15888464, 1.32391226, 1.66344583,
     1.39282238, 1.29393077, 0.848635137, 0.505773962],
    [0.530140042, -0.159196615, -0.767988682, -1.34033298,
     -1.21644187, -1.23517215, -0.929681778, -0.653802037],
    [0.0154860169, -0.384246528, 0.364602566, 0.999951303,
     1.02500772, 1.13737273, 0.971582711, 0.766192615],
    [-0.436494499, -0.0132427104, -0.0955522656, -0.675648332,
     -0.83000344, -1.01167548, -0.976654828, -0.842438281],
    [0.139837861, 0.445530832, -0.0632659569, 0.389983326,
     0.640643835, 0.86831665, 0.948238313, 0.883295655],
    [0.326983392, -0.306221783, 0.137782872, -0.155691162,
     -0.463951647, -0.716370106, -0.890487075, -0.890644372],
]  # fmt: skip
PEER_K = [
    [0.383005083, 0.390619129, 0.543552339, 0.496273905,
     0.539748549, 0.417611361, 0.328674972, 0.138143465],
    [0.112608045, -0.116229549, -0.295451492, -0.501026392,
     -0.662400723, -0.759396791, -0.898733854, -0.901905656],
    [0.847257435, -0.37068364, -0.479912847, -0.53203845,
     -0.273664415, -0.079178378, 0.139315426, 0.351287037],
    [-0.670053065, -0.65504396, 0.552362323, 1.17879999,
     0.969144523, 1.01212621, 0.91198504, 0.800747037],
    [-0.108593583, -1.0621742, 0.256826043, 0.113821231,
     -0.230404109, -0.50142312, -0.662054062, -0.83581996],
    [-2.24358177, 1.11390376, -0.608137906, -1.94607329,
     -1.0493623, -0.987038851, -0.635024548, -0.418142408],
]  # fmt: skip


def peer_inputs():
    """The peer's inputs: q = sin(0.37 t + 0.1), k = cos(0.23 t - 0.2), t = 0 .. 47, as (6, 8)."""
    t = torch.arange(48, dtype=torch.float64).reshape(6, 8)
    return torch.sin(0.37 * t + 0.1).float(), torch.cos(0.23 * t - 0.2).float()


def test_matches_rotary_embedding_torch_use_xpos():
    q, k = peer_inputs()
    xpos = posenc.XPos(8, scale_base=4.0, layout="interleaved", centre=6 // 2)
    pos = torch.arange(6)
    qr, kr = rotate(xpos, q[None, None], k[None, None], pos, pos)
    # float32 on both sides; the peer computes its frequencies in float32, posenc in float64
    torch.testing.assert_close(qr[0, 0], torch.tensor(PEER_Q), rtol=0, atol=5e-7)
    torch.testing.assert_close(kr[0, 0], torch.tensor(PEER_K), rtol=0, atol=5e-7)


def test_peer_centre_changes_the_tensors_but_not_the_scores():
    q, k = peer_inputs()
    pos = list(range(6))
    ours = posenc.XPos(8, scale_base=4.0, layout="interleaved")  # centre 0: the paper's
    qr, _ = rotate(ours, q[None, None], k[None, None], pos, pos)
    # the centre shifts every query by zeta**(3/4): far from the peer's tensors ...
    assert (qr[0, 0] - torch.tensor(PEER_Q)).abs().max() > 0.1
    # ... while the scores agree with the peer's q k^T
    peer_scores = torch.tensor(PEER_Q, dtype=torch.float64) @ torch.tensor(PEER_K).double().T
    scores = xpos_scores(ours, q.double(), k.double(), pos, pos)
    torch.testing.assert_close(scores, peer_scores, rtol=0, atol=2e-6)


# --- the defining property ----------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("centre", [0, 7, -300])
def test_scores_match_float64_loop(layout, centre):
    g = torch.Generator().manual_seed(1)
    q = torch.randn(4, 8, generator=g, dtype=torch.float64)
    k = torch.randn(5, 8, generator=g, dtype=torch.float64)
    qpos, kpos = [3, 9, 10, 40], [0, 4, 9, 25, 41]
    xpos = posenc.XPos(8, base=100.0, scale_base=8.0, layout=layout, centre=centre)
    got = xpos_scores(xpos, q, k, qpos, kpos)
    want = reference_scores(q, k, qpos, kpos, base=100.0, scale_base=8.0, layout=layout)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_each_pair_decays_as_zeta_to_the_distance_over_scale_base(layout):
    """One pair's score over RoPE's score of the same pair: zeta_i ** ((m - n) / scale_base)."""
    d, scale_base = 8, 16.0
    xpos = posenc.XPos(d, scale_base=scale_base, layout=layout)
    rope = posenc.RotaryEmbedding(d, layout=layout)
    qpos, kpos = torch.tensor([50, 60, 99]), torch.tensor([0, 13, 50, 99])
    g = torch.Generator().manual_seed(2)
    for i, (a, b) in enumerate(pairs(d, layout)):
        q = torch.zeros(1, 1, 3, d, dtype=torch.float64)
        k = torch.zeros(1, 1, 4, d, dtype=torch.float64)
        q[..., [a, b]] = torch.randn(3, 2, generator=g, dtype=torch.float64)
        k[..., [a, b]] = torch.randn(4, 2, generator=g, dtype=torch.float64)
        qx, kx = rotate(xpos, q, k, qpos, kpos)
        qr, kr = rotate(rope, q, k, qpos, kpos)
        ratio = (qx @ kx.transpose(-1, -2)) / (qr @ kr.transpose(-1, -2))
        distance = (qpos[:, None] - kpos[None, :]).double()
        want = zeta(d)[i] ** (distance / scale_base)
        torch.testing.assert_close(ratio[0, 0], want, rtol=1e-12, atol=0)
    # and the decay is real: the fastest pair loses a factor of 0.29 every scale_base positions
    assert zeta(d)[0] ** (99 / scale_base) < 1e-3


@given(centre=st.integers(-1_000_000, 1_000_000), offset=st.integers(-30_000, 30_000))
def test_scores_depend_on_relative_positions_only(centre, offset):
    """Moving every position and the centre leaves the scores unchanged."""
    g = torch.Generator().manual_seed(3)
    q = torch.randn(3, 8, generator=g, dtype=torch.float64)
    k = torch.randn(4, 8, generator=g, dtype=torch.float64)
    qpos, kpos = [5, 6, 30], [0, 5, 17, 30]
    near = xpos_scores(posenc.XPos(8, scale_base=64.0), q, k, qpos, kpos)
    far = posenc.XPos(8, scale_base=64.0, centre=centre)
    shift = centre + offset  # positions within 30 000 of the centre: inside the float64 limit
    moved = xpos_scores(far, q, k, [p + shift for p in qpos], [p + shift for p in kpos])
    # float64 angles at |p| ~ 1e6 carry ~1e-10 rad of roundoff
    torch.testing.assert_close(moved, near, rtol=0, atol=1e-8)


# --- the KV cache -------------------------------------------------------------------------------


def reference_key(k, n, *, base, scale_base, layout, centre):
    """float64 loop: key k (d,) at position n, rotated by n w_i and scaled by zeta_i**(-(n-c)/s)."""
    d = k.shape[-1]
    out = torch.zeros(d, dtype=torch.float64)
    for i, (ia, ib) in enumerate(pairs(d, layout)):
        t = n * base ** (-2 * i / d)
        f = zeta(d)[i] ** (-(n - centre) / scale_base)
        a, b = float(k[ia]), float(k[ib])
        out[ia] = f * (a * math.cos(t) - b * math.sin(t))
        out[ib] = f * (a * math.sin(t) + b * math.cos(t))
    return out


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_kv_cache_scales_each_key_once(layout):
    xpos = posenc.XPos(8, scale_base=8.0, layout=layout, centre=2)
    cache = posenc.KVCache(xpos)
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(1, 2, 6, 8, generator=g, dtype=torch.float64) for _ in range(3))
    cache.update(q[:, :, :4], k[:, :, :4], v[:, :, :4])  # a prompt of 4 tokens
    outs = [cache.attention(cache.update(q[:, :, t : t + 1], k[:, :, t : t + 1],
                                         v[:, :, t : t + 1])[0]) for t in (4, 5)]  # fmt: skip
    for n in range(6):  # every cached key: transformed once, at its own position
        want = reference_key(k[0, 1, n], n, base=10000.0, scale_base=8.0, layout=layout, centre=2)
        torch.testing.assert_close(cache.keys[0, 1, n], want, rtol=1e-12, atol=1e-12)
    full = posenc.attention(q, k, v, encoding=xpos, causal=True)
    torch.testing.assert_close(torch.cat(outs, dim=-2), full[:, :, 4:], rtol=1e-12, atol=1e-12)


# --- long positions -----------------------------------------------------------------------------


def test_position_limit_is_where_the_factors_leave_the_normal_range():
    xpos = posenc.XPos(64)  # scale_base 512
    for dtype, near in ((torch.float32, 35_700), (torch.float16, 3_960), (torch.float64, 289_500)):
        limit = xpos.position_limit(dtype)
        assert abs(limit - near) < 0.01 * near
        tiny = torch.finfo(dtype).tiny
        z0 = zeta(64)[0]
        assert z0 ** (limit / 512) >= tiny > z0 ** ((limit + 2) / 512)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_positions_up_to_the_limit_stay_finite(dtype):
    xpos = posenc.XPos(16, scale_base=32.0, centre=1000)
    limit = xpos.position_limit(dtype)
    g = torch.Generator().manual_seed(6)
    # entries of size 1-2: at the limit the factors, between tiny and 1 / tiny, keep every
    # scaled entry normal (float16: 1 / tiny = 16384, and 2 * 16384 < 65504)
    size = 1 + torch.rand(1, 2, 2, 16, generator=g)
    q = (size * torch.randn(1, 2, 2, 16, generator=g).sign()).to(dtype)
    pos = torch.tensor([1000 - limit, 1000 + limit])
    qr, kr = rotate(xpos, q, q, pos, pos)
    assert torch.isfinite(qr).all() and torch.isfinite(kr).all()
    assert qr.dtype == kr.dtype == dtype


def test_float16_entries_the_factor_would_push_below_normal_are_refused():
    # at the limit a query entry of 0.01 times a factor near float16's tiny is subnormal:
    # its score term would lose its precision, so posenc says so instead
    xpos = posenc.XPos(16, scale_base=32.0, centre=1000)
    limit = xpos.position_limit(torch.float16)
    q = torch.full((1, 2, 2, 16), 0.01, dtype=torch.float16)
    pos = torch.tensor([1000 - limit, 1000 + limit])
    with pytest.raises(ValueError, match=r"xPos scales [qk] outside the normal range of torch"):
        rotate(xpos, q, q, pos, pos)


def test_positions_beyond_the_limit_raise_naming_it():
    xpos = posenc.XPos(16, scale_base=32.0, centre=1000)
    limit = xpos.position_limit(torch.float32)
    q = torch.randn(1, 2, 2, 16)
    bad = torch.tensor([0, 1000 + limit + 1])
    with pytest.raises(ValueError, match=rf"within {limit} of centre=1000 for torch.float32"):
        rotate(xpos, q, q, bad, torch.tensor([0, 1]))
    with pytest.raises(ValueError, match=rf"within {limit} of centre=1000"):
        posenc.attention(q, q, q, encoding=xpos, k_positions=bad)


def test_positions_beyond_the_limit_give_nan_where_values_cannot_be_read():
    xpos = posenc.XPos(16, scale_base=32.0)
    limit = xpos.position_limit(torch.float32)
    q = torch.randn(1, 2, 2, 16)
    pos = torch.tensor([5, limit + 1])
    qr, kr = torch.compile(lambda q, k, p: rotate(xpos, q, k, p, p), fullgraph=True)(q, q, pos)
    assert torch.isnan(qr[..., 1, :]).all() and torch.isnan(kr[..., 1, :]).all()
    assert torch.isfinite(qr[..., 0, :]).all()


# --- precision ----------------------------------------------------------------------------------


def test_bf16_is_rounded_once_from_the_float64_result():
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 2, 6, 16, generator=g).to(torch.bfloat16)
    pos = torch.arange(2000, 2006)
    xpos = posenc.XPos(16, scale_base=64.0)
    got, _ = rotate(xpos, q, q, pos, pos)
    exact, _ = rotate(xpos, q.double(), q.double(), pos, pos)
    # float32 arithmetic then one rounding: within 1 bf16 ulp (2**-8 relative) of the exact value
    err = (got.double() - exact).abs()
    assert torch.all(err <= exact.abs() * 2.0**-8 + 1e-30)


# --- bad input ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"head_dim": 7}, ValueError, "head_dim"),
        ({"head_dim": 0}, ValueError, "head_dim"),
        ({"head_dim": 8.0}, TypeError, "head_dim"),
        ({"scale_base": 0.0}, ValueError, "scale_base"),
        ({"scale_base": float("inf")}, ValueError, "scale_base"),
        ({"base": -1.0}, ValueError, "base"),
        ({"layout": "neox"}, ValueError, "layout"),
        ({"centre": 2**31}, ValueError, "centre"),
        ({"centre": 0.5}, TypeError, "centre"),
    ],
)
def test_bad_arguments_name_the_parameter(kwargs, error, name):
    kwargs = {"head_dim": 8, **kwargs}
    with pytest.raises(error, match=name):
        posenc.XPos(**kwargs)


def test_wrong_head_size_is_refused():
    q = torch.randn(1, 2, 3, 6)
    with pytest.raises(ValueError, match="head_dim=8"):
        posenc.attention(q, q, q, encoding=posenc.XPos(8))


# --- float16: refuse only what loses more than float16 (issue 36, item 6) ----------------------

U16 = 2.0**-11  # float16's unit roundoff


def _fp16_error(encoding, q, k, v, **kw):
    """Max error of float16 attention against float64 on the same (float16-rounded) inputs."""
    q, k, v = q.half(), k.half(), v.half()
    got = posenc.attention(q, k, v, encoding=encoding, **kw)
    want = posenc.attention(q.double(), k.double(), v.double(), encoding=encoding, **kw)
    return (got.double() - want).abs().max().item()


@pytest.mark.parametrize("kwargs", [{}, {"centre": 511}, {"scale_base": 4096.0}])
def test_float16_xpos_over_1024_positions_is_not_refused(kwargs):
    # the reported case: 18 tiny query entries become subnormal, but they cost the scores
    # nothing float16 does not already cost; its old advice (centre=511, scale_base=4096) too
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, 1024, 64, generator=g) for _ in range(3))
    xpos = posenc.XPos(64, **kwargs)
    pushed = (q.half().float().abs() >= 2**-14) & (
        (q * xpos.factors(torch.arange(1024), q, keys=False)).abs() < 2**-14
    )
    if not kwargs:
        assert int(pushed.sum()) > 0  # the case does push entries below float16's normals
    err = _fp16_error(xpos, q, k, v, causal=True)
    rope = _fp16_error(posenc.RotaryEmbedding(64, layout="half"), q, k, v, causal=True)
    # float16's own rounding, measured on plain RoPE with the same data: about 1e-3
    assert err <= 1.5 * rope and err < 2e-3, (err, rope)


def _fast_pair_queries(value=0.005):
    # every query's weight in the fastest pair (features 0 and 32 in the half layout), the
    # pair whose factor zeta_0**(m / 512) is 6.4e-4 at m = 3000: scaled, it is subnormal
    q = torch.zeros(1, 2, 10, 64)
    q[..., 0], q[..., 32] = value, -0.8 * value
    g = torch.Generator().manual_seed(1)
    k, v = torch.randn(2, 1, 2, 10, 64, generator=g)
    return q, k, v


def test_float16_xpos_refuses_what_truly_loses_and_its_advice_works():
    q, k, v = _fast_pair_queries()
    pos = torch.arange(2990, 3000)
    kw = {"q_positions": pos, "k_positions": pos, "causal": True}
    xpos = posenc.XPos(64)
    # independently, in float64: rounding the scaled q and k to float16 would cost the scores
    # far more than float16's unit roundoff relative to their size
    qs = q.double() * xpos.factors(pos, q.double(), keys=False)
    ks = k.half().double() * xpos.factors(pos, k.double(), keys=True)
    exact = qs @ ks.mT
    rounded = qs.half().double() @ ks.half().double().mT
    scale = qs.abs() @ ks.abs().mT
    assert ((rounded - exact).abs() / scale).max().item() > 8 * U16
    with pytest.raises(ValueError, match=r"xPos scales q outside the normal range") as info:
        posenc.attention(q.half(), k.half(), v.half(), encoding=xpos, **kw)
    message = str(info.value)
    assert "push 40 normal entries of q" in message and "float32 inputs" in message
    centre = int(re.search(r"XPos\(\.\.\., centre=(-?\d+)\)", message).group(1))
    assert centre == 2994  # the middle of the positions
    # the advice, followed: accepted, and right to float16's rounding (scores do not depend
    # on the centre, so the float64 reference is the same with any centre)
    advised = posenc.XPos(64, centre=centre)
    got = posenc.attention(q.half(), k.half(), v.half(), encoding=advised, **kw)
    want = posenc.attention(q.double(), k.half().double(), v.half().double(), encoding=xpos, **kw)
    assert (got.double() - want).abs().max().item() < 2e-3
    # and the other advice: float32
    posenc.attention(q, k, v, encoding=xpos, **kw)


@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (4, 1)])
def test_float16_keys_pushed_below_normal_are_refused_with_working_advice(heads):
    # keys far before the centre shrink: zeta_0**(3000 / 512) on a key that lives in pair 0
    h, h_kv = heads
    k = torch.zeros(1, h_kv, 10, 64)
    k[..., 0], k[..., 32] = 0.005, 0.004
    g = torch.Generator().manual_seed(2)
    q, v = torch.randn(1, h, 10, 64, generator=g), torch.randn(1, h_kv, 10, 64, generator=g)
    pos = torch.arange(10)
    xpos = posenc.XPos(64, centre=3000)
    kw = {"q_positions": pos, "k_positions": pos}
    with pytest.raises(ValueError, match=r"xPos scales k outside the normal range") as info:
        posenc.attention(q.half(), k.half(), v.half(), encoding=xpos, **kw)
    assert "XPos(..., centre=4)" in str(info.value)
    got = posenc.attention(q.half(), k.half(), v.half(), encoding=posenc.XPos(64, centre=4), **kw)
    want = posenc.attention(q.half().double(), k.double(), v.half().double(), encoding=xpos, **kw)
    assert (got.double() - want).abs().max().item() < 2e-3


def test_float16_entries_tiny_in_the_input_or_negligible_in_the_scores_are_not_refused():
    g = torch.Generator().manual_seed(3)
    q, k, v = torch.randn(3, 1, 2, 10, 64, generator=g)
    pos = torch.arange(2990, 3000)
    q[..., 0] = 1e-6  # subnormal in float16 already: xPos does not make it so
    q[..., 1] = 1e-4  # normal, pushed below: but a speck beside the row's other entries
    xpos = posenc.XPos(64)
    kw = {"q_positions": pos, "k_positions": pos, "causal": True}
    err = _fp16_error(xpos, q, k, v, **kw)
    assert err <= 1.5 * _fp16_error(posenc.RotaryEmbedding(64, layout="half"), q, k, v, **kw)


def test_float16_advice_names_no_centre_when_none_fits():
    # positions spread over the whole float16 range: no single centre fits, float32 does
    xpos = posenc.XPos(16, scale_base=32.0, centre=1000)
    limit = xpos.position_limit(torch.float16)
    q = torch.full((1, 2, 2, 16), 0.01, dtype=torch.float16)
    pos = torch.tensor([1000 - limit, 1000 + limit])
    with pytest.raises(ValueError, match="xPos scales q outside") as info:
        rotate(xpos, q, q, pos, pos)
    assert "centre=" not in str(info.value).split("use ")[-1]
    qr, kr = rotate(xpos, q.float(), q.float(), pos, pos)
    assert torch.isfinite(qr).all() and torch.isfinite(kr).all()
