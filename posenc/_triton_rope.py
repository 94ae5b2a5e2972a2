"""Triton kernel for :func:`posenc.apply_rope` on CUDA tensors.

One program rotates a block of rows: it loads each feature pair once, rotates
it in float32 (float64 for float64 inputs) with precomputed cos/sin tables and
stores the result once, so the cost is one read and one write of ``x``.  The
tables come from :func:`posenc.rope_cos_sin`, so angles are never formed in
low precision here either.

Triton is imported lazily: ``import posenc`` never needs it, and
:func:`available` is false on machines without it (the caller then uses the
PyTorch path).  The kernel is built on first use, which is also when Triton
reads ``TRITON_INTERPRET``; the tests run it on the CPU under the interpreter.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

__all__: list[str] = []  # private module


@functools.cache
def available() -> bool:
    """Whether Triton can be imported."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


@functools.cache
def _kernel() -> Any:  # a triton.JITFunction; Triton ships no type information
    import triton
    import triton.language as tl

    # Triton reads a kernel's annotations (tl.constexpr marks compile-time constants, a
    # type would change how an argument is specialised), so the others stay unannotated.
    @triton.jit  # type: ignore[untyped-decorator]
    def rope_kernel(  # type: ignore[no-untyped-def]
        x_ptr,
        out_ptr,
        cos_ptr,
        sin_ptr,
        n_rows,
        seq,
        group_rows,
        n_tables,
        x_row_stride,
        out_row_stride,
        h,
        INTERLEAVED: tl.constexpr,
        ROUND_BF16: tl.constexpr,
        ROWS: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)[:, None]
        j = tl.arange(0, BLOCK_H)[None, :]
        mask = (rows < n_rows) & (j < h)
        # pair j: features (2j, 2j+1) interleaved, (j, j+h) half
        if INTERLEAVED:
            ia = 2 * j
            ib = 2 * j + 1
        else:
            ia = j
            ib = j + h
        # row r of x is position r % seq of flattened batch entry r // seq, which
        # uses table (r // group_rows) % n_tables: shared tables are not copied per head
        r64 = rows.to(tl.int64)
        t = (((r64 // group_rows) % n_tables) * seq + r64 % seq) * h + j
        c = tl.load(cos_ptr + t, mask=mask, other=0.0)
        s = tl.load(sin_ptr + t, mask=mask, other=0.0)
        xr = x_ptr + rows.to(tl.int64) * x_row_stride
        a = tl.load(xr + ia, mask=mask, other=0.0).to(c.dtype)
        b = tl.load(xr + ib, mask=mask, other=0.0).to(c.dtype)
        ya = a * c - b * s
        yb = a * s + b * c
        if ROUND_BF16:
            # Round to the nearest bfloat16 (ties to even) by hand: the
            # interpreter's float32 -> bfloat16 cast truncates, which would
            # double the error; after this, the cast is exact on any backend.
            ba = ya.to(tl.uint32, bitcast=True)
            bb = yb.to(tl.uint32, bitcast=True)
            ba = (ba + 0x7FFF + ((ba >> 16) & 1)) & 0xFFFF0000
            bb = (bb + 0x7FFF + ((bb >> 16) & 1)) & 0xFFFF0000
            ya = ba.to(tl.float32, bitcast=True)
            yb = bb.to(tl.float32, bitcast=True)
        orow = out_ptr + rows.to(tl.int64) * out_row_stride
        out_ty = out_ptr.dtype.element_ty
        tl.store(orow + ia, ya.to(out_ty), mask=mask)
        tl.store(orow + ib, yb.to(out_ty), mask=mask)

    return rope_kernel


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    group: int,
    layout: str,
    r: int,
    out: torch.Tensor,
) -> torch.Tensor:
    """Rotate the first ``r`` features of ``x`` into ``out`` (contiguous, like ``x``).

    ``cos``/``sin`` are float32/float64 tables ``(tb, seq, r // 2)``: flattened
    batch entry ``n`` of ``x.reshape(-1, seq, dim)`` uses table ``n // group``
    (``posenc._rope_kernels.table_batches`` builds them without copying shared
    tables per head).  Features ``r:`` must already be in ``out``.
    """
    import triton

    seq, dim, h = x.shape[-2], x.shape[-1], r // 2
    x2 = x.reshape(-1, dim)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    out2 = out.view(-1, dim)
    n_rows = x2.shape[0]
    cos, sin = cos.contiguous(), sin.contiguous()
    block_h = triton.next_power_of_2(h)
    rows = max(1, min(64, 4096 // block_h))
    grid = (triton.cdiv(n_rows, rows),)
    _kernel()[grid](
        x2,
        out2,
        cos,
        sin,
        n_rows,
        seq,
        group * seq,
        cos.shape[0],
        x2.stride(0),
        out2.stride(0),
        h,
        INTERLEAVED=layout == "interleaved",
        ROUND_BF16=x.dtype == torch.bfloat16,
        ROWS=rows,
        BLOCK_H=block_h,
    )
    return out
