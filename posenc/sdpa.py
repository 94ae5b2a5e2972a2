"""The attention math every path shares: SDPA, explicit softmax, scores and grouped heads.

A scheme author builds a custom :meth:`~posenc.PositionalScheme.attend` from
these helpers, which treat masks (through :func:`posenc.merge_masks`),
grouped-query heads and queries that see no key the same way for every scheme:

* :func:`scaled_dot_product`: PyTorch's SDPA with an optional additive bias;
* :func:`softmax_weights`: the softmax of explicit logits;
* :func:`dot_scores`: ``scale * q @ k.T`` in float32 at least;
* :func:`repeat_kv`: key/value heads repeated to the query heads.

Shapes: ``q`` ``(batch, heads, q_len, d)``, ``k`` ``(batch, kv_heads, k_len,
d)``, ``v`` ``(batch, kv_heads, k_len, d_v)``, with ``kv_heads`` dividing
``heads``: query head ``h`` uses key/value head ``h // (heads // kv_heads)``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._runtime import in_transform, tracing
from .masks import merge_masks

__all__ = ["dot_scores", "repeat_kv", "scaled_dot_product", "softmax_weights"]


def repeat_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat the heads of ``t`` ``(..., kv_heads, len, d)`` to ``num_heads`` (grouped-query).

    Query head ``h`` uses head ``h // (num_heads // kv_heads)``, as SDPA's
    ``enable_gqa``.  A no-op when the counts already agree.

    Parameters
    ----------
    t
        Keys or values ``(..., kv_heads, len, d)``.
    num_heads
        Number of query heads, a multiple of ``kv_heads``.

    Returns
    -------
    Tensor
        ``(..., num_heads, len, d)``; ``t`` itself when ``kv_heads == num_heads``.

    Examples
    --------
    >>> import torch, posenc
    >>> kv = torch.tensor([0.0, 1.0]).reshape(2, 1, 1)    # two heads of one token
    >>> posenc.repeat_kv(kv, 4).flatten().tolist()        # each serves two query heads
    [0.0, 0.0, 1.0, 1.0]
    """
    if t.dim() < 3 or t.shape[-3] == num_heads:
        return t
    return t.repeat_interleave(num_heads // t.shape[-3], dim=-3)


def dot_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * q @ k.T`` ``(batch, heads, q_len, k_len)`` in float32 at least (float64 stays).

    Parameters
    ----------
    q
        Queries ``(batch, heads, q_len, d)``.
    k
        Keys ``(batch, kv_heads, k_len, d)``, ``kv_heads`` dividing ``heads``.
    scale
        Multiplier of the dot products.

    Returns
    -------
    Tensor
        ``(batch, heads, q_len, k_len)`` in float32, or float64 for float64 inputs.
    """
    work = torch.promote_types(q.dtype, torch.float32)
    k = repeat_kv(k, q.shape[-3]).to(work)
    return scale * (q.to(work) @ k.transpose(-1, -2))


def scaled_dot_product(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """PyTorch's SDPA with the shared mask handling: the path of every ``rotate``/``bias`` scheme.

    ``q`` ``(batch, heads, q_len, d)``; ``k``, ``v`` with ``kv_heads``
    dividing ``heads`` (SDPA's ``enable_gqa``).  ``mask`` is the caller's
    merged mask (``ctx.mask``), ``bias`` a scheme's additive bias; both go
    through :func:`posenc.merge_masks`, which hands SDPA a 4-D contiguous mask
    in ``q``'s dtype (or a boolean one), ``is_causal`` or nothing.
    ``q_offset`` defaults to ``k_len - q_len`` and ``scale`` to ``1 / sqrt(d)``.
    Queries that see no key get zeros.  Float64 inputs that need gradients
    take the explicit math (:func:`softmax_weights`) instead, since the fused
    CPU kernel's backward cannot be differentiated again (Hessians,
    ``gradgradcheck``); in float32 or bf16, use
    ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` for that.

    Parameters
    ----------
    q, k, v
        Queries ``(batch, heads, q_len, d)``, keys ``(batch, kv_heads, k_len,
        d)`` and values ``(batch, kv_heads, k_len, d_v)``.
    mask
        The merged mask of the call (``ctx.mask``), or ``None``.
    bias
        A scheme's additive bias, broadcastable to ``(batch, heads, q_len,
        k_len)``, or ``None``.
    causal
        Whether query ``i`` sees only the keys ``j <= q_offset + i``.
    q_offset
        Index of the first query among the keys (default ``k_len - q_len``).
    scale
        Multiplier of ``q @ k.T`` (default ``1 / sqrt(d)``).

    Returns
    -------
    Tensor
        ``(batch, heads, q_len, d_v)`` in the dtype of ``q``.
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    q_offset = k_len - q_len if q_offset is None else q_offset
    if (q.dtype == torch.float64 and _needs_grad(q, k, v, mask, bias)) or (
        not tracing() and in_transform(q)
    ):
        # SDPA's fused CPU kernel has no double backward; float64 autograd is where
        # Hessians and gradgradcheck are taken, so it runs the explicit math instead.
        # Inside vmap/grad/jvp, SDPA runs a per-sample fallback that refuses a mask
        # needing gradients (which the wrapper does not report): explicit math there too.
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        w = softmax_weights(
            dot_scores(q, k, scale), mask=mask, bias=bias, causal=causal, q_offset=q_offset
        )
        return w @ repeat_kv(v, q.shape[-3])
    m = merge_masks(
        mask,
        bias,
        causal=causal,
        q_offset=q_offset,
        q_len=q_len,
        k_len=k_len,
        dtype=q.dtype,
        device=q.device,
        allow_is_causal=True,
    )
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=m.mask,
        is_causal=m.is_causal,
        scale=scale,
        enable_gqa=q.dim() >= 3 and k.shape[-3] != q.shape[-3],
    )
    return out if m.seen is None else torch.where(m.seen, out, 0.0)


def softmax_weights(
    logits: torch.Tensor,
    *,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
) -> torch.Tensor:
    """Softmax of explicit ``logits`` ``(batch, heads, q_len, k_len)`` with the shared masks.

    The path of every scheme that computes its scores itself.  ``mask``,
    ``bias``, ``causal`` and ``q_offset`` as in :func:`scaled_dot_product`;
    masks are merged in ``logits``' dtype.  Rows that see no key are zero.

    Parameters
    ----------
    logits
        Scores ``(batch, heads, q_len, k_len)``, already scaled.
    mask, bias, causal, q_offset
        As in :func:`scaled_dot_product`.

    Returns
    -------
    Tensor
        The weights, ``logits``' shape and dtype; each row sums to 1 or is zero.

    Examples
    --------
    >>> import torch, posenc
    >>> posenc.softmax_weights(torch.zeros(1, 1, 2, 2, dtype=torch.float64), causal=True).tolist()
    [[[[1.0, 0.0], [0.5, 0.5]]]]
    """
    q_len, k_len = logits.shape[-2], logits.shape[-1]
    q_offset = k_len - q_len if q_offset is None else q_offset
    m = merge_masks(
        mask,
        bias,
        causal=causal,
        q_offset=q_offset,
        q_len=q_len,
        k_len=k_len,
        dtype=logits.dtype,
        device=logits.device,
    )
    if m.mask is not None:
        if m.mask.dtype == torch.bool:
            logits = logits.masked_fill(~m.mask, float("-inf"))
        else:
            logits = logits + m.mask
    w = torch.softmax(logits, dim=-1)
    return w if m.seen is None else torch.where(m.seen, w, 0.0)


def _needs_grad(*tensors: torch.Tensor | None) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)
