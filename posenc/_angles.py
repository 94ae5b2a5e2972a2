"""Accurate cos(p * w) and sin(p * w) tables, shared by the sinusoidal table and RoPE.

The usual code computes ``p * w`` in float32.  At p = 10**6 the product's
rounding error alone is ~0.06 rad, so every downstream value is wrong in the
second decimal.  Computing everything in float64 is accurate but costs a
float64 ``sin`` and ``cos`` per entry.

We use angle addition instead.  Write p = start + hi * B + lo with 0 <= lo < B
and B ~ sqrt(n).  Then

    sin(p w) = sin(a) cos(b) + cos(a) sin(b),    a = (start + hi B) w,  b = lo w
    cos(p w) = cos(a) cos(b) - sin(a) sin(b)

The two small tables over ``hi`` and ``lo`` (about 2 sqrt(n) rows) are
evaluated in float64 and rounded once; the n-row result costs two multiplies
and an add per entry in the output precision.  In float32 the error is at most
4 units of roundoff (2 from rounding the table entries, 1 from the products, 1
from the sum), i.e. <= 2.4e-7, at any position.

When the two outputs interleave as adjacent pairs of one table (the
sinusoidal "interleaved" layout, RoPE's interleaved cos/sin), the combination
is done as one complex product, (cos a + i sin a)(cos b + i sin b), which
writes each entry once with the same operation count per entry.  Otherwise
four passes run over groups of rows small enough to stay in cache.
"""

from __future__ import annotations

import math

import torch

__all__: list[str] = []  # private module

_EXACT_DTYPES = (torch.float32, torch.float64)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision in which tables for ``dtype`` are combined: float32 at least."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def cos_sin_range_into(
    start: int,
    inv_freq: torch.Tensor,
    out_cos: torch.Tensor,
    out_sin: torch.Tensor,
) -> None:
    """Fill ``out_cos``/``out_sin`` (n, h) with cos/sin((start + r) * inv_freq[j]).

    ``inv_freq`` is a float64 tensor (h,).  The outputs may be strided views
    (e.g. the even and odd columns of one table) and must be float32 or
    float64; they are written in place, with no (n, h) temporaries.
    """
    n, h = out_cos.shape
    if n == 0:
        return
    device, dtype = out_cos.device, out_cos.dtype
    inv_freq = inv_freq.to(device=device, dtype=torch.float64)
    # row r = hi * block + lo; the last hi row may be partial
    block = math.isqrt(n - 1) + 1
    n_hi = -(-n // block)
    offsets = torch.arange(block + n_hi, device=device, dtype=torch.float64)
    offsets[block:] = start + block * offsets[:n_hi]
    ang = offsets[:, None] * inv_freq  # lo angles, then hi angles: one trig call each
    cos_t, sin_t = ang.cos().to(dtype), ang.sin().to(dtype)
    cos_lo, sin_lo = cos_t[:block], sin_t[:block]
    cos_hi, sin_hi = cos_t[block:, None], sin_t[block:, None]  # (n_hi, 1, h)
    pairs = _as_pairs(out_cos, out_sin)
    if pairs is not None:
        _combine_complex(pairs, cos_hi, sin_hi, cos_lo, sin_lo, block)
        return
    # two separate outputs: four passes over groups of rows that stay in cache
    step = max(1, _CHUNK_BYTES // (2 * block * h * out_cos.element_size()))
    full, tail = divmod(n, block)
    groups = [(g, min(g + step, full)) for g in range(0, full, step)]
    if tail:
        groups.append((full, full + 1))
    for g0, g1 in groups:
        rows = slice(g0 * block, min(g1 * block, n))
        m = min(block, n - g0 * block)  # rows per block: `block`, or `tail` for the last
        o_sin = out_sin[rows].unflatten(0, (g1 - g0, m))
        o_cos = out_cos[rows].unflatten(0, (g1 - g0, m))
        sh, ch = sin_hi[g0:g1], cos_hi[g0:g1]
        torch.mul(sh, cos_lo[:m], out=o_sin).addcmul_(ch, sin_lo[:m])
        torch.mul(ch, cos_lo[:m], out=o_cos).addcmul_(sh, sin_lo[:m], value=-1.0)


# Output bytes processed per group on the two-pass path: well inside a per-core L2.
_CHUNK_BYTES = 1 << 19


def _as_pairs(out_cos: torch.Tensor, out_sin: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """If cos and sin interleave as adjacent pairs of one tensor, return ``(pairs, sin_first)``.

    ``pairs`` is a complex view ``(n, h)`` of those pairs, so that one complex
    multiply fills both outputs in a single pass (the angle-addition formulas
    are a complex product).  Otherwise return ``None``.
    """
    size = out_cos.element_size()
    if (
        out_cos.dim() != 2
        or out_cos.stride() != out_sin.stride()
        or out_cos.stride(1) != 2
        or out_cos.untyped_storage().data_ptr() != out_sin.untyped_storage().data_ptr()
        or abs(out_cos.data_ptr() - out_sin.data_ptr()) != size
    ):
        return None
    sin_first = out_sin.data_ptr() < out_cos.data_ptr()
    first = out_sin if sin_first else out_cos
    n, h = first.shape
    if first.storage_offset() % 2 or first.stride(0) % 2:
        return None
    pairs = first.as_strided((n, h, 2), (first.stride(0), 2, 1))
    return torch.view_as_complex(pairs), sin_first


def _combine_complex(
    pairs: tuple[torch.Tensor, bool],
    cos_hi: torch.Tensor,
    sin_hi: torch.Tensor,
    cos_lo: torch.Tensor,
    sin_lo: torch.Tensor,
    block: int,
) -> None:
    """(cos a + i sin a)(cos b + i sin b) = cos(a+b) + i sin(a+b), block by block.

    With sin stored first the pair reads sin(a+b) + i cos(a+b), which is
    (sin a + i cos a)(cos b - i sin b).
    """
    out, sin_first = pairs
    n, h = out.shape
    if sin_first:
        a, b = torch.complex(sin_hi, cos_hi), torch.complex(cos_lo, -sin_lo)
    else:
        a, b = torch.complex(cos_hi, sin_hi), torch.complex(cos_lo, sin_lo)
    full, tail = divmod(n, block)
    if full:
        torch.mul(a[:full], b, out=out[: full * block].view(full, block, h))
    if tail:
        torch.mul(a[full, 0], b[:tail], out=out[full * block :])


def cos_sin(
    positions: torch.Tensor | None,
    inv_freq: torch.Tensor,
    *,
    num_positions: int | None = None,
    start: int = 0,
    dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of ``positions[..., None] * inv_freq``, each ``(*positions.shape, h)``.

    With ``positions=None`` the positions are ``start .. start+num_positions-1``
    and the fast angle-addition path is used.  Arbitrary integer positions are
    evaluated directly in float64.  The result is cast to ``dtype`` once, at
    the end, so bf16/fp16 outputs are correctly rounded from float32 or better.
    """
    device = inv_freq.device
    work = compute_dtype(dtype)
    if positions is None:
        assert num_positions is not None, "num_positions is required without positions"
        h = inv_freq.shape[-1]
        cos = torch.empty(num_positions, h, device=device, dtype=work)
        sin = torch.empty(num_positions, h, device=device, dtype=work)
        cos_sin_range_into(start, inv_freq, cos, sin)
    else:
        ang = positions.to(device=device, dtype=torch.float64)[..., None] * inv_freq.double()
        cos, sin = ang.cos().to(work), ang.sin().to(work)
    if dtype != work:
        cos, sin = cos.to(dtype), sin.to(dtype)
    return cos, sin
