"""The fixed sinusoidal table of Vaswani et al. (2017).

Row ``p`` of the table pairs a sine and a cosine at each of ``dim / 2``
frequencies ``w_i = base ** (-2 i / dim)``, i = 0 .. dim/2 - 1.  Two layouts of
the same numbers are in use:

* ``"interleaved"`` (the paper): ``[sin(p w_0), cos(p w_0), sin(p w_1), cos(p w_1), ...]``;
* ``"half"`` (tensor2tensor, fairseq, x-transformers): all sines, then all
  cosines, ``[sin(p w_0), ..., sin(p w_{d/2-1}), cos(p w_0), ..., cos(p w_{d/2-1})]``;
  feature ``i`` pairs with ``i + d/2``, the pairing :mod:`posenc.rope` calls
  ``"half"`` too.  (The name ``"concat"``, used here before, is refused with a
  pointer to ``"half"``.)

Angles are never formed in low precision: the table is built by
:mod:`posenc._angles`, which is accurate to a few float32 units of roundoff at
any position (the usual ``float32(p * w)`` code is off by ~0.07 at p = 10**6).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import _angles, _memory
from ._checks import (
    as_positions,
    beyond_limit,
    check_build_args,
    check_choice,
    check_even,
    check_float,
    check_float_dtype,
    check_floating,
    check_int,
    check_length,
    check_position_range,
)
from ._runtime import has_values
from ._types import Device, Positions

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "sinusoidal_inv_freq",
    "sinusoidal_table",
    "sinusoidal_shift_matrix",
    "SinusoidalEmbedding",
]

LAYOUTS = ("interleaved", "half")


def _check_layout(layout: str) -> str:
    if layout == "concat":
        raise ValueError(
            "layout must be 'interleaved' or 'half', got 'concat': the layout with sines in "
            "features 0 .. dim/2-1 and cosines in dim/2 .. dim-1 is called 'half' (as in RoPE); "
            "use layout='half'"
        )
    return check_choice("layout", layout, LAYOUTS)


def sinusoidal_inv_freq(dim: int, *, base: float = 10000.0, device: Device = None) -> torch.Tensor:
    """The angular frequencies ``w_i = base ** (-2 i / dim)``: float64, shape ``(dim/2,)``.

    Parameters
    ----------
    dim
        Feature size, a positive even integer.
    base
        Wavelength base (10000 in the paper).
    device
        Device of the result.

    Returns
    -------
    Tensor
        float64 ``(dim // 2,)``, from 1 down to ``base ** (-(dim - 2) / dim)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.sinusoidal_inv_freq(8).tolist()
    [1.0, 0.1, 0.01, 0.001]
    """
    dim = check_even("dim", dim)
    base = check_float("base", base, positive=True)
    exponent = torch.arange(0, dim, 2, device=device, dtype=torch.float64) / dim
    return base**-exponent


def sinusoidal_table(
    num_positions: int,
    dim: int,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """The sinusoidal position table of Vaswani et al. (2017), ``(num_positions, dim)``.

    Parameters
    ----------
    num_positions
        Number of rows (positions ``0 .. num_positions-1``); ``0`` gives an empty table.
    dim
        Number of features; a positive even integer.
    base
        The wavelength scale (10000 in the paper): ``w_i = base ** (-2 i / dim)``.
    layout
        ``"interleaved"``: columns ``2i, 2i+1`` hold ``sin(p w_i), cos(p w_i)``
        (the paper).  ``"half"``: column ``i`` holds ``sin(p w_i)`` and column
        ``i + dim/2`` holds ``cos(p w_i)`` (tensor2tensor, fairseq).
    dtype
        Floating-point output dtype.  float32 and float64 are computed in
        their own precision; bfloat16 and float16 are computed in float32 and
        rounded once.
    device
        Where the table is built.

    Returns
    -------
    Tensor ``(num_positions, dim)``.  In float32 every entry is within
    2.5e-7 of the exact value at every position (tested up to 10**6).
    """
    num_positions = check_length("num_positions", num_positions)
    dim = check_even("dim", dim)
    layout = _check_layout(layout)
    dtype = check_float_dtype("dtype", dtype)
    inv_freq = sinusoidal_inv_freq(dim, base=base, device=device)
    work = _angles.compute_dtype(dtype)
    table = _run(0, num_positions, inv_freq, layout, work, device)
    return table if dtype == work else table.to(dtype)


def _run(
    start: int,
    count: int,
    inv_freq: torch.Tensor,
    layout: str,
    dtype: torch.dtype,
    device: Device,
) -> torch.Tensor:
    """Rows ``start .. start+count-1`` of the table, ``(count, dim)`` in float32 or float64.

    Angle addition (:mod:`posenc._angles`) over the run alone: memory is the
    output plus ``O(sqrt(count) * dim)``, whatever ``start``.
    """
    half = inv_freq.shape[0]
    out = _memory.empty(count, 2 * half, dtype=dtype, device=device)
    if count:
        if layout == "interleaved":
            sin, cos = out[:, 0::2], out[:, 1::2]
        else:
            sin, cos = out[:, :half], out[:, half:]
        _angles.cos_sin_range_into(start, inv_freq, cos, sin)
    return out


def _rows_at(
    positions: torch.Tensor, inv_freq: torch.Tensor, layout: str, dtype: torch.dtype
) -> torch.Tensor:
    """Rows for arbitrary integer ``positions``: ``(*positions.shape, dim)``, angles in float64.

    Memory is proportional to ``positions.numel() * dim``, whatever the values.
    """
    cos, sin = _angles.cos_sin(positions, inv_freq.to(positions.device), dtype=dtype)
    if layout == "interleaved":
        return torch.stack((sin, cos), dim=-1).flatten(-2)
    return torch.cat((sin, cos), dim=-1)


def sinusoidal_shift_matrix(
    shift: int, dim: int, *, base: float = 10000.0, layout: str = "interleaved"
) -> torch.Tensor:
    """The matrix ``M(shift)`` with ``PE(p + shift) = M(shift) @ PE(p)`` for every ``p``, float64.

    Each frequency contributes one 2x2 block acting on its ``(sin, cos)`` pair,
    ``[[cos(k w), sin(k w)], [-sin(k w), cos(k w)]]`` with ``k = shift``: the
    angle-addition formulas.  In coordinates ordered ``(sin, cos)`` this is a
    rotation by ``-k w`` (clockwise when ``sin`` is drawn on the horizontal
    axis); read in the order ``(cos, sin)`` it is the usual counter-clockwise
    rotation by ``+k w``.  The matrix is orthogonal and independent of ``p``.

    Parameters
    ----------
    shift
        The offset ``k`` (any integer).
    dim
        Feature size, a positive even integer.
    base, layout
        As in :func:`sinusoidal_table`.

    Returns
    -------
    Tensor
        float64 ``(dim, dim)``, block diagonal for ``layout="interleaved"``;
        for ``"half"`` the same blocks with rows and columns ``(i, i + dim/2)``.

    Examples
    --------
    >>> import torch, posenc
    >>> table = posenc.sinusoidal_table(10, 8, dtype=torch.float64)
    >>> M = posenc.sinusoidal_shift_matrix(3, 8)
    >>> torch.allclose(table[2:7] @ M.T, table[5:10])   # PE(p + 3) = M(3) PE(p)
    True
    """
    shift = check_int("shift", shift)
    layout = _check_layout(layout)
    angle = shift * sinusoidal_inv_freq(dim, base=base)
    c, s = angle.cos(), angle.sin()
    half = dim // 2
    i = torch.arange(half)
    sin_idx, cos_idx = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
    m = torch.zeros(dim, dim, dtype=torch.float64)
    m[sin_idx, sin_idx], m[sin_idx, cos_idx] = c, s
    m[cos_idx, sin_idx], m[cos_idx, cos_idx] = -s, c
    return m


class SinusoidalEmbedding(nn.Module):
    """Adds the fixed sinusoidal table of Vaswani et al. (2017) to its input.

    ``x: (..., seq, dim)``; row ``offset + s`` of the table is added to
    ``x[..., s, :]``, or, with explicit ``positions`` (an integer tensor
    broadcastable to ``x.shape[:-1]``), row ``positions[..., s]``.  Positions
    are ``>= 0`` and below ``2**31`` (else ``ValueError``; traced calls, which
    cannot raise on values, give NaN rows there).  The module has no parameters:
    it keeps a non-persistent cache of the first rows of the table, which
    regrows (doubling) when a longer sequence arrives and is rebuilt when the
    device or the working precision changes.  Rows far past the cache are
    computed for the requested positions alone, so memory never depends on how
    large a position is: a lookup of ``n`` positions allocates ``O(n * dim)``;
    the cache grows only to cover positions below ``2 n`` (rounded up to a
    power of two).
    Rows computed either way are within float32 roundoff of the exact values
    (see :func:`sinusoidal_table`).

    Precision: the cache is always float32 (float64 for float64 inputs), even
    after ``module.to(torch.bfloat16)``; the sum ``x + table`` is formed in
    that precision and rounded once to ``x.dtype``.

    Parameters
    ----------
    dim
        Feature size, a positive even integer.
    base, layout
        As in :func:`sinusoidal_table`.
    scale
        Optional multiplier of ``x`` before the table is added (the paper
        multiplies token embeddings by ``sqrt(dim)``); ``1.0`` by default.

    Notes
    -----
    In :data:`posenc.SCHEMES` it is ``"sinusoidal"``, a scheme that acts on the
    input (``acts_on = "input"``): a model adds :meth:`encode` ``(positions)``
    to its token embeddings.

    Examples
    --------
    >>> import torch, posenc
    >>> pe = posenc.SinusoidalEmbedding(4)
    >>> pe.encode(torch.tensor([0, 1]), dtype=torch.float64).round(decimals=4).tolist()
    [[0.0, 1.0, 0.0, 1.0], [0.8415, 0.5403, 0.01, 1.0]]
    >>> tokens = torch.zeros(2, 3, 4)          # (batch, seq, dim) token embeddings
    >>> out = pe(tokens)                        # rows 0, 1, 2 of the table added
    >>> out.shape, torch.equal(out[1, 2], pe.encode(torch.tensor(2)))
    (torch.Size([2, 3, 4]), True)
    """

    # registry metadata (posenc.SCHEMES): a table added to the input embeddings
    acts_on = "input"
    quadratic_memory = False
    reference = "vaswani2017attention"
    shared_across_layers = False

    _cache: torch.Tensor  # a buffer (not saved): the table's first rows, grown by doubling

    @classmethod
    def build(
        cls,
        num_heads: int,
        head_dim: int,
        *,
        max_len: int | None = None,
        causal: bool = True,
        **options: Any,
    ) -> Self:
        """The table for model width ``num_heads * head_dim`` (the registry's constructor)."""
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        return cls(num_heads * head_dim, **options)

    def __init__(
        self, dim: int, *, base: float = 10000.0, layout: str = "interleaved", scale: float = 1.0
    ) -> None:
        super().__init__()
        self.dim = check_even("dim", dim)
        self.base = check_float("base", base, positive=True)
        self.layout = _check_layout(layout)
        self.scale = check_float("scale", scale)
        self.register_buffer("_cache", torch.empty(0, self.dim), persistent=False)

    def table(
        self, num_positions: int, *, device: Device = None, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """Rows ``0 .. num_positions-1`` of the table ``(num_positions, dim)``, from the cache.

        ``dtype`` float32 or float64 selects the cache precision; other float
        dtypes are read from the float32 cache and rounded once.
        """
        num_positions = check_length("num_positions", num_positions)
        dtype = check_float_dtype("dtype", dtype)
        work = _angles.compute_dtype(dtype)
        device = torch.device(device) if device is not None else self._cache.device
        cache = self._cache
        if cache.dtype != work or cache.device != device or cache.shape[0] < num_positions:
            size = max(num_positions, 1)
            size = 1 << (size - 1).bit_length()  # grow by doubling: O(log n) rebuilds
            cache = sinusoidal_table(
                size, self.dim, base=self.base, layout=self.layout, dtype=work, device=device
            )
            self._cache = cache
        return cache[:num_positions].to(dtype)

    def encode(self, positions: Positions, *, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Table rows for integer ``positions`` (any shape): ``(*positions.shape, dim)``.

        Positions must be ``>= 0`` and below ``2**31``.
        """
        device = positions.device if isinstance(positions, torch.Tensor) else self._cache.device
        positions = as_positions("positions", positions, device=device)
        dtype = check_float_dtype("dtype", dtype)
        work = _angles.compute_dtype(dtype)
        if positions.numel() == 0:
            return torch.empty(*positions.shape, self.dim, device=device, dtype=dtype)
        if not has_values(positions):  # traced: no host reads, no cache; poison what is refused
            rows = _rows_at(positions, self._inv_freq(device), self.layout, work)
            bad = (positions < 0) | beyond_limit(positions)
            return rows.masked_fill(bad[..., None], float("nan")).to(dtype)
        lo, hi = torch.stack(torch.aminmax(positions)).tolist()
        if lo < 0:
            raise ValueError(f"positions must be >= 0, got min {lo}")
        if self._cached(hi + 1, device, work) or hi < 2 * positions.shape[-1]:
            rows = self.table(hi + 1, device=device, dtype=work)[positions]
        else:  # far past the cache: only the rows asked for
            rows = _rows_at(positions, self._inv_freq(device), self.layout, work)
        return rows.to(dtype)

    def forward(
        self, x: torch.Tensor, *, offset: int = 0, positions: Positions | None = None
    ) -> torch.Tensor:
        """Return ``scale * x + PE`` with the shape and dtype of ``x: (..., seq, dim)``."""
        x = check_floating("x", x, min_dim=2)
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim={self.dim}, got {x.shape[-1]}")
        work = _angles.compute_dtype(x.dtype)
        if positions is None:
            offset = check_int("offset", offset, minimum=0)
            seq = x.shape[-2]
            check_position_range("positions offset .. offset + seq - 1", offset, offset + seq - 1)
            pe = self._run(offset, seq, x.device, work)
        else:
            pe = self.encode(as_positions("positions", positions, device=x.device), dtype=work)
        out = x.to(work) * self.scale + pe if self.scale != 1.0 else x.to(work) + pe
        return out.to(x.dtype)

    def _run(
        self, start: int, count: int, device: torch.device, dtype: torch.dtype
    ) -> torch.Tensor:
        """Rows ``start .. start+count-1``: from the cache, or computed for the run alone."""
        if self._cached(start + count, device, dtype) or start <= count:
            return self.table(start + count, device=device, dtype=dtype)[start:]
        return _run(start, count, self._inv_freq(device), self.layout, dtype, device)

    def _cached(self, num_positions: int, device: torch.device, dtype: torch.dtype) -> bool:
        c = self._cache
        return c.device == torch.device(device) and c.dtype == dtype and c.shape[0] >= num_positions

    def _inv_freq(self, device: torch.device) -> torch.Tensor:
        return sinusoidal_inv_freq(self.dim, base=self.base, device=device)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, layout={self.layout!r}, scale={self.scale}"
