"""Tests for posenc.sinusoidal: golden values, layouts, the linear-map property, the module."""

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import posenc


def golden(num_positions, dim, base=10000.0, layout="interleaved"):
    """The table written straight from the paper, one float64 entry at a time."""
    out = torch.empty(num_positions, dim, dtype=torch.float64)
    for p in range(num_positions):
        for i in range(dim // 2):
            w = base ** (-2.0 * i / dim)
            if layout == "interleaved":
                out[p, 2 * i], out[p, 2 * i + 1] = math.sin(p * w), math.cos(p * w)
            else:
                out[p, i], out[p, dim // 2 + i] = math.sin(p * w), math.cos(p * w)
    return out


def rotation_map(k, dim, base=10000.0):
    """M(k) for the interleaved layout: one 2x2 block per frequency acting on (sin, cos).

    sin((p+k)w) = sin(pw) cos(kw) + cos(pw) sin(kw)
    cos((p+k)w) = -sin(pw) sin(kw) + cos(pw) cos(kw)
    """
    m = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        w = base ** (-2.0 * i / dim)
        c, s = math.cos(k * w), math.sin(k * w)
        m[2 * i : 2 * i + 2, 2 * i : 2 * i + 2] = torch.tensor(
            [[c, s], [-s, c]], dtype=torch.float64
        )
    return m


@pytest.mark.parametrize("layout", ["interleaved", "half"])
@pytest.mark.parametrize("dim,base", [(2, 10000.0), (16, 10000.0), (10, 100.0)])
def test_golden_float64(layout, dim, base):
    table = posenc.sinusoidal_table(37, dim, base=base, layout=layout, dtype=torch.float64)
    err = (table - golden(37, dim, base, layout)).abs().max().item()
    assert err < 1e-13, err


@pytest.mark.parametrize("layout", ["interleaved", "half"])
def test_float32_error_bound_at_a_million(layout):
    n, dim = 10**6, 8
    table = posenc.sinusoidal_table(n, dim, layout=layout)
    assert table.dtype == torch.float32
    p = torch.arange(n, dtype=torch.float64)[:, None]
    w = torch.tensor([10000.0 ** (-2.0 * i / dim) for i in range(dim // 2)], dtype=torch.float64)
    sin, cos = (p * w).sin(), (p * w).cos()
    if layout == "interleaved":
        ref = torch.stack([sin, cos], dim=-1).reshape(n, dim)
    else:
        ref = torch.cat([sin, cos], dim=-1)
    err = (table.double() - ref).abs().max().item()
    assert err <= 2.5e-7, err
    # the usual float32 code really is far off here, so the test can tell the two apart
    naive = (p.float() * w.float()).sin()
    assert (naive.double() - sin).abs().max().item() > 1e-3


def test_layouts_are_a_column_permutation():
    dim = 12
    inter = posenc.sinusoidal_table(50, dim, dtype=torch.float64)
    half = posenc.sinusoidal_table(50, dim, layout="half", dtype=torch.float64)
    perm = [2 * i for i in range(dim // 2)] + [2 * i + 1 for i in range(dim // 2)]
    # the two layouts take different code paths, so allow a unit of float64 roundoff
    assert (inter[:, perm] - half).abs().max() < 1e-15


@pytest.mark.parametrize("k", [1, 5, 123, -7])
def test_linear_map_property(k):
    dim, n = 16, 300
    table = posenc.sinusoidal_table(n + 200, dim, dtype=torch.float64)
    m = rotation_map(k, dim)
    p = torch.arange(200, 200 + 50)
    # rows as column vectors: PE(p + k) = M(k) PE(p), the same M for every p
    err = (table[p + k] - table[p] @ m.T).abs().max().item()
    assert err < 1e-12, err
    # and M(k) is orthogonal: distances between positions depend only on the offset
    assert torch.allclose(m @ m.T, torch.eye(dim, dtype=torch.float64), atol=1e-14)


@pytest.mark.parametrize("k", [0, 1, 17, -3])
def test_shift_matrix_matches_explicit_rotations(k):
    m = posenc.sinusoidal_shift_matrix(k, 10, base=50.0)
    assert (m - rotation_map(k, 10, base=50.0)).abs().max() < 1e-15
    # half: the same map, with rows and columns permuted like the table's columns
    perm = [2 * i for i in range(5)] + [2 * i + 1 for i in range(5)]
    mc = posenc.sinusoidal_shift_matrix(k, 10, base=50.0, layout="half")
    assert (mc - m[perm][:, perm]).abs().max() < 1e-15
    table = posenc.sinusoidal_table(40, 10, base=50.0, layout="half", dtype=torch.float64)
    p = torch.arange(5, 20)
    assert (table[p + k] - table[p] @ mc.T).abs().max() < 1e-12


@given(
    n=st.integers(1, 300),
    half=st.integers(1, 24),
    base=st.floats(2.0, 1e5),
    layout=st.sampled_from(["interleaved", "half"]),
)
def test_properties(n, half, base, layout):
    dim = 2 * half
    t = posenc.sinusoidal_table(n, dim, base=base, layout=layout, dtype=torch.float64)
    assert t.shape == (n, dim)
    # each (sin, cos) pair lies on the unit circle, so every row has norm sqrt(dim/2)
    norms = t.norm(dim=-1)
    assert torch.allclose(norms, torch.full_like(norms, math.sqrt(half)), atol=1e-12)
    # row 0 is sin(0)=0, cos(0)=1
    first = golden(1, dim, base, layout)[0]
    assert torch.equal(t[0], first)
    # float32 agrees with float64 to the documented bound
    t32 = posenc.sinusoidal_table(n, dim, base=base, layout=layout)
    assert (t32.double() - t).abs().max().item() <= 2.5e-7


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_is_rounded_once(dtype):
    t32 = posenc.sinusoidal_table(2000, 32)
    t = posenc.sinusoidal_table(2000, 32, dtype=dtype)
    assert t.dtype == dtype
    # computed in float32 and rounded once: never worse than half a unit of `dtype`
    assert torch.equal(t, t32.to(dtype))
    exact = golden(2000, 32)
    ulp = torch.finfo(dtype).eps * exact.abs().clamp_min(2.0**-14)
    assert ((t.double() - exact).abs() <= 0.5 * ulp + 3e-7).all()


def test_empty_and_device():
    assert posenc.sinusoidal_table(0, 4).shape == (0, 4)
    assert posenc.sinusoidal_table(3, 4, device="cpu").device.type == "cpu"


@pytest.mark.parametrize(
    "kwargs,err,match",
    [
        (dict(num_positions=-1, dim=4), ValueError, "num_positions"),
        (dict(num_positions=4, dim=7), ValueError, "dim must be an even"),
        (dict(num_positions=4, dim=0), ValueError, "dim"),
        (dict(num_positions=4.0, dim=4), TypeError, "num_positions"),
        (dict(num_positions=4, dim=4, layout="neox"), ValueError, "layout must be one of"),
        (dict(num_positions=4, dim=4, layout="concat"), ValueError, "use layout='half'"),
        (dict(num_positions=4, dim=4, dtype=torch.int64), TypeError, "dtype must be a floating"),
        (dict(num_positions=4, dim=4, base=-1.0), ValueError, "base must be > 0"),
    ],
)
def test_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        posenc.sinusoidal_table(**kwargs)


def test_module_adds_table_and_has_no_parameters():
    emb = posenc.SinusoidalEmbedding(8)
    assert list(emb.parameters()) == [] and emb.state_dict() == {}
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    ref = golden(5, 8)
    assert torch.allclose(emb(x), x + ref, atol=1e-13)
    assert torch.allclose(emb(x, offset=4), x + golden(9, 8)[4:], atol=1e-13)
    pos = torch.tensor([[7, 0, 2, 2, 1]])
    assert torch.allclose(emb(x, positions=pos), x + golden(8, 8)[pos], atol=1e-13)
    scaled = posenc.SinusoidalEmbedding(8, scale=math.sqrt(8))
    assert torch.allclose(scaled(x), x * math.sqrt(8) + ref, atol=1e-13)


def test_module_regrows_past_any_length():
    emb = posenc.SinusoidalEmbedding(6, layout="half")
    emb(torch.zeros(4, 6))
    assert emb._cache.shape[0] == 4
    out = emb(torch.zeros(1000, 6, dtype=torch.float64))
    assert emb._cache.shape[0] >= 1000 and emb._cache.dtype == torch.float64
    assert torch.allclose(out, golden(1000, 6, layout="half"), atol=1e-12)


def test_module_cast_to_bf16_is_not_degraded():
    emb = posenc.SinusoidalEmbedding(16).to(torch.bfloat16)
    x = torch.randn(3000, 16).to(torch.bfloat16)
    out = emb(x)
    assert out.dtype == torch.bfloat16
    assert emb._cache.dtype == torch.float32  # rebuilt in float32 after the cast
    exact = x.double() + golden(3000, 16)
    # the sum is formed in float32 and rounded once to bf16: within half a bf16 unit
    half_ulp = 0.5 * torch.finfo(torch.bfloat16).eps * exact.abs()
    assert ((out.double() - exact).abs() <= half_ulp * 1.01 + 1e-6).all()
    # whereas a bf16 table at these positions is off by up to half a bf16 unit of 1
    degraded = golden(3000, 16).to(torch.bfloat16).double() - golden(3000, 16)
    assert degraded.abs().max() > 1e-3


def test_concat_is_refused_everywhere_with_a_pointer_to_half():
    with pytest.raises(
        ValueError, match="layout must be 'interleaved' or 'half'.*use layout='half'"
    ):
        posenc.SinusoidalEmbedding(8, layout="concat")
    with pytest.raises(ValueError, match="use layout='half'"):
        posenc.sinusoidal_shift_matrix(1, 8, layout="concat")


def test_module_encode_and_errors():
    emb = posenc.SinusoidalEmbedding(4)
    assert torch.allclose(emb.encode([3, 1]).double(), golden(4, 4)[[3, 1]], atol=1e-7)
    with pytest.raises(ValueError, match="positions must be >= 0"):
        emb.encode(torch.tensor([-1]))
    with pytest.raises(TypeError, match="positions must hold integers"):
        emb.encode(torch.tensor([1.5]))
    with pytest.raises(ValueError, match="last dimension dim=4"):
        emb(torch.zeros(3, 5))
    with pytest.raises(ValueError, match="dim must be an even"):
        posenc.SinusoidalEmbedding(5)
