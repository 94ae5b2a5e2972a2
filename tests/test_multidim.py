"""Tests for posenc.multidim: float64 loop references, peers' formulas, invariants, tracing."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc

# the sinusoidal "all sines, then all cosines" layout
SIN_HALF = "half"
SIN_LAYOUTS = ["interleaved", SIN_HALF]
ROPE_LAYOUTS = ["interleaved", "half"]

# ---------------------------------------------------------------- independent references


def sinusoid_1d(p, dim, base, layout):
    """One 1-D sinusoidal code, entry by entry in float64 (Vaswani et al., section 3.5)."""
    code = [0.0] * dim
    for i in range(dim // 2):
        t = p * base ** (-2.0 * i / dim)
        s_idx, c_idx = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + dim // 2)
        code[s_idx], code[c_idx] = math.sin(t), math.cos(t)
    return code


def axial_sinusoid_reference(positions, dim, base=10000.0, layout="interleaved"):
    """(..., n) integer positions -> (..., dim): one 1-D code per axis, concatenated."""
    flat = positions.reshape(-1, positions.shape[-1]).tolist()
    n = positions.shape[-1]
    rows = [sum((sinusoid_1d(p, dim // n, base, layout) for p in cell), []) for cell in flat]
    return torch.tensor(rows, dtype=torch.float64).reshape(*positions.shape[:-1], dim)


def axial_rotation_matrix(cell, dim, base, layout):
    """Rotation (float64, dim x dim) of axial RoPE for one cell, built pair by pair."""
    n = len(cell)
    per_axis = dim // (2 * n)  # rotary pairs per axis
    R = torch.eye(dim, dtype=torch.float64)
    for k in range(dim // 2):
        axis, i = divmod(k, per_axis)
        t = cell[axis] * base ** (-2.0 * i / (dim // n))
        a, b = (2 * k, 2 * k + 1) if layout == "interleaved" else (k, k + dim // 2)
        R[a, a], R[a, b] = math.cos(t), -math.sin(t)
        R[b, a], R[b, b] = math.sin(t), math.cos(t)
    return R


def axial_rope_reference(x, positions, base=10000.0, layout="interleaved"):
    """x (..., seq, dim) rotated token by token with explicit matrices, float64."""
    x = x.double()
    out = torch.empty_like(x)
    for s, cell in enumerate(positions.tolist()):
        out[..., s, :] = x[..., s, :] @ axial_rotation_matrix(cell, x.shape[-1], base, layout).T
    return out


def mae_2d_sincos(embed_dim, grid_size):
    """MAE's 2-D sin-cos table, transcribed in float64 from facebookresearch/mae
    util/pos_embed.py (get_2d_sincos_pos_embed and its helpers): meshgrid(w, h), so
    the first half of the channels encodes the column; each half is sines then cosines
    with omega = 1 / 10000**(i / (embed_dim / 4))."""
    grid_h = np.arange(grid_size, dtype=np.float64)
    grid_w = np.arange(grid_size, dtype=np.float64)
    grid = np.stack(np.meshgrid(grid_w, grid_h), axis=0).reshape(2, 1, grid_size, grid_size)

    def one_d(d, pos):
        omega = np.arange(d // 2, dtype=np.float64) / (d / 2.0)
        omega = 1.0 / 10000**omega
        out = np.einsum("m,d->md", pos.reshape(-1), omega)
        return np.concatenate([np.sin(out), np.cos(out)], axis=1)

    emb = np.concatenate([one_d(embed_dim // 2, grid[0]), one_d(embed_dim // 2, grid[1])], 1)
    return torch.from_numpy(emb)


def heo_axial_rope(x, end_x, end_y, theta=100.0):
    """RoPE-Axial, transcribed in float64 from naver-ai/rope-vit models/vit_rope.py
    (compute_axial_cis, apply_rotary_emb): token t sits at column t % end_x and row
    t // end_x; complex pairs (2k, 2k+1); the first dim/4 pairs turn with the column."""
    dim = x.shape[-1]
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 4)[: dim // 4].double() / dim))
    t = torch.arange(end_x * end_y)
    t_x, t_y = (t % end_x).double(), torch.div(t, end_x, rounding_mode="floor").double()
    cis_x = torch.polar(torch.ones(len(t), dim // 4, dtype=torch.float64), torch.outer(t_x, freqs))
    cis_y = torch.polar(torch.ones(len(t), dim // 4, dtype=torch.float64), torch.outer(t_y, freqs))
    cis = torch.cat([cis_x, cis_y], dim=-1)
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * cis).flatten(-2)


# ---------------------------------------------------------------- grid positions


def test_grid_positions_row_major():
    got = posenc.grid_positions(3, 4)
    want = [(r, c) for r in range(3) for c in range(4)]
    assert got.dtype == torch.int64 and got.tolist() == [list(rc) for rc in want]
    # patch t of a flattened (h, w) map sits at (t // w, t % w)
    fmap = torch.arange(12).reshape(3, 4)
    assert torch.equal(fmap.flatten()[got[:, 0] * 4 + got[:, 1]], torch.arange(12))


def test_grid_positions_three_axes_and_empty():
    got = posenc.grid_positions(2, 3, 2)
    want = [[t, r, c] for t in range(2) for r in range(3) for c in range(2)]
    assert got.tolist() == want
    assert posenc.grid_positions(0, 5).shape == (0, 2)


@pytest.mark.parametrize(
    ("args", "exc", "match"),
    [
        ((), ValueError, "sizes"),
        ((3, -1), ValueError, r"sizes\[1\]"),
        ((2.0, 3), TypeError, r"sizes\[0\]"),
    ],
)
def test_grid_positions_errors(args, exc, match):
    with pytest.raises(exc, match=match):
        posenc.grid_positions(*args)


# ---------------------------------------------------------------- sinusoidal


@pytest.mark.parametrize("layout", SIN_LAYOUTS)
@pytest.mark.parametrize("num_axes", [1, 2, 3])
def test_axial_sinusoidal_matches_loop(layout, num_axes):
    pos = torch.randint(-50, 3000, (7, num_axes))
    got = posenc.axial_sinusoidal_encoding(pos, 12, base=500.0, layout=layout, dtype=torch.float64)
    want = axial_sinusoid_reference(pos, 12, base=500.0, layout=layout)
    assert got.shape == (7, 12)
    assert (got - want).abs().max().item() < 1e-12


def test_axial_sinusoidal_one_axis_is_the_1d_table():
    pos = torch.arange(40)[:, None]
    for layout in SIN_LAYOUTS:
        got = posenc.axial_sinusoidal_encoding(pos, 16, layout=layout, dtype=torch.float64)
        want = posenc.sinusoidal_table(40, 16, layout=layout, dtype=torch.float64)
        assert (got - want).abs().max().item() < 1e-13


@pytest.mark.parametrize("layout", SIN_LAYOUTS)
def test_table_2d_matches_loop_and_axial_form(layout):
    h, w, d = 5, 7, 16
    table = posenc.sinusoidal_table_2d(h, w, d, layout=layout, dtype=torch.float64)
    assert table.shape == (h, w, d)
    grid = posenc.grid_positions(h, w)
    want = axial_sinusoid_reference(grid, d, layout=layout).reshape(h, w, d)
    assert (table - want).abs().max().item() < 1e-13
    axial = posenc.axial_sinusoidal_encoding(grid, d, layout=layout, dtype=torch.float64)
    assert (table.flatten(0, 1) - axial).abs().max().item() < 1e-13
    # layout: first half depends on the row only, second half on the column only
    assert torch.equal(table[:, :1, : d // 2].expand(h, w, d // 2), table[..., : d // 2])
    assert torch.equal(table[:1, :, d // 2 :].expand(h, w, d // 2), table[..., d // 2 :])


def test_mae_table_is_column_first_half_layout():
    grid_size, d = 6, 32
    want = mae_2d_sincos(d, grid_size)
    got = posenc.axial_sinusoidal_encoding(
        posenc.grid_positions(grid_size, grid_size).flip(-1),
        d,
        layout=SIN_HALF,
        dtype=torch.float64,
    )
    assert (got - want).abs().max().item() < 1e-12
    # and the row-first table differs: the channel order matters
    ours = posenc.sinusoidal_table_2d(grid_size, grid_size, d, layout=SIN_HALF, dtype=torch.float64)
    assert (ours.flatten(0, 1) - want).abs().max().item() > 0.5


def test_table_2d_float32_accuracy_on_a_large_grid():
    # exact angle addition per axis: float32 entries within a few roundoff units
    table = posenc.sinusoidal_table_2d(3000, 5, 8)
    rows = torch.tensor([0, 1, 1234, 2999])
    want = axial_sinusoid_reference(torch.stack([rows, rows % 5], -1), 8)
    got = table[rows, rows % 5].double()
    assert (got - want).abs().max().item() < 3e-7


def test_table_2d_low_precision_is_rounded_once():
    exact = posenc.sinusoidal_table_2d(9, 11, 16, dtype=torch.float64)
    got = posenc.sinusoidal_table_2d(9, 11, 16, dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    floor = (exact.to(torch.bfloat16).double() - exact).abs().max().item()
    assert (got.double() - exact).abs().max().item() <= 2 * floor


def test_sinusoidal_2d_shift_is_one_linear_map():
    # a shift by (dr, dc) is the block-diagonal M_row(dr) (+) M_col(dc), the same at every cell
    d, (dr, dc) = 16, (2, 3)
    table = posenc.sinusoidal_table_2d(8, 9, d, dtype=torch.float64)
    m = torch.block_diag(
        posenc.sinusoidal_shift_matrix(dr, d // 2), posenc.sinusoidal_shift_matrix(dc, d // 2)
    )
    moved = table[:-dr, :-dc] @ m.T
    assert (moved - table[dr:, dc:]).abs().max().item() < 1e-12


@pytest.mark.parametrize(
    ("kwargs", "exc", "match"),
    [
        ({"dim": 6}, ValueError, "dim must be a positive multiple of 2 \\* num_axes = 4"),
        ({"dim": 8.0}, TypeError, "dim"),
        ({"layout": "bogus"}, ValueError, "layout"),
        ({"base": -1.0}, ValueError, "base"),
        ({"dtype": torch.int32}, TypeError, "dtype"),
    ],
)
def test_axial_sinusoidal_errors(kwargs, exc, match):
    args = {"positions": posenc.grid_positions(2, 2), "dim": 8} | kwargs
    with pytest.raises(exc, match=match):
        posenc.axial_sinusoidal_encoding(**args)


@pytest.mark.parametrize(
    ("positions", "exc", "match"),
    [
        (torch.arange(4), ValueError, r"positions must have shape \(\.\.\., num_axes\)"),
        (torch.zeros(3, 2), TypeError, "positions must hold integers"),
        ("rows", TypeError, "positions"),
    ],
)
def test_positions_errors(positions, exc, match):
    with pytest.raises(exc, match=match):
        posenc.axial_sinusoidal_encoding(positions, 8)
    with pytest.raises(exc, match=match):
        posenc.axial_rope_cos_sin(positions, 8)


def test_nested_lists_are_accepted():
    got = posenc.axial_sinusoidal_encoding([[0, 1], [2, 3]], 8, dtype=torch.float64)
    want = axial_sinusoid_reference(torch.tensor([[0, 1], [2, 3]]), 8)
    assert (got - want).abs().max().item() < 1e-13


def test_table_2d_errors():
    with pytest.raises(ValueError, match="dim must be a positive multiple of 2 \\* num_axes = 4"):
        posenc.sinusoidal_table_2d(2, 2, 6)
    with pytest.raises(ValueError, match="height"):
        posenc.sinusoidal_table_2d(-1, 2, 8)
    with pytest.raises(TypeError, match="width"):
        posenc.sinusoidal_table_2d(2, 2.5, 8)


# ---------------------------------------------------------------- axial RoPE


@pytest.mark.parametrize("layout", ROPE_LAYOUTS)
@pytest.mark.parametrize("num_axes", [1, 2, 3])
def test_axial_rope_matches_rotation_matrices(layout, num_axes):
    d = 12 * num_axes
    pos = torch.randint(-20, 500, (9, num_axes))
    x = torch.randn(2, 3, 9, d, dtype=torch.float64)
    got = posenc.apply_axial_rope(x, pos, base=300.0, layout=layout)
    want = axial_rope_reference(x, pos, base=300.0, layout=layout)
    assert (got - want).abs().max().item() < 1e-12


def test_axial_rope_cos_sin_matches_loop():
    pos = torch.tensor([[3, 5], [0, 7], [11, 2]])
    cos, sin = posenc.axial_rope_cos_sin(pos, 8, base=100.0, dtype=torch.float64)
    assert cos.shape == sin.shape == (3, 4)
    for s, (r, c) in enumerate(pos.tolist()):
        for k in range(4):
            p = r if k < 2 else c  # pairs 0, 1 turn with the row, 2, 3 with the column
            t = p * 100.0 ** (-2.0 * (k % 2) / 4)
            assert abs(cos[s, k].item() - math.cos(t)) < 1e-15
            assert abs(sin[s, k].item() - math.sin(t)) < 1e-15


@pytest.mark.parametrize("layout", ROPE_LAYOUTS)
def test_one_axis_is_apply_rope(layout):
    x = torch.randn(4, 20, 16, dtype=torch.float64)
    pos = torch.arange(20) * 3 + 1
    got = posenc.apply_axial_rope(x, pos[:, None], layout=layout)
    assert (got - posenc.apply_rope(x, pos, layout=layout)).abs().max().item() < 1e-13


def test_heo_rope_axial_is_column_first_interleaved():
    h, w, d = 4, 5, 16
    x = torch.randn(2, h * w, d, dtype=torch.float64)
    want = heo_axial_rope(x, end_x=w, end_y=h, theta=100.0)
    got = posenc.apply_axial_rope(x, posenc.grid_positions(h, w).flip(-1), base=100.0)
    assert (got - want).abs().max().item() < 1e-12
    row_first = posenc.apply_axial_rope(x, posenc.grid_positions(h, w), base=100.0)
    assert (row_first - want).abs().max().item() > 0.1


@pytest.mark.parametrize("layout", ROPE_LAYOUTS)
def test_2d_score_is_sum_of_1d_scores(layout):
    # each axis's pairs are an ordinary 1-D RoPE on its own features
    d = 16
    q, k = torch.randn(d, dtype=torch.float64), torch.randn(d, dtype=torch.float64)
    (r, c), (r2, c2) = (3, 8), (7, 1)
    pos_q, pos_k = torch.tensor([[r, c]]), torch.tensor([[r2, c2]])
    score = (
        posenc.apply_axial_rope(q[None], pos_q, layout=layout)
        @ posenc.apply_axial_rope(k[None], pos_k, layout=layout).T
    )
    if layout == "interleaved":
        row_f, col_f = torch.arange(0, d // 2), torch.arange(d // 2, d)
    else:
        row_f = torch.cat([torch.arange(0, d // 4), torch.arange(d // 2, 3 * d // 4)])
        col_f = torch.cat([torch.arange(d // 4, d // 2), torch.arange(3 * d // 4, d)])

    def one_d(f, p, p2):
        a = posenc.apply_rope(q[f][None], [p], layout=layout)
        b = posenc.apply_rope(k[f][None], [p2], layout=layout)
        return (a @ b.T).item()

    want = one_d(row_f, r, r2) + one_d(col_f, c, c2)
    assert abs(score.item() - want) < 1e-12


@given(
    st.sampled_from(ROPE_LAYOUTS),
    st.lists(st.integers(-1000, 1000), min_size=6, max_size=6),
    st.integers(0, 2**31 - 1),
)
def test_score_depends_only_on_offset(layout, coords, seed):
    """<R(p) q, R(p') k> == <R(p + s) q, R(p' + s) k> for any common shift s."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 16, generator=g, dtype=torch.float64)
    p, p2, s = torch.tensor(coords).view(3, 1, 2)

    def score(a, b):
        qa = posenc.apply_axial_rope(q, a, layout=layout)
        kb = posenc.apply_axial_rope(k, b, layout=layout)
        return (qa @ kb.T).item()

    base_score = score(p, p2)
    assert abs(score(p + s, p2 + s) - base_score) < 1e-10 * (1 + abs(base_score))
    # and it is a function of the offset: the query at the origin gives the same score
    assert abs(score(p - p, p2 - p) - base_score) < 1e-10 * (1 + abs(base_score))


def test_distinct_offsets_give_distinct_scores():
    # the score is not trivially invariant: the 2-D offsets of a 5 x 6 grid are told apart
    q, k = torch.randn(2, 1, 16, dtype=torch.float64)
    grid = posenc.grid_positions(5, 6)
    s = (
        posenc.apply_axial_rope(q.expand(30, 16), grid)
        @ posenc.apply_axial_rope(k.expand(30, 16), grid).T
    )
    from_origin = s[0].numpy().round(9)
    assert len(set(from_origin.tolist())) == 30


def test_norm_is_preserved_and_batched_positions():
    x = torch.randn(3, 10, 8, dtype=torch.float64)
    pos = torch.randint(0, 50, (3, 10, 2))  # a different grid placement per sample
    y = posenc.apply_axial_rope(x, pos, layout="half")
    assert (y.norm(dim=-1) - x.norm(dim=-1)).abs().max().item() < 1e-12
    for b in range(3):
        want = axial_rope_reference(x[b], pos[b], layout="half")
        assert (y[b] - want).abs().max().item() < 1e-12


@pytest.mark.parametrize("layout", ROPE_LAYOUTS)
def test_bf16_and_float32(layout):
    x = torch.randn(2, 30, 16)
    pos = posenc.grid_positions(5, 6) * 97
    exact = axial_rope_reference(x.double(), pos, layout=layout)
    y32 = posenc.apply_axial_rope(x, pos, layout=layout)
    assert y32.dtype == torch.float32 and (y32.double() - exact).abs().max().item() < 1e-5
    xb = x.to(torch.bfloat16)
    exact_b = axial_rope_reference(xb.double(), pos, layout=layout)
    yb = posenc.apply_axial_rope(xb, pos, layout=layout)
    floor = (exact_b.to(torch.bfloat16).double() - exact_b).abs().max().item()
    assert yb.dtype == torch.bfloat16 and (yb.double() - exact_b).abs().max().item() <= 2 * floor


def test_out_argument_in_place():
    x = torch.randn(12, 8, dtype=torch.float64)
    want = posenc.apply_axial_rope(x, posenc.grid_positions(3, 4))
    y = posenc.apply_axial_rope(x, posenc.grid_positions(3, 4), out=x)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y, want)


def test_gradient_is_the_inverse_rotation():
    x = torch.randn(6, 8, dtype=torch.float64, requires_grad=True)
    pos = posenc.grid_positions(2, 3)
    assert torch.autograd.gradcheck(lambda t: posenc.apply_axial_rope(t, pos), (x,))


@pytest.mark.parametrize(
    ("x_shape", "pos", "kwargs", "exc", "match"),
    [
        ((6, 6), posenc.grid_positions(2, 3), {}, ValueError, "multiple of 2 \\* num_axes = 4"),
        ((5, 8), posenc.grid_positions(2, 3), {}, ValueError, "seq=5"),
        ((6, 8), torch.arange(6), {}, ValueError, "positions must have shape"),
        ((2, 6, 8), torch.zeros(3, 6, 2, dtype=torch.int64), {}, ValueError, "broadcast"),
        ((6, 8), posenc.grid_positions(2, 3), {"layout": "concat"}, ValueError, "layout"),
        ((6, 8), posenc.grid_positions(2, 3).float(), {}, TypeError, "positions must hold"),
    ],
)
def test_apply_axial_rope_errors(x_shape, pos, kwargs, exc, match):
    with pytest.raises(exc, match=match):
        posenc.apply_axial_rope(torch.randn(x_shape), pos, **kwargs)


def test_apply_axial_rope_rejects_integer_x():
    with pytest.raises(TypeError, match="x must be a floating-point tensor"):
        posenc.apply_axial_rope(torch.zeros(6, 8, dtype=torch.int64), posenc.grid_positions(2, 3))


# ---------------------------------------------------------------- tracing and devices


def test_meta_tensors():
    pos = posenc.grid_positions(4, 5, device="meta")
    y = posenc.apply_axial_rope(torch.empty(2, 20, 16, device="meta"), pos)
    assert y.device.type == "meta" and y.shape == (2, 20, 16)
    t = posenc.sinusoidal_table_2d(4, 5, 16, device="meta")
    assert t.device.type == "meta" and t.shape == (4, 5, 16)
    e = posenc.axial_sinusoidal_encoding(pos, 16)
    assert e.device.type == "meta" and e.shape == (20, 16)


@pytest.mark.parametrize("layout", ROPE_LAYOUTS)
def test_torch_compile_fullgraph(layout):
    # aot_eager traces through dynamo and AOTAutograd without a C++ toolchain
    pos = posenc.grid_positions(3, 4)
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    rope = torch.compile(
        lambda t: posenc.apply_axial_rope(t, pos, layout=layout),
        backend="aot_eager",
        fullgraph=True,
    )
    assert (rope(x) - axial_rope_reference(x, pos, layout=layout)).abs().max().item() < 1e-12
    enc = torch.compile(
        lambda p: posenc.axial_sinusoidal_encoding(p, 8, dtype=torch.float64),
        backend="aot_eager",
        fullgraph=True,
    )
    assert (enc(pos) - axial_sinusoid_reference(pos, 8)).abs().max().item() < 1e-13


def test_vmap_over_batch():
    pos = posenc.grid_positions(3, 4)
    x = torch.randn(5, 12, 8, dtype=torch.float64)
    y = torch.vmap(lambda t: posenc.apply_axial_rope(t, pos, layout="half"))(x)
    assert (y - axial_rope_reference(x, pos, layout="half")).abs().max().item() < 1e-12
