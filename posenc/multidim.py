"""Positions on grids: axial 2-D (and N-D) sinusoidal tables and axial RoPE.

An image patch, a video frame cell or a table cell has one integer coordinate
per axis, e.g. ``(row, col)``.  The *axial* construction encodes each axis with
the ordinary 1-D scheme on its own share of the features and concatenates:

* sinusoidal (the 2-D sin-cos tables of MAE / MoCo v3 and of DETR): with ``n``
  axes and ``dim`` features, features ``[a * dim/n, (a + 1) * dim/n)`` hold the
  1-D sinusoidal code of coordinate ``a`` with ``dim/n`` features, frequencies
  ``base**(-2i/(dim/n))``,
  in the chosen 1-D layout (see :mod:`posenc.sinusoidal`).  For 2-D: the first
  half of the channels encodes the row, the second half the column.
* RoPE (axial RoPE of Heo et al., 2024): the ``dim/2`` rotary *pairs* are split
  into ``n`` equal groups; pair ``k = a * dim/(2n) + i`` is rotated by
  ``positions[..., a] * omega_i`` with ``omega_i = base**(-2i/(dim/n))``, the
  1-D RoPE frequencies of ``dim/n`` features.  Which features form pair ``k``
  is the RoPE layout (see :mod:`posenc.rope`): ``"interleaved"``, features
  ``(2k, 2k+1)``, so the row uses features ``[0, dim/2)`` and the column
  ``[dim/2, dim)`` in 2-D; ``"half"``, features ``(k, k + dim/2)``, so in 2-D the
  row uses ``[0, dim/4)`` with ``[dim/2, 3dim/4)`` and the column the rest.

Because every pair turns with one coordinate only, the score of a query at
``(r, c)`` and a key at ``(r', c')`` is a sum of 1-D RoPE scores and depends on
the positions only through ``(r' - r, c' - c)`` (key minus query).

Axis order is the order of the last dimension of ``positions``.
:func:`grid_positions` lists the cells of a grid in row-major order (the order
of ``x.flatten(2)`` on a ``(B, C, H, W)`` patch map) as ``(row, col)`` pairs.
Peer codes differ in the order and the origin:

* MAE / MoCo v3 ``get_2d_sincos_pos_embed`` puts the *column* first (its
  ``meshgrid(w, h)``) in the ``"half"`` sinusoidal layout: pass
  ``grid_positions(h, w).flip(-1)``.
* DETR's ``PositionEmbeddingSine`` (unnormalised) puts the row first in the
  interleaved layout, counting from 1: pass ``grid_positions(h, w) + 1``.
* RoPE-Axial of Heo et al. rotates by the column first, interleaved pairs,
  ``base=100``: pass ``grid_positions(h, w).flip(-1)`` and ``base=100.0``.

RoPE-Mixed (learned frequencies that mix the axes) is not implemented here.

Precision follows the 1-D modules: angles are formed in float64 (or by exact
angle addition for grids), never in the output precision.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from . import _angles, _memory
from ._checks import (
    MAX_POSITION,
    as_positions,
    beyond_limit,
    check_choice,
    check_float,
    check_float_dtype,
    check_int,
    check_length,
)
from ._rope_kernels import rotate as _rotate
from ._rope_kernels import rotate_functional as _rotate_functional
from ._runtime import has_values, in_transform, tracing
from ._types import Device
from .rope import _check_x, rope_frequencies
from .sinusoidal import LAYOUTS as SINUSOIDAL_LAYOUTS
from .sinusoidal import sinusoidal_inv_freq, sinusoidal_table

__all__ = [
    "grid_positions",
    "axial_sinusoidal_encoding",
    "sinusoidal_table_2d",
    "axial_rope_cos_sin",
    "apply_axial_rope",
]


def grid_positions(*sizes: int, device: Device = None) -> torch.Tensor:
    """Integer coordinates of every cell of a grid, in row-major order.

    ``grid_positions(h, w)`` is the ``(h * w, 2)`` int64 tensor of ``(row, col)``
    pairs ``(0, 0), (0, 1), ..., (0, w-1), (1, 0), ...``: row ``t`` is the cell
    of patch ``t`` when a ``(..., h, w)`` map is flattened.  Any number of axes
    works: ``grid_positions(t, h, w)`` gives ``(t * h * w, 3)``.

    Parameters
    ----------
    *sizes
        The size of each axis (non-negative integers).
    device
        Device of the result.

    Returns
    -------
    Tensor
        int64 ``(prod(sizes), len(sizes))``.

    Examples
    --------
    >>> import posenc
    >>> posenc.grid_positions(2, 3).tolist()
    [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]
    """
    if not sizes:
        raise ValueError("sizes must name at least one axis, e.g. grid_positions(h, w)")
    sizes = tuple(check_length(f"sizes[{a}]", s) for a, s in enumerate(sizes))
    axes = [torch.arange(s, device=device) for s in sizes]
    return torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1).reshape(-1, len(sizes))


def axial_sinusoidal_encoding(
    positions: torch.Tensor | Sequence[Sequence[int]],
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """Axial sinusoidal codes of grid positions: ``(*positions.shape[:-1], dim)``.

    Parameters
    ----------
    positions
        Integer coordinates ``(..., num_axes)``, at least 2-D (e.g. ``(seq, 2)``
        for ``(row, col)`` pairs); any integers strictly within ``2**31`` of 0,
        negative ones included.
    dim
        Number of features: a positive multiple of ``2 * num_axes``.
    base
        Wavelength scale of every axis, ``w_i = base**(-2i/(dim/num_axes))``.
    layout
        1-D layout inside each axis's block, as in :func:`posenc.sinusoidal_table`.
    dtype, device
        Output dtype (floating) and device (default: that of ``positions``).

    Returns
    -------
    Tensor ``(..., dim)``; features ``[a * dim/n, (a+1) * dim/n)`` are
    ``sinusoidal_table`` row ``positions[..., a]`` with ``dim/n`` features.
    """
    pos = _check_grid_positions("positions", positions, device)
    num_axes = pos.shape[-1]
    dim = _check_axial_dim(dim, num_axes)
    base = check_float("base", base, positive=True)
    layout = check_choice("layout", layout, SINUSOIDAL_LAYOUTS)
    dtype = check_float_dtype("dtype", dtype)
    sub = dim // num_axes
    omega = sinusoidal_inv_freq(sub, base=base, device=pos.device)
    cos, sin = _angles.cos_sin(pos, omega, dtype=_angles.compute_dtype(dtype))  # (..., n, sub/2)
    cos, sin = _poison_if_traced(pos, cos, sin)
    if layout == "interleaved":
        codes = torch.stack((sin, cos), dim=-1).flatten(-2)  # sin, cos per frequency
    else:
        codes = torch.cat((sin, cos), dim=-1)  # all sines, then all cosines
    return codes.flatten(-2).to(dtype)


def sinusoidal_table_2d(
    height: int,
    width: int,
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """The 2-D sin-cos table of image patches: ``(height, width, dim)``.

    ``table[r, c, :dim/2]`` is row ``r`` of ``sinusoidal_table(height, dim/2)``
    and ``table[r, c, dim/2:]`` is row ``c`` of ``sinusoidal_table(width, dim/2)``
    (same ``base`` and ``layout``): the first half of the channels encodes the
    row, the second half the column.  ``table.flatten(0, 1)`` lists the patches
    in row-major order and equals
    ``axial_sinusoidal_encoding(grid_positions(height, width), dim)``.

    Parameters
    ----------
    height, width
        Grid size (non-negative integers).
    dim
        Number of features: a positive multiple of 4.
    base, layout, dtype, device
        As in :func:`posenc.sinusoidal_table`.  For MAE's table (column first,
        ``"half"`` layout) use :func:`axial_sinusoidal_encoding` on
        ``grid_positions(height, width).flip(-1)``.

    Returns
    -------
    Tensor
        ``(height, width, dim)`` in ``dtype``.
    """
    height = check_length("height", height)
    width = check_length("width", width)
    dim = _check_axial_dim(dim, 2)
    dtype = check_float_dtype("dtype", dtype)
    work = _angles.compute_dtype(dtype)
    kw: dict[str, Any] = {"base": base, "layout": layout, "dtype": work, "device": device}
    rows = sinusoidal_table(height, dim // 2, **kw)  # exact angle addition, per axis
    cols = sinusoidal_table(width, dim // 2, **kw)
    table = _memory.empty(height, width, dim, dtype=work, device=rows.device)
    table[..., : dim // 2] = rows[:, None, :]
    table[..., dim // 2 :] = cols[None, :, :]
    return table if dtype == work else table.to(dtype)


def axial_rope_cos_sin(
    positions: torch.Tensor | Sequence[Sequence[int]],
    dim: int,
    *,
    base: float = 10000.0,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Axial RoPE tables ``cos`` and ``sin``, each ``(*positions.shape[:-1], dim // 2)``.

    Entry ``k = a * dim/(2n) + i`` is the cosine (sine) of
    ``positions[..., a] * omega_i`` with ``omega_i`` from
    ``rope_frequencies(dim // n, base=base)``; ``n = positions.shape[-1]``.
    These are the tables :func:`apply_axial_rope` rotates with, pair ``k``
    being features ``(2k, 2k+1)`` or ``(k, k + dim/2)`` by layout.

    Parameters
    ----------
    positions
        Integer coordinates ``(..., num_axes)``, at least 2-D, strictly within
        ``2**31`` of 0 (as for 1-D RoPE: beyond, the float64 angle errs by more
        than float32 roundoff).
    dim
        Number of rotated features: a positive multiple of ``2 * num_axes``.
    base
        Frequency base of every axis (Heo et al. use 100 for images).
    dtype, device
        Floating output dtype; device (default: that of ``positions``).

    Returns
    -------
    tuple of Tensor
        ``(cos, sin)``, each ``(*positions.shape[:-1], dim // 2)`` in ``dtype``.
    """
    pos = _check_grid_positions("positions", positions, device)
    num_axes = pos.shape[-1]
    dim = _check_axial_dim(dim, num_axes)
    base = check_float("base", base, positive=True)
    dtype = check_float_dtype("dtype", dtype)
    omega = rope_frequencies(dim // num_axes, base=base).to(pos.device)
    cos, sin = _angles.cos_sin(pos, omega, dtype=dtype)  # (..., n, dim / (2n))
    cos, sin = _poison_if_traced(pos, cos, sin)
    return cos.flatten(-2), sin.flatten(-2)


def apply_axial_rope(
    x: torch.Tensor,
    positions: torch.Tensor | Sequence[Sequence[int]],
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Rotate queries or keys by their grid coordinates: axial RoPE.

    Parameters
    ----------
    x
        Queries or keys ``(..., seq, dim)``, any floating dtype and device;
        ``dim`` a multiple of ``2 * num_axes``.
    positions
        Integer coordinates of each token, ``(seq, num_axes)`` or broadcastable
        ``(..., seq, num_axes)``, e.g. ``grid_positions(h, w)``.  There is no
        default: a sequence does not say which grid it was flattened from.
    base
        Frequency base of every axis.
    layout
        ``"interleaved"`` or ``"half"``: which features form rotary pair ``k``
        (see the module docstring for which pairs each axis turns).
    out
        Optional preallocated contiguous output like ``x`` (may be ``x``).

    Returns
    -------
    Tensor shaped and typed like ``x``.  With one axis this is
    :func:`posenc.apply_rope`.  The score ``<apply(q, p), apply(k, p')>``
    depends on ``p`` and ``p'`` only through ``p' - p`` (per axis).
    """
    x, dim = _check_x(x, layout, None)
    pos = _check_grid_positions("positions", positions, x.device)
    num_axes = pos.shape[-1]
    if dim % (2 * num_axes):
        raise ValueError(
            f"dim (the last dimension of x) must be a multiple of 2 * num_axes = "
            f"{2 * num_axes} (num_axes = positions.shape[-1]), got {dim}"
        )
    seq = x.shape[-2]
    if pos.dim() < 2 or pos.shape[-2] != seq:
        raise ValueError(
            f"positions must have shape (seq, num_axes) or (..., seq, num_axes) with "
            f"seq={seq} (x.shape[-2]), got {tuple(pos.shape)}"
        )
    try:
        ok = torch.broadcast_shapes(pos.shape[:-1], x.shape[:-1]) == x.shape[:-1]
    except RuntimeError:
        ok = False
    if not ok:
        raise ValueError(
            f"positions of shape {tuple(pos.shape)} must broadcast to "
            f"x.shape[:-1] + (num_axes,) = {tuple(x.shape[:-1])} + ({num_axes},)"
        )
    work = _angles.compute_dtype(x.dtype)
    cos, sin = axial_rope_cos_sin(pos, dim, base=base, dtype=work, device=x.device)
    if tracing() or in_transform(x):
        if out is not None:
            raise ValueError("out must be None under torch.compile, vmap or other transforms")
        return _rotate_functional(x, cos, sin, layout, dim)
    return _rotate(x, cos, sin, layout, dim, out)


# ---------------------------------------------------------------------- internals


def _check_grid_positions(
    name: str, positions: torch.Tensor | Sequence[Sequence[int]], device: Device
) -> torch.Tensor:
    if not isinstance(positions, torch.Tensor):  # nested lists of (row, col) pairs
        try:
            positions = torch.as_tensor(positions)
        except (TypeError, ValueError, RuntimeError) as e:
            if "Overflow" in str(e):  # a Python int beyond int64
                raise ValueError(
                    f"{name} must lie strictly within 2**31 = {MAX_POSITION} of 0, got a value "
                    "beyond int64"
                ) from None
            raise TypeError(
                f"{name} must be an integer tensor or nested sequences of ints, "
                f"got {type(positions).__name__}"
            ) from None
    pos = as_positions(name, positions, device=device)  # bounded by MAX_POSITION
    if pos.dim() < 2 or pos.shape[-1] < 1:
        raise ValueError(
            f"{name} must have shape (..., num_axes) with at least 2 dimensions, e.g. "
            f"(seq, 2) for (row, col) pairs; got {tuple(pos.shape)}"
        )
    return pos


def _poison_if_traced(
    pos: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """NaN where a coordinate is out of range but could not be checked (traced, meta)."""
    if not pos.numel() or has_values(pos):
        return cos, sin  # as_positions has checked the values
    bad = beyond_limit(pos)[..., None]  # (..., num_axes, 1)
    return cos.masked_fill(bad, float("nan")), sin.masked_fill(bad, float("nan"))


def _check_axial_dim(dim: int, num_axes: int) -> int:
    dim = check_int("dim", dim, minimum=1)
    if dim % (2 * num_axes):
        raise ValueError(
            f"dim must be a positive multiple of 2 * num_axes = {2 * num_axes} "
            f"(an even number of features per axis), got {dim}"
        )
    return dim
