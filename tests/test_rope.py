"""Tests for posenc.rope: golden values from explicit rotation matrices, invariants, precision."""

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import posenc
import posenc._rope_kernels as kernels_module
import posenc.rope as rope_module


def rotate(m, q, k, q_positions, k_positions):
    """The scheme hook ``m.rotate`` at the given positions (its context built as a caller would)."""
    ctx = posenc.CallContext.of(q, k, q_positions=q_positions, k_positions=k_positions)
    return m.rotate(q, k, ctx)


# ---------------------------------------------------------------- independent references


def rotation_matrix(p, dim, r, base, layout):
    """Block-diagonal rotation (float64, dim x dim) for position p, built entry by entry."""
    R = torch.eye(dim, dtype=torch.float64)
    for i in range(r // 2):
        t = p * base ** (-2.0 * i / r)
        a, b = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + r // 2)
        R[a, a], R[a, b] = math.cos(t), -math.sin(t)
        R[b, a], R[b, b] = math.sin(t), math.cos(t)
    return R


def reference(x, positions, base=10000.0, layout="interleaved", r=None):
    """x (..., seq, dim) rotated row by row with explicit matrices, in float64."""
    dim = x.shape[-1]
    r = dim if r is None else r
    x = x.double()
    out = torch.empty_like(x)
    for s, p in enumerate(positions):
        out[..., s, :] = x[..., s, :] @ rotation_matrix(int(p), dim, r, base, layout).T
    return out


def bf16_floor(exact):
    """Largest error of correctly rounding ``exact`` to bfloat16."""
    return (exact.to(torch.bfloat16).double() - exact).abs().max().item()


# ---------------------------------------------------------------- golden values


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("r", [16, 8, 2])
def test_matches_explicit_rotation_matrix(layout, r):
    x = torch.randn(2, 3, 40, 16, dtype=torch.float64)
    positions = torch.arange(40) * 37 + 5
    got = posenc.apply_rope(x, positions, layout=layout, rotary_dim=r, base=500.0)
    want = reference(x, positions.tolist(), base=500.0, layout=layout, r=r)
    assert (got - want).abs().max().item() < 1e-12
    assert torch.equal(got[..., r:], x[..., r:])  # pass-through is exact


def test_rotation_direction_is_counter_clockwise():
    # (1, 0) at angle t = 1 rad (position 1, omega_0 = 1) goes to (cos 1, sin 1)
    x = torch.tensor([[0.0, 0.0], [1.0, 0.0]], dtype=torch.float64)
    y = posenc.apply_rope(x)
    assert torch.allclose(y[1], torch.tensor([math.cos(1.0), math.sin(1.0)], dtype=torch.float64))


def test_frequencies_formula():
    dim, base = 64, 10000.0
    got = posenc.rope_frequencies(dim, base=base)
    assert got.dtype == torch.float64 and got.shape == (32,)
    want = torch.tensor([base ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    assert (got - want).abs().max().item() < 1e-15


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_three_formulations_agree(layout):
    """Complex multiply, explicit matrix and elementwise (Hadamard) form give one result."""
    dim, seq = 8, 30
    x = torch.randn(seq, dim, dtype=torch.float64)
    p = torch.arange(seq, dtype=torch.float64)
    omega = torch.tensor([10000.0 ** (-2 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    theta = p[:, None] * omega  # (seq, dim/2)
    if layout == "interleaved":
        a, b = x[:, 0::2], x[:, 1::2]
    else:
        a, b = x[:, : dim // 2], x[:, dim // 2 :]
    z = torch.complex(a, b) * torch.polar(torch.ones_like(theta), theta)
    complex_form = torch.empty_like(x)
    cos2 = torch.empty_like(x)
    sin2 = torch.empty_like(x)
    partner = torch.empty_like(x)  # the feature each one pairs with, signed
    if layout == "interleaved":
        complex_form[:, 0::2], complex_form[:, 1::2] = z.real, z.imag
        cos2[:, 0::2] = cos2[:, 1::2] = theta.cos()
        sin2[:, 0::2] = sin2[:, 1::2] = theta.sin()
        partner[:, 0::2], partner[:, 1::2] = -b, a
    else:
        complex_form = torch.cat((z.real, z.imag), dim=-1)
        cos2 = torch.cat((theta.cos(), theta.cos()), dim=-1)
        sin2 = torch.cat((theta.sin(), theta.sin()), dim=-1)
        partner = torch.cat((-b, a), dim=-1)
    hadamard = x * cos2 + partner * sin2
    matrix = reference(x, range(seq), layout=layout)
    got = posenc.apply_rope(x, layout=layout)
    for form in (complex_form, hadamard, matrix):
        assert (got - form).abs().max().item() < 1e-12


# ---------------------------------------------------------------- invariants


@given(
    m=st.integers(0, 100_000),
    n=st.integers(0, 100_000),
    layout=st.sampled_from(["interleaved", "half"]),
    half_dim=st.integers(1, 32),
)
def test_relative_property(m, n, layout, half_dim):
    """<R_m q, R_n k> = <q, R_{n-m} k>: the score depends on n - m only."""
    dim = 2 * half_dim
    g = torch.Generator().manual_seed(m * 7 + n)
    q = torch.randn(1, dim, dtype=torch.float64, generator=g)
    k = torch.randn(1, dim, dtype=torch.float64, generator=g)
    lhs = (
        posenc.apply_rope(q, [m], layout=layout) * posenc.apply_rope(k, [n], layout=layout)
    ).sum()
    rhs = (q * posenc.apply_rope(k, [n - m], layout=layout)).sum()
    assert abs(lhs - rhs).item() < 1e-9 * q.norm().item() * k.norm().item()


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_norm_preserved(layout):
    x = torch.randn(4, 100, 32, dtype=torch.float64)
    y = posenc.apply_rope(x, torch.arange(100) * 1009, layout=layout)
    assert (y.norm(dim=-1) - x.norm(dim=-1)).abs().max().item() < 1e-12


def test_layouts_equivalent_under_permutation():
    dim, r = 12, 8
    x = torch.randn(3, 20, dim, dtype=torch.float64)
    # independent permutation: half slot i <- 2i, slot i + r/2 <- 2i + 1, rest stays
    perm = [2 * i for i in range(r // 2)] + [2 * i + 1 for i in range(r // 2)] + list(range(r, dim))
    inter = posenc.apply_rope(x, layout="interleaved", rotary_dim=r)
    half = posenc.apply_rope(x[..., perm], layout="half", rotary_dim=r)
    assert (half - inter[..., perm]).abs().max().item() < 1e-12
    # and the layouts really differ (the test could fail)
    assert (posenc.apply_rope(x, layout="half", rotary_dim=r) - inter).abs().max().item() > 1e-2


def test_values_of_positions_beyond_float32_exactness():
    # positions ~ 1e6: direct float64 evaluation vs fast path vs math.cos
    pos = list(range(1_000_000, 1_000_050))
    cos_fast, sin_fast = posenc.rope_cos_sin(range(1_000_000, 1_000_050), 16)
    cos_gen, sin_gen = posenc.rope_cos_sin(torch.tensor(pos[::-1]), 16)
    omega = [10000.0 ** (-2 * i / 16) for i in range(8)]
    want = torch.tensor([[math.cos(p * w) for w in omega] for p in pos], dtype=torch.float64)
    assert (cos_fast.double() - want).abs().max().item() < 5e-7
    assert (cos_gen.double().flip(0) - want).abs().max().item() < 5e-7
    assert (sin_fast - sin_gen.flip(0)).abs().max().item() < 5e-7


# ---------------------------------------------------------------- precision


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_bf16_within_twice_rounding_floor_near_32k(layout):
    x = torch.randn(2, 4, 64, 128).to(torch.bfloat16)
    positions = torch.arange(32_704, 32_768)
    exact = reference(x, positions.tolist(), layout=layout)
    floor = bf16_floor(exact)
    got = posenc.apply_rope(x, positions, layout=layout)
    assert got.dtype == torch.bfloat16
    err = (got.double() - exact).abs().max().item()
    assert err <= 2 * floor, (err, floor)
    # what peers do: angles in bf16; the same check fails badly
    theta = positions.to(torch.bfloat16)[:, None] * posenc.rope_frequencies(128).to(torch.bfloat16)
    c, s = theta.cos().double(), theta.sin().double()
    xd = x.double()
    a, b = (
        (xd[..., 0::2], xd[..., 1::2]) if layout == "interleaved" else (xd[..., :64], xd[..., 64:])
    )
    naive_pairs = (a * c - b * s, a * s + b * c)
    naive = (
        torch.stack(naive_pairs, -1).flatten(-2)
        if layout == "interleaved"
        else torch.cat(naive_pairs, -1)
    )
    assert (naive - exact).abs().max().item() > 10 * floor


def test_bf16_module_after_to_bfloat16():
    m = posenc.RotaryEmbedding(128, max_positions=16).to(torch.bfloat16)
    x = torch.randn(1, 2, 64, 128).to(torch.bfloat16)
    positions = torch.arange(32_704, 32_768)
    exact = reference(x, positions.tolist())
    got = m(x, positions)
    assert got.dtype == torch.bfloat16
    assert (got.double() - exact).abs().max().item() <= 2 * bf16_floor(exact)
    assert m.inv_freq.dtype == torch.float64
    assert m._cache is None  # positions far past the table: computed directly, nothing cached
    m(x)  # positions 0 .. 63: tabulated
    assert m._cache[0].dtype == torch.float32
    assert len(m.state_dict()) == 0  # nothing for a dtype cast or a checkpoint to round


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_output_dtype(dtype):
    x = torch.randn(3, 10, 8).to(dtype)
    y = posenc.apply_rope(x, layout="half")
    assert y.dtype == dtype
    exact = reference(x, range(10), layout="half")
    assert (y.double() - exact).abs().max().item() <= 2 * (
        (exact.to(dtype).double() - exact).abs().max().item()
    )


# ---------------------------------------------------------------- code paths


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_chunked_paths_and_batched_positions(monkeypatch, dtype, layout):
    monkeypatch.setattr(kernels_module, "_CHUNK_ELEMENTS", 48)  # many chunks, split sequences
    x = torch.randn(2, 3, 17, 12).to(dtype)
    positions = torch.randint(0, 5000, (2, 1, 17))  # per-batch positions, broadcast over heads
    got = posenc.apply_rope(x, positions, layout=layout, rotary_dim=8)
    want = torch.stack(
        [reference(x[b], positions[b, 0].tolist(), layout=layout, r=8) for b in range(2)]
    )
    tol = (
        1e-12
        if dtype == torch.float64
        else 2 * bf16_floor(want)
        if dtype == torch.bfloat16
        else 1e-5
    )
    assert (got.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_out_and_in_place(layout):
    x = torch.randn(2, 9, 10, dtype=torch.float64)
    want = posenc.apply_rope(x, layout=layout, rotary_dim=6)
    out = torch.empty_like(x)
    assert posenc.apply_rope(x, layout=layout, rotary_dim=6, out=out) is out
    assert torch.equal(out, want)
    y = x.clone()
    posenc.apply_rope(y, layout=layout, rotary_dim=6, out=y)
    assert (y - want).abs().max().item() < 1e-15


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_non_contiguous_input(layout, dtype):
    transposed = torch.randn(10, 2, 8).to(dtype).transpose(0, 1)  # (2, 10, 8), strided
    odd_offset = torch.randn(2, 10, 10).to(dtype)[..., 1:9]  # storage offset 1
    for x in (transposed, odd_offset):
        want = posenc.apply_rope(x.contiguous(), layout=layout)
        assert torch.equal(posenc.apply_rope(x, layout=layout), want)


def test_yarn_attention_factor_scales_rotated_features():
    s = posenc.RopeScaling.yarn(4.0, 64)
    x = torch.randn(5, 16, dtype=torch.float64)
    y = posenc.apply_rope(x, scaling=s)
    want = (0.1 * math.log(4.0) + 1) * x.norm(dim=-1)
    assert (y.norm(dim=-1) - want).abs().max().item() < 1e-12


def test_scaled_frequencies_used_by_apply_rope():
    s = posenc.RopeScaling.linear(4.0)
    x = torch.randn(9, 8, dtype=torch.float64)
    # linear interpolation by 4 at position 4p == unscaled rotation at position p
    got = posenc.apply_rope(x, torch.arange(9) * 4, scaling=s)
    assert (got - reference(x, range(9))).abs().max().item() < 1e-12


# ---------------------------------------------------------------- the module


def test_module_matches_function_and_regrows_cache():
    m = posenc.RotaryEmbedding(16, layout="half", rotary_dim=12, max_positions=8)
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    assert (m(x) - posenc.apply_rope(x, layout="half", rotary_dim=12)).abs().max() < 1e-15
    assert m._cache[0].shape[0] == 8
    x = torch.randn(2, 100, 16, dtype=torch.float64)
    assert (m(x) - reference(x, range(100), layout="half", r=12)).abs().max() < 1e-12
    assert m._cache[0].shape[0] >= 100
    positions = torch.arange(100) + 5000  # far past the cache: regrows, no error
    assert (
        m(x, positions) - reference(x, positions.tolist(), layout="half", r=12)
    ).abs().max() < 1e-11


def test_module_rekeys_cache_on_device_and_dtype():
    m = posenc.RotaryEmbedding(8)
    m(torch.randn(4, 8))
    assert m._cache[0].device.type == "cpu" and m._cache[0].dtype == torch.float32
    y = m(torch.randn(4, 8, device="meta"))  # no values on meta: computed directly
    assert y.device.type == "meta" and m._cache[0].device.type == "cpu"
    x = torch.randn(4, 8, dtype=torch.float64)
    assert (m(x) - reference(x, range(4))).abs().max() < 1e-15
    assert m._cache[0].device.type == "cpu" and m._cache[0].dtype == torch.float64


def test_module_dynamic_ntk_follows_length():
    s = posenc.RopeScaling.dynamic_ntk(2.0, 16)
    m = posenc.RotaryEmbedding(8, scaling=s, max_positions=4)
    x = torch.randn(40, 8, dtype=torch.float64)
    want = posenc.apply_rope(x, scaling=s)  # seq_len = 40 > 16: base grows
    assert (m(x) - want).abs().max() < 1e-12
    assert (m(x[:10]) - reference(x[:10], range(10))).abs().max() < 1e-12  # back inside: unscaled


def test_module_negative_positions():
    m = posenc.RotaryEmbedding(8)
    x = torch.randn(3, 8, dtype=torch.float64)
    assert (m(x, [-5, 0, 7]) - reference(x, [-5, 0, 7])).abs().max() < 1e-12


def test_gradcheck():
    x = torch.randn(2, 5, 8, dtype=torch.float64, requires_grad=True)
    for layout in ("interleaved", "half"):
        assert torch.autograd.gradcheck(
            lambda t, lay=layout: posenc.apply_rope(t, layout=lay, rotary_dim=6), (x,)
        )
    m = posenc.RotaryEmbedding(8, layout="half")
    assert torch.autograd.gradcheck(lambda t: m(t, [3, 1, 4, 1, 5]), (x,))
    with pytest.raises(ValueError, match="out"):
        posenc.apply_rope(x, out=torch.empty_like(x))


# ---------------------------------------------------------------- attention integration


def test_attention_with_rotary_scheme_kv_cache():
    m = posenc.RotaryEmbedding(16, layout="half")
    assert isinstance(m, posenc.PositionalScheme)
    q = torch.randn(2, 3, 6, 16, dtype=torch.float64)
    k = torch.randn(2, 3, 10, 16, dtype=torch.float64)
    v = torch.randn(2, 3, 10, 5, dtype=torch.float64)
    got = posenc.attention(q, k, v, encoding=m, causal=True)
    # reference: queries at 4..9 (aligned with the last keys), explicit mask and softmax
    qr = reference(q, range(4, 10), layout="half")
    kr = reference(k, range(10), layout="half")
    scores = qr @ kr.transpose(-1, -2) / 4.0
    mask = torch.arange(10)[None, :] <= torch.arange(4, 10)[:, None]
    want = F.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1) @ v
    assert (got - want).abs().max().item() < 1e-12
    # one decoding step == the last row of the full computation
    step = posenc.attention(q[..., -1:, :], k, v, encoding=m, causal=True)
    assert (step - got[..., -1:, :]).abs().max().item() < 1e-12


def test_attention_scores_depend_on_relative_position_only():
    m = posenc.RotaryEmbedding(8)
    q = torch.randn(1, 8, dtype=torch.float64).expand(5, 8)
    k = torch.randn(1, 8, dtype=torch.float64).expand(5, 8)
    qr, kr = rotate(m, q, k, torch.arange(5) + 100, torch.arange(5) + 100)
    s = qr @ kr.T  # s[i, j] depends on j - i only
    for d in range(-4, 5):
        diag = torch.diagonal(s, d)
        assert (diag - diag[0]).abs().max().item() < 1e-12


# ---------------------------------------------------------------- bad input


def test_bad_input():
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match="dim"):
        posenc.apply_rope(torch.randn(4, 7))
    with pytest.raises(ValueError, match="layout"):
        posenc.apply_rope(x, layout="neox")
    with pytest.raises(ValueError, match="rotary_dim"):
        posenc.apply_rope(x, rotary_dim=5)
    with pytest.raises(ValueError, match="rotary_dim"):
        posenc.apply_rope(x, rotary_dim=10)
    with pytest.raises(ValueError, match="positions"):
        posenc.apply_rope(x, [0, 1, 2])
    with pytest.raises(ValueError, match="positions"):
        posenc.apply_rope(x, torch.tensor(3))
    with pytest.raises(TypeError, match="positions"):
        posenc.apply_rope(x, torch.arange(4.0))
    with pytest.raises(TypeError, match="positions"):
        posenc.apply_rope(x, [0, 1, 2.5, 3])
    with pytest.raises(TypeError, match="x"):
        posenc.apply_rope(torch.arange(8).reshape(2, 4))
    with pytest.raises(ValueError, match="x"):
        posenc.apply_rope(torch.randn(8))
    with pytest.raises(TypeError, match="scaling"):
        posenc.apply_rope(x, scaling=2.0)
    with pytest.raises(ValueError, match="out"):
        posenc.apply_rope(x, out=torch.empty(4, 6))
    with pytest.raises(ValueError, match="dim"):
        posenc.rope_frequencies(-4)
    with pytest.raises(ValueError, match="dim"):
        posenc.rope_frequencies(7)
    with pytest.raises(ValueError, match="base"):
        posenc.rope_frequencies(8, base=-1.0)
    with pytest.raises(ValueError, match="seq_len"):
        posenc.rope_frequencies(8, seq_len=-1)
    with pytest.raises(ValueError, match="dim"):
        posenc.rope_cos_sin(range(4), 7)
    with pytest.raises(TypeError, match="dtype"):
        posenc.rope_cos_sin(range(4), 8, dtype=torch.int32)
    with pytest.raises(TypeError, match="positions"):
        posenc.rope_cos_sin(torch.rand(4), 8)
    with pytest.raises(ValueError, match="dim"):
        posenc.RotaryEmbedding(-2)
    with pytest.raises(ValueError, match="rotary_dim"):
        posenc.RotaryEmbedding(8, rotary_dim=12)
    with pytest.raises(ValueError, match="layout"):
        posenc.RotaryEmbedding(8, layout="gptj")
    with pytest.raises(ValueError, match="max_positions"):
        posenc.RotaryEmbedding(8, max_positions=0)
    with pytest.raises(ValueError, match="dim"):
        posenc.RotaryEmbedding(8)(torch.randn(3, 16))


# ---------------------------------------------------------------- per-sample positions


def per_item_reference(x, positions, **kw):
    """x (batch, ..., seq, dim), positions (batch, seq): item b rotated at positions[b]."""
    return torch.stack([reference(x[b], positions[b].tolist(), **kw) for b in range(x.shape[0])])


def rotate_by(how, x, positions, layout):
    """One code path of RoPE applied to ``x`` at ``positions``."""
    if how == "apply_rope":
        return posenc.apply_rope(x, positions, layout=layout, rotary_dim=6)
    if how == "autograd":  # the differentiable (functional) form
        return posenc.apply_rope(x.requires_grad_(), positions, layout=layout, rotary_dim=6)
    m = posenc.RotaryEmbedding(x.shape[-1], layout=layout, rotary_dim=6)
    if how == "module":
        return m(x, positions)
    q, k = rotate(m, x, x[:, :1], positions, positions)  # "rotate": also one key head (MQA)
    assert (k - q[:, :1]).abs().max() == 0
    return q


@pytest.mark.parametrize("heads", [2, 3])  # heads == batch: once silently rotated per head
@pytest.mark.parametrize("how", ["apply_rope", "autograd", "module", "rotate"])
@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_batch_positions_mean_one_row_per_batch_item(monkeypatch, heads, how, layout, dtype):
    monkeypatch.setattr(kernels_module, "_CHUNK_ELEMENTS", 40)  # chunks straddle batch items
    x = torch.randn(2, heads, 7, 8).to(dtype)
    positions = torch.stack([torch.arange(7) + 3, torch.tensor([0, 0, 0, 1, 2, 3, 4])])
    got = rotate_by(how, x, positions, layout)
    want = per_item_reference(x.detach(), positions, layout=layout, r=6)
    tol = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype) or 2 * bf16_floor(want)
    assert got.shape == x.shape and got.dtype == dtype
    assert (got.detach().double() - want).abs().max().item() <= tol
    # and per head would differ: the test can fail
    per_head = torch.stack(
        [
            reference(x[:, h].detach(), positions[h % 2].tolist(), layout=layout, r=6)
            for h in range(heads)
        ],
        dim=1,
    )
    assert (per_head - want).abs().max().item() > 1e-2


def test_other_position_forms():
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    p = torch.randint(0, 1000, (2, 5))
    want = per_item_reference(x, p)
    # (1, seq) broadcasts over the batch; 3-D x (batch, seq, dim) takes (batch, seq)
    assert (posenc.apply_rope(x, p[:1]) - reference(x, p[0].tolist())).abs().max() < 1e-12
    assert (posenc.apply_rope(x[:, 0], p) - want[:, 0]).abs().max() < 1e-12
    # one position per row: x.shape[:-1], and with size-1 dimensions
    full = torch.randint(0, 1000, (2, 3, 5))
    got = posenc.apply_rope(x, full)
    for b in range(2):
        for h in range(3):
            assert (got[b, h] - reference(x[b, h], full[b, h].tolist())).abs().max() < 1e-12
    assert (posenc.apply_rope(x, p[:, None, :]) - want).abs().max() < 1e-12


def test_ambiguous_or_oversized_positions_are_refused():
    x = torch.randn(2, 3, 5, 8)
    for bad in (torch.zeros(3, 5), torch.zeros(4, 5)):  # (heads, seq) / nothing: not a batch
        with pytest.raises(ValueError, match=r"positions must have shape .*batch = x.shape\[0\]"):
            posenc.apply_rope(x, bad.long())
    for bad in (torch.zeros(7, 2, 3, 5), torch.zeros(2, 2, 5), torch.zeros(2, 3, 4)):
        with pytest.raises(ValueError, match="positions"):
            posenc.apply_rope(x, bad.long())
    with pytest.raises(ValueError, match="no batch dimension"):
        posenc.apply_rope(torch.randn(5, 8), torch.zeros(2, 5, dtype=torch.long))
    m = posenc.RotaryEmbedding(8)
    with pytest.raises(ValueError, match="k_positions"):
        rotate(m, x, x, torch.arange(5), torch.zeros(3, 5, dtype=torch.long))
    with pytest.raises(ValueError, match="positions"):
        m(x, torch.zeros(3, 5, dtype=torch.long))


# ---------------------------------------------------------------- compile, export, transforms


def compiled(fn, backend="aot_eager"):
    """``fn`` under torch.compile with zero graph breaks allowed."""
    torch._dynamo.reset()
    return torch.compile(fn, fullgraph=True, backend=backend)


@pytest.mark.parametrize("grad", [False, True])
def test_compile_apply_rope_without_graph_breaks(grad):
    x = torch.randn(2, 3, 6, 8, requires_grad=grad)
    p = torch.tensor([[0, 1, 2, 3, 4, 5], [9, 9, 10, 11, 12, 13]])

    def f(x, p):
        a = posenc.apply_rope(x, p, layout="half", rotary_dim=6)
        return a + posenc.apply_rope(x, scaling=posenc.RopeScaling.dynamic_ntk(2.0, 4))

    got = compiled(f, backend="inductor")(x, p)
    want = f(x, p)
    assert (got - want).abs().max().item() < 1e-5
    if grad:
        (g,) = torch.autograd.grad(got.sum(), x)
        (w,) = torch.autograd.grad(want.sum(), x)
        assert (g - w).abs().max().item() < 1e-5


def test_compile_rotary_embedding_as_a_scheme():
    rope = posenc.RotaryEmbedding(8, layout="half", scaling=posenc.RopeScaling.dynamic_ntk(2.0, 4))
    q, k = torch.randn(2, 4, 3, 8), torch.randn(2, 2, 9, 8)
    qp, kp = torch.tensor([[6, 7, 8], [4, 5, 6]]), torch.arange(9)

    got = compiled(rope.rotate)(q, k, qp, kp)
    want = rotate(rope, q, k, qp, kp)
    for a, b in zip(got, want, strict=True):
        assert (a - b).abs().max().item() < 1e-5
    plain = posenc.RotaryEmbedding(8)
    v = torch.randn(1, 2, 6, 8)

    def attend(q, k, v):
        return posenc.attention(q, k, v, encoding=plain, causal=True)

    assert (compiled(attend)(v, v, v) - attend(v, v, v)).abs().max().item() < 1e-5


def test_export_apply_rope_and_rotary_embedding():
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rope = posenc.RotaryEmbedding(8, scaling=posenc.RopeScaling.dynamic_ntk(2.0, 4))

        def forward(self, q, k, qp, kp):
            q, k = rotate(self.rope, q, k, qp, kp)
            return q, k, posenc.apply_rope(q, qp, layout="half")

    layer = Layer()
    args = (
        torch.randn(2, 4, 3, 8),
        torch.randn(2, 2, 3, 8),
        torch.arange(3) + 5,
        torch.tensor([[0, 1, 2], [7, 8, 9]]),
    )
    exported = torch.export.export(layer, args).module()
    for a, b in zip(exported(*args), layer(*args), strict=True):
        assert (a - b).abs().max().item() < 1e-5


def test_vmap_and_forward_mode_ad():
    x, t = torch.randn(4, 2, 6, 8), torch.randn(4, 2, 6, 8)
    p = torch.randint(0, 100, (6,))
    for layout in ("interleaved", "half"):
        want = posenc.apply_rope(x, p, layout=layout)
        got = torch.func.vmap(lambda a, lay=layout: posenc.apply_rope(a, p, layout=lay))(x)
        assert (got - want).abs().max().item() < 1e-5
        # RoPE is linear in x: the tangent is the rotated tangent
        primal, tangent = torch.func.jvp(
            lambda a, lay=layout: posenc.apply_rope(a, p, layout=lay), (x,), (t,)
        )
        assert (primal - want).abs().max().item() < 1e-5
        assert (tangent - posenc.apply_rope(t, p, layout=layout)).abs().max().item() < 1e-5
    with torch.autograd.forward_ad.dual_level():
        out = posenc.apply_rope(torch.autograd.forward_ad.make_dual(x, t), p)
        tangent = torch.autograd.forward_ad.unpack_dual(out).tangent
    assert (tangent - posenc.apply_rope(t, p)).abs().max().item() < 1e-5
    with pytest.raises(ValueError, match="out must be None inside vmap"):
        torch.func.vmap(lambda a: posenc.apply_rope(a, out=torch.empty_like(a)))(x)


def test_out_under_compile_still_writes_out():
    x = torch.randn(2, 5, 8)
    want = posenc.apply_rope(x)

    def f(x, out):
        return posenc.apply_rope(x, out=out)

    out = torch.empty_like(x)
    compiled(f)(x, out)
    assert (out - want).abs().max().item() < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_meta_tensors(dtype):
    x = torch.empty(2, 4, 5, 8, device="meta", dtype=dtype)
    p = torch.zeros(2, 5, dtype=torch.long, device="meta")
    for layout in ("interleaved", "half"):
        y = posenc.apply_rope(x, p, layout=layout, rotary_dim=6)
        assert y.shape == x.shape and y.device.type == "meta" and y.dtype == dtype
    m = posenc.RotaryEmbedding(8, scaling=posenc.RopeScaling.yarn(4.0, 16))
    q, k = rotate(m, x, x[:, :2], p, torch.arange(5, device="meta"))
    assert q.shape == x.shape and k.shape == (2, 2, 5, 8) and k.device.type == "meta"
    assert m(x).device.type == "meta"


# ---------------------------------------------------------------- large positions, no big tables


def count_angles(monkeypatch):
    """Record how many cos/sin entries RoPE evaluates (through posenc._angles.cos_sin)."""
    counts = []
    real = rope_module.cos_sin

    def spy(positions, inv_freq, **kw):
        cos, sin = real(positions, inv_freq, **kw)
        counts.append(cos.numel())
        return cos, sin

    monkeypatch.setattr(rope_module, "cos_sin", spy)
    return counts


def test_one_step_at_three_million_computes_only_its_own_angles(monkeypatch):
    counts = count_angles(monkeypatch)
    m = posenc.RotaryEmbedding(128, layout="half")
    m(torch.randn(1, 2, 16, 128))  # a prompt: builds the initial table (2048 rows)
    assert m._cache[0].shape[0] == 2048
    q, k = torch.randn(1, 8, 1, 128, dtype=torch.float64), torch.randn(1, 2, 1, 128)
    pos = torch.tensor([3_000_000])
    counts.clear()
    qr, _ = rotate(m, q, k.double(), pos, pos)
    assert sum(counts) <= 2 * 64  # one position for q, one for k: not 3e6 rows
    assert m._cache[0].shape[0] == 2048  # the table did not grow to the position
    assert (qr - reference(q, [3_000_000], layout="half")).abs().max().item() < 1e-8
    counts.clear()
    posenc.apply_rope(q, torch.tensor([3_000_000]), layout="half")
    posenc.rope_cos_sin(torch.tensor([[3_000_000, 5]]), 128)
    assert sum(counts) <= 3 * 64


def test_decoding_grows_the_table_by_doubling(monkeypatch):
    counts = count_angles(monkeypatch)
    m = posenc.RotaryEmbedding(8, max_positions=16)
    q = torch.randn(1, 1, 1, 8, dtype=torch.float64)
    for p in range(300):  # rotate-once decoding: one new position per step
        pos = torch.tensor([p])
        qr, _ = rotate(m, q, q, pos, pos)
    assert (qr - reference(q, [299])).abs().max().item() < 1e-12
    rows = [c // 4 for c in counts if c > 8]  # table builds (other calls gather)
    assert rows == [16, 32, 64, 128, 256, 512]
    # re-rotating the whole cache each step grows it the same way
    m = posenc.RotaryEmbedding(8, max_positions=16)
    for n in (20, 21, 40, 100):
        rotate(m, q, torch.randn(1, 1, n, 8), torch.tensor([n - 1]), torch.arange(n))
    assert m._cache[0].shape[0] == 100  # 20, then 2 * 20 = 40, then 100 (past 2 * 40)


def test_chunk_at_a_large_offset_is_computed_directly():
    m = posenc.RotaryEmbedding(8)
    x = torch.randn(2, 64, 8, dtype=torch.float64)
    pos = torch.arange(64) + 10**8
    assert (m(x, pos) - reference(x, pos.tolist())).abs().max().item() < 1e-7
    assert m._cache is None


@pytest.mark.parametrize("p", [2**63 - 1, -(2**63), 2**31, -(2**31)])
def test_positions_beyond_two_to_the_31_raise(p):
    x = torch.randn(2, 8)
    pos = torch.tensor([0, p])
    dyn = posenc.RopeScaling.dynamic_ntk(2.0, 4)
    with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
        posenc.apply_rope(x, pos)
    with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
        posenc.apply_rope(x, pos, scaling=dyn)  # max + 1 would overflow int64
    with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
        posenc.rope_cos_sin(pos, 8)
    with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
        posenc.RotaryEmbedding(8)(x, pos)
    with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
        rotate(posenc.RotaryEmbedding(8, scaling=dyn), x, x, pos, torch.arange(2))
    if p > 0:
        with pytest.raises(ValueError, match="positions must lie strictly within 2\\*\\*31"):
            posenc.rope_cos_sin(range(p - 1, p + 1), 8)
    ok = posenc.apply_rope(x, torch.tensor([0, 2**31 - 1]))  # the last accepted position
    assert torch.isfinite(ok).all()


def test_traced_positions_beyond_two_to_the_31_give_nan():
    x = torch.randn(3, 8)
    y = compiled(posenc.apply_rope)(x, torch.tensor([0, 2**40, 2]))
    assert torch.isnan(y[1]).all() and torch.isfinite(y[[0, 2]]).all()


@pytest.mark.skipif(not hasattr(posenc.RopeScaling, "longrope"), reason="needs longrope")
def test_longrope_switches_at_the_original_length_eager_cached_and_compiled():
    s = posenc.RopeScaling.longrope([1.0, 1.5, 2.0, 4.0], [1.0, 3.0, 6.0, 16.0], 16, 4.0)
    m = posenc.RotaryEmbedding(8, scaling=s)
    x = torch.randn(2, 24, 8, dtype=torch.float64)
    factor = s.attention_factor
    for n, divisors in ((16, [1.0, 1.5, 2.0, 4.0]), (24, [1.0, 3.0, 6.0, 16.0])):
        omega = [10000.0 ** (-2 * i / 8) / divisors[i] for i in range(4)]
        want = torch.empty(2, n, 8, dtype=torch.float64)
        for p in range(n):
            for i, w in enumerate(omega):
                c, si = math.cos(p * w), math.sin(p * w)
                a, b = x[:, p, 2 * i], x[:, p, 2 * i + 1]
                want[:, p, 2 * i], want[:, p, 2 * i + 1] = a * c - b * si, a * si + b * c
        want = factor * want
        assert (m(x[:, :n]) - want).abs().max().item() < 1e-12  # cached table / direct
        assert (posenc.apply_rope(x[:, :n], scaling=s) - want).abs().max().item() < 1e-12
        got = compiled(m.rotate)(x[:, :n], x[:, :n], torch.arange(n), torch.arange(n))
        assert (got[1] - want).abs().max().item() < 1e-12


# --- the compiled one-pass rotation (posenc._fused_rope) -----------------------------------
# Each case compiles a kernel (seconds): few cases, each combining features.

_needs_compile = pytest.mark.skipif(
    not posenc.flex_available("cpu"), reason="torch.compile cannot build kernels here"
)


@_needs_compile
@pytest.mark.parametrize(
    "layout, dtype",
    [("half", torch.bfloat16), ("interleaved", torch.bfloat16), ("interleaved", torch.float32)],
)
def test_compiled_rotation_matches_float64(layout, dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 40, 16, generator=g).to(dtype)
    pos = torch.randint(0, 50000, (2, 40), generator=g)  # per batch item
    got = posenc.apply_rope(x, pos, layout=layout, compiled=True)
    eager = posenc.apply_rope(x, pos, layout=layout)
    assert got.dtype == dtype and got.shape == x.shape
    want = torch.stack([reference(x[b], pos[b], layout=layout) for b in range(2)])
    # float32: roundoff of the float32 tables; bf16: within 2x the rounding floor, as eager
    tol = 2e-6 if dtype == torch.float32 else 2 * bf16_floor(want)
    assert (got.double() - want).abs().max().item() <= tol
    assert (eager.double() - want).abs().max().item() <= tol


@_needs_compile
def test_compiled_pair_rotates_queries_and_keys_like_eager():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(2, 4, 9, 16, generator=g)
    k = torch.randn(2, 2, 21, 16, generator=g)  # grouped-query keys, a KV cache
    qp, kp = torch.arange(12, 21), torch.arange(21)
    fused = posenc.RotaryEmbedding(16, layout="half", compiled=True)
    eager = posenc.RotaryEmbedding(16, layout="half")
    with torch.no_grad():
        got = rotate(fused, q, k, qp, kp)
        want = rotate(eager, q, k, qp, kp)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-6)
    assert "compiled=True" in repr(fused)
    with pytest.raises(TypeError, match="compiled must be a bool"):
        posenc.apply_rope(q, compiled=1)
    # with gradients the eager path runs (no compile), and gradients flow
    q.requires_grad_(True)
    rotate(fused, q, k, qp, kp)[0].sum().backward()
    assert q.grad is not None


def test_the_old_positional_rotate_form_warns_and_still_works():
    m = posenc.RotaryEmbedding(8)
    q, k, pos = torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8), torch.arange(5) + 3
    with pytest.warns(DeprecationWarning, match=r"RotaryEmbedding\.rotate\(q, k, q_positions") as w:
        old = m.rotate(q, k, pos, pos)
    assert "posenc.CallContext" in str(w[0].message) and "0.2.0" in str(w[0].message)
    assert w[0].filename == __file__  # attributed to the caller's line, not to posenc
    new = rotate(m, q, k, pos, pos)
    assert torch.equal(old[0], new[0]) and torch.equal(old[1], new[1])
