"""Tests for posenc._angles: the angle-addition cos/sin tables against float64."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from posenc import _angles


def inv_freq(h, base=10000.0):
    return base ** -(torch.arange(h, dtype=torch.float64) * 2 / (2 * h))


def reference(start, n, w):
    ang = torch.arange(start, start + n, dtype=torch.float64)[:, None] * w
    return ang.cos(), ang.sin()


def test_error_bound_at_a_million():
    w = inv_freq(4)
    n = 10**6
    cos = torch.empty(n, 4)
    sin = torch.empty(n, 4)
    _angles.cos_sin_range_into(0, w, cos, sin)
    rc, rs = reference(0, n, w)
    err = max((cos.double() - rc).abs().max().item(), (sin.double() - rs).abs().max().item())
    assert err <= 2.4e-7, err


@pytest.mark.parametrize(
    "cols",  # (cos columns, sin columns) of a 12-column table
    [
        (slice(1, 11, 2), slice(0, 10, 2)),  # (sin, cos) pairs: the complex fast path
        (slice(0, 10, 2), slice(1, 11, 2)),  # (cos, sin) pairs: the complex fast path
        (slice(5, 10), slice(0, 5)),  # two halves
        (slice(2, 12, 2), slice(1, 11, 2)),  # pairs at an odd offset: the general path
    ],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_outputs_are_written_in_place(cols, dtype):
    w = inv_freq(5)
    table = torch.full((2000, 12), float("nan"), dtype=dtype)
    _angles.cos_sin_range_into(3, w, table[:, cols[0]], table[:, cols[1]])
    rc, rs = reference(3, 2000, w)
    tol = 2.4e-7 if dtype == torch.float32 else 1e-13
    assert (table[:, cols[0]].double() - rc).abs().max() < tol
    assert (table[:, cols[1]].double() - rs).abs().max() < tol
    written = torch.zeros(12, dtype=torch.bool)
    written[cols[0]] = written[cols[1]] = True
    assert table[:, ~written].isnan().all()  # nothing else was touched


@pytest.mark.parametrize("n", [1, 2, 3, 7, 10, 11, 99, 101, 1000])
def test_tails_every_row_written(n):
    # sizes that are not a multiple of the block leave a tail of rows
    w = inv_freq(3)
    cos = torch.full((n, 3), float("nan"), dtype=torch.float64)
    sin = torch.full((n, 3), float("nan"), dtype=torch.float64)
    _angles.cos_sin_range_into(11, w, cos, sin)
    rc, rs = reference(11, n, w)
    assert (cos - rc).abs().max() < 1e-14 and (sin - rs).abs().max() < 1e-14


def test_float64_dtype_is_float64_accurate():
    cos, sin = _angles.cos_sin(None, inv_freq(8), num_positions=5000, dtype=torch.float64)
    assert cos.dtype == sin.dtype == torch.float64
    rc, rs = reference(0, 5000, inv_freq(8))
    # the float64 reference itself rounds p * w, ~5000 * 1e-16
    assert (cos - rc).abs().max() < 1e-12 and (sin - rs).abs().max() < 1e-12


def test_negative_start():
    cos, sin = _angles.cos_sin(None, inv_freq(4), num_positions=500, start=-250)
    rc, rs = reference(-250, 500, inv_freq(4))
    assert (cos.double() - rc).abs().max() < 2.4e-7
    assert (sin.double() - rs).abs().max() < 2.4e-7


@given(st.lists(st.integers(-(10**6), 10**6), min_size=1, max_size=30))
def test_arbitrary_positions(positions):
    w = inv_freq(6)
    p = torch.tensor(positions).view(-1, 1)
    cos, sin = _angles.cos_sin(p, w, dtype=torch.float32)
    assert cos.shape == (len(positions), 1, 6)
    ang = p.double()[..., None] * w
    assert (cos.double() - ang.cos()).abs().max() <= 6e-8  # one float32 rounding
    assert (sin.double() - ang.sin()).abs().max() <= 6e-8


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rounded_once_from_float32(dtype):
    cos, sin = _angles.cos_sin(None, inv_freq(4), num_positions=3000, dtype=dtype)
    c32, s32 = _angles.cos_sin(None, inv_freq(4), num_positions=3000, dtype=torch.float32)
    assert cos.dtype == dtype
    assert torch.equal(cos, c32.to(dtype)) and torch.equal(sin, s32.to(dtype))
    assert _angles.compute_dtype(dtype) == torch.float32
