"""The RoPE rotation kernels: one rotation, several ways to run it.

Every path rotates the first ``r`` features of ``x`` ``(..., seq, dim)`` by
tables ``cos``, ``sin`` ``(..., seq, r // 2)`` (float32, float64 for float64
inputs) that broadcast against ``x.shape[:-1] + (r // 2,)``; pair ``(a, b)``
becomes ``(a cos - b sin, a sin + b cos)``; ``layout="interleaved"`` pairs
features ``(2i, 2i+1)``, ``"half"`` pairs ``(i, i + r/2)``.  :func:`rotate`
picks the path:

* the differentiable elementwise form (:func:`rotate_functional`) under
  autograd, tracing, transforms and for meta/fake tensors;
* Triton on CUDA (:mod:`posenc._triton_rope`);
* one complex multiply for the interleaved layout in float32/float64 on a CPU;
* cache-sized chunks through a float32 scratch otherwise (bf16/fp16, "half").

:mod:`posenc._fused_rope` is the one-pass compiled alternative
(:func:`compiled_ok` says when it applies).
"""

from __future__ import annotations

import math

import torch

from . import _fused_rope, _memory
from ._angles import compute_dtype
from ._runtime import eager_ok, in_transform, tracing

__all__: list[str] = []  # private module

# Elements of float32 scratch per chunk in the bf16/fp16 and "half" paths (1 MiB):
# small enough to stay in a per-core L2, so memory traffic is one read and one
# write of x; large enough that Python's per-chunk overhead stays small.
_CHUNK_ELEMENTS = 1 << 18


def compiled_ok(out: torch.Tensor | None, r: int, x: torch.Tensor, *tensors: torch.Tensor) -> bool:
    """Whether the compiled one-pass rotation (``posenc._fused_rope``) applies."""
    return out is None and r == x.shape[-1] and _fused_rope.usable(x, *tensors)


def rotate(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str,
    r: int,
    out: torch.Tensor | None,
) -> torch.Tensor:
    """Rotate the first ``r`` features of ``x`` by tables ``cos, sin`` ``(..., seq, r // 2)``.

    The tables broadcast against ``x.shape[:-1] + (r // 2,)``.
    """
    needs_grad = torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad)
    if out is not None:
        if needs_grad:
            raise ValueError("out must be None when x requires grad (out= is not differentiable)")
        if not tracing() and in_transform(x):
            raise ValueError("out must be None inside vmap, grad, jvp or forward-mode AD")
        _check_out(out, x)
    if needs_grad or not (eager_ok(x) and eager_ok(cos)):
        y = rotate_functional(x, cos, sin, layout, r)
        return y if out is None else out.copy_(y)
    if out is None:
        out = _memory.empty(*x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return out
    if r < x.shape[-1] and out.data_ptr() != x.data_ptr():
        out[..., r:].copy_(x[..., r:])
    if x.is_cuda:
        from . import _triton_rope

        if _triton_rope.available():
            cos, sin, group = table_batches(cos, sin, x.shape[:-2])
            return _triton_rope.rotate(x, cos, sin, group, layout, r, out)
    if layout == "interleaved" and x.dtype in (torch.float32, torch.float64):
        x = x.contiguous()  # the complex view needs unit feature stride and even offsets
        # one pass: (a + ib) * (cos + i sin) on the complex view of feature pairs
        xc = torch.view_as_complex(x[..., :r].unflatten(-1, (r // 2, 2)))
        oc = torch.view_as_complex(out[..., :r].unflatten(-1, (r // 2, 2)))
        torch.mul(xc, torch.complex(cos, sin), out=oc)
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    _rotate_chunked(x, cos, sin, layout, r, out)
    return out


def rotate_functional(
    x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: str, r: int
) -> torch.Tensor:
    """Differentiable elementwise form, computed in float32 or better."""
    work = compute_dtype(x.dtype)
    xr = x[..., :r].to(work)
    if layout == "interleaved":
        a, b = xr[..., 0::2], xr[..., 1::2]
        y = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    else:
        a, b = xr[..., : r // 2], xr[..., r // 2 :]
        y = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    return torch.cat((y.to(x.dtype), x[..., r:]), dim=-1)


def table_batches(
    cos: torch.Tensor, sin: torch.Tensor, lead: tuple[int, ...]
) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Tables as ``(tb, seq, h)``, and ``group``: flattened batch entry ``n`` uses ``n // group``.

    ``lead`` is ``x.shape[:-2]``.  Shared tables give ``tb = 1``; per-batch
    tables ``(batch, 1, ..., seq, h)`` give ``tb = batch`` without copying
    them per head; any other broadcast is expanded, ``tb = prod(lead)``.
    """
    seq, h = cos.shape[-2:]
    n = math.prod(lead)
    clead = (1,) * (len(lead) - (cos.dim() - 2)) + tuple(cos.shape[:-2])
    if all(c == 1 for c in clead):
        return cos.reshape(1, seq, h), sin.reshape(1, seq, h), max(n, 1)
    if clead[0] == lead[0] and all(c == 1 for c in clead[1:]):
        return cos.reshape(lead[0], seq, h), sin.reshape(lead[0], seq, h), n // lead[0]
    shape = (*lead, seq, h)
    return cos.expand(shape).reshape(n, seq, h), sin.expand(shape).reshape(n, seq, h), 1


def _rotate_chunked(
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    layout: str,
    r: int,
    out: torch.Tensor,
) -> None:
    """Rotate through a cache-sized float32/float64 scratch, one chunk of rows at a time.

    Each element of ``x`` is read from memory once and each of ``out`` written
    once; the intermediate arithmetic stays in cache.  Needed for bf16/fp16
    (no complex type) and for the "half" layout (pairs are not adjacent).
    """
    seq, dim, h = x.shape[-2], x.shape[-1], r // 2
    work = cos.dtype
    x3 = x.reshape(-1, seq, dim)
    out3 = out.view(-1, seq, dim)
    cos, sin, group = table_batches(cos, sin, x.shape[:-2])
    per_batch = cos.shape[0] > 1
    rows = max(1, _CHUNK_ELEMENTS // r)  # sequence rows per chunk
    if rows >= seq:
        nb, ns = max(1, rows // seq), seq
    else:
        nb, ns = 1, rows
    scratch = torch.empty(nb * ns * r, dtype=work, device=x.device)
    rot = torch.complex(cos, sin) if layout == "interleaved" else None
    for b0 in range(0, x3.shape[0], nb):
        b1 = min(b0 + nb, x3.shape[0])
        # table of each row in this chunk: a few indices, gathered per chunk
        tab = torch.arange(b0, b1, device=x.device) // group if per_batch else 0
        for s0 in range(0, seq, ns):
            s1 = min(s0 + ns, seq)
            src = x3[b0:b1, s0:s1, :r]
            dst = out3[b0:b1, s0:s1, :r]
            buf = scratch[: src.numel()].view(src.shape)
            if rot is not None:  # the interleaved layout
                buf.copy_(src)
                bc = torch.view_as_complex(buf.unflatten(-1, (h, 2)))
                bc.mul_(rot[tab, s0:s1])
            else:
                c, s = cos[tab, s0:s1], sin[tab, s0:s1]
                a, b = src[..., :h], src[..., h:]
                torch.mul(a, c, out=buf[..., :h]).addcmul_(b, s, value=-1.0)
                torch.mul(b, c, out=buf[..., h:]).addcmul_(a, s)
            dst.copy_(buf)


def _check_out(out: object, x: torch.Tensor) -> None:
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch.Tensor, got {type(out).__name__}")
    if out.shape != x.shape or out.dtype != x.dtype or out.device != x.device:
        raise ValueError(
            f"out must match x in shape, dtype and device ({tuple(x.shape)}, {x.dtype}, "
            f"{x.device}), got ({tuple(out.shape)}, {out.dtype}, {out.device})"
        )
    if not out.is_contiguous():
        raise ValueError("out must be contiguous")
