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

import torch
from torch import nn

from . import _angles, _memory
from ._checks import (
    as_positions,
    check_choice,
    check_even,
    check_float,
    check_float_dtype,
    check_floating,
    check_int,
)

__all__ = [
    "sinusoidal_inv_freq",
    "sinusoidal_table",
    "sinusoidal_shift_matrix",
    "SinusoidalEmbedding",
]

LAYOUTS = ("interleaved", "half")


def _check_layout(layout) -> str:
    if layout == "concat":
        raise ValueError(
            "layout must be 'interleaved' or 'half', got 'concat': the layout with sines in "
            "features 0 .. dim/2-1 and cosines in dim/2 .. dim-1 is called 'half' (as in RoPE); "
            "use layout='half'"
        )
    return check_choice("layout", layout, LAYOUTS)


def sinusoidal_inv_freq(dim: int, *, base: float = 10000.0, device=None) -> torch.Tensor:
    """The angular frequencies ``w_i = base ** (-2 i / dim)``: float64, shape ``(dim/2,)``."""
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
    device=None,
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
    num_positions = check_int("num_positions", num_positions, minimum=0)
    dim = check_even("dim", dim)
    layout = _check_layout(layout)
    dtype = check_float_dtype("dtype", dtype)
    inv_freq = sinusoidal_inv_freq(dim, base=base, device=device)
    work = _angles.compute_dtype(dtype)
    table = _memory.empty(num_positions, dim, dtype=work, device=device)
    if num_positions:
        half = dim // 2
        if layout == "interleaved":
            sin, cos = table[:, 0::2], table[:, 1::2]
        else:
            sin, cos = table[:, :half], table[:, half:]
        _angles.cos_sin_range_into(0, inv_freq, cos, sin)
    return table if dtype == work else table.to(dtype)


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

    Returns
    -------
    Tensor ``(dim, dim)``, block diagonal for ``layout="interleaved"``; for
    ``"half"`` the same blocks with rows and columns ``(i, i + dim/2)``.
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
    broadcastable to ``x.shape[:-1]``), row ``positions[..., s]``.  The module
    has no parameters and no length limit: it keeps a non-persistent cache of
    the table that regrows (doubling) when a longer sequence arrives and is
    rebuilt when the device or the working precision changes.

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

    In :data:`posenc.SCHEMES` it is ``"sinusoidal"``, a scheme that acts on the
    input (``acts_on = "input"``): a model adds :meth:`encode` ``(positions)``
    to its token embeddings.
    """

    # registry metadata (posenc.SCHEMES): a table added to the input embeddings
    acts_on = "input"
    quadratic_memory = False
    reference = "vaswani2017attention"
    shared_across_layers = False

    @classmethod
    def build(cls, num_heads: int, head_dim: int, *, max_len=None, causal=True, **options):
        """The table for model width ``num_heads * head_dim`` (the registry's constructor)."""
        return cls(num_heads * head_dim, **options)

    def __init__(
        self, dim: int, *, base: float = 10000.0, layout: str = "interleaved", scale: float = 1.0
    ):
        super().__init__()
        self.dim = check_even("dim", dim)
        self.base = check_float("base", base, positive=True)
        self.layout = _check_layout(layout)
        self.scale = check_float("scale", scale)
        self.register_buffer("_cache", torch.empty(0, self.dim), persistent=False)

    def table(self, num_positions: int, *, device=None, dtype=torch.float32) -> torch.Tensor:
        """Rows ``0 .. num_positions-1`` of the table ``(num_positions, dim)``, from the cache.

        ``dtype`` float32 or float64 selects the cache precision; other float
        dtypes are read from the float32 cache and rounded once.
        """
        num_positions = check_int("num_positions", num_positions, minimum=0)
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

    def encode(self, positions, *, dtype=torch.float32) -> torch.Tensor:
        """Table rows for integer ``positions`` (any shape): ``(*positions.shape, dim)``."""
        device = positions.device if isinstance(positions, torch.Tensor) else self._cache.device
        positions = as_positions("positions", positions, device=device)
        if positions.numel() and int(positions.min()) < 0:
            raise ValueError(f"positions must be >= 0, got min {int(positions.min())}")
        needed = int(positions.max()) + 1 if positions.numel() else 0
        return self.table(needed, device=device, dtype=dtype)[positions]

    def forward(self, x: torch.Tensor, *, offset: int = 0, positions=None) -> torch.Tensor:
        """Return ``scale * x + PE`` with the shape and dtype of ``x: (..., seq, dim)``."""
        x = check_floating("x", x, min_dim=2)
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim={self.dim}, got {x.shape[-1]}")
        work = _angles.compute_dtype(x.dtype)
        if positions is None:
            offset = check_int("offset", offset, minimum=0)
            pe = self.table(offset + x.shape[-2], device=x.device, dtype=work)[offset:]
        else:
            pe = self.encode(as_positions("positions", positions, device=x.device), dtype=work)
        out = x.to(work) * self.scale + pe if self.scale != 1.0 else x.to(work) + pe
        return out.to(x.dtype)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, base={self.base}, layout={self.layout!r}, scale={self.scale}"
