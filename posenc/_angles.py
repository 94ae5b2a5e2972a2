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
    device = out_cos.device
    dtype = out_cos.dtype
    inv_freq = inv_freq.to(device=device, dtype=torch.float64)
    block = max(1, math.isqrt(max(n - 1, 0)) + 1)
    n_hi = n // block
    lo = torch.arange(block, device=device, dtype=torch.float64)[:, None] * inv_freq
    cos_lo, sin_lo = lo.cos().to(dtype), lo.sin().to(dtype)
    if n_hi:
        hi = start + block * torch.arange(n_hi, device=device, dtype=torch.float64)
        hi = hi[:, None, None] * inv_freq  # (n_hi, 1, h)
        cos_hi, sin_hi = hi.cos().to(dtype), hi.sin().to(dtype)
        rows = n_hi * block
        pairs = _as_pairs(out_cos[:rows], out_sin[:rows])
        if pairs is not None:
            _combine_complex(pairs, cos_hi, sin_hi, cos_lo, sin_lo, n_hi, block)
        else:
            o_cos = out_cos[:rows].view(n_hi, block, h)
            o_sin = out_sin[:rows].view(n_hi, block, h)
            # groups of hi rows whose output stays in cache across the four passes
            step = max(1, _CHUNK_BYTES // (2 * block * h * out_cos.element_size()))
            for g in range(0, n_hi, step):
                sh, ch, sc = sin_hi[g : g + step], cos_hi[g : g + step], o_sin[g : g + step]
                torch.mul(sh, cos_lo, out=sc).addcmul_(ch, sin_lo)
                oc = o_cos[g : g + step]
                torch.mul(ch, cos_lo, out=oc).addcmul_(sh, sin_lo, value=-1.0)
    tail = n - n_hi * block
    if tail:  # fewer than `block` rows: evaluate directly in float64
        p = start + n_hi * block + torch.arange(tail, device=device, dtype=torch.float64)
        ang = p[:, None] * inv_freq
        out_cos[n_hi * block :].copy_(ang.cos())
        out_sin[n_hi * block :].copy_(ang.sin())


# Output bytes processed per group on the two-pass path: well inside a per-core L2.
_CHUNK_BYTES = 1 << 19


def _as_pairs(out_cos: torch.Tensor, out_sin: torch.Tensor):
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


def _combine_complex(pairs, cos_hi, sin_hi, cos_lo, sin_lo, n_hi, block):
    """(cos a + i sin a)(cos b + i sin b) = cos(a+b) + i sin(a+b).

    With sin stored first the pair reads sin(a+b) + i cos(a+b), which is
    (sin a + i cos a)(cos b - i sin b).
    """
    out, sin_first = pairs
    h = out.shape[1]
    if sin_first:
        a, b = torch.complex(sin_hi, cos_hi), torch.complex(cos_lo, -sin_lo)
    else:
        a, b = torch.complex(cos_hi, sin_hi), torch.complex(cos_lo, sin_lo)
    torch.mul(a, b, out=out.view(n_hi, block, h))


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
