"""Masks: the causal mask and the one helper that merges every mask a path sees.

A mask is either a boolean keep-mask (``True`` = attend) or a floating tensor
added to the scaled scores (``-inf`` removes a key).  :func:`merge_masks`
combines the caller's mask, the causal mask and a scheme's additive bias into
one tensor for every path (SDPA, FlexAttention's block mask, explicit softmax),
so that masking behaves the same for every scheme: a boolean result while every
term is boolean, an additive one as soon as a term is floating.

The causal mask is by index: query ``i`` sees key ``j`` iff
``j <= q_offset + i``, whatever the positions.  A query whose every key is
masked attends to nothing: its row is cleared here (so the softmax stays
finite) and ``seen`` tells the caller to zero its output.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ._checks import check_int, check_offset
from ._types import Device

__all__ = ["causal_mask", "merge_masks", "Masks"]


def causal_mask(
    q_len: int, k_len: int, q_offset: int | None = None, *, device: Device = None
) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` mask, ``True`` where query ``i`` may see key ``j``.

    ``j <= q_offset + i``, with ``q_offset`` defaulting to ``k_len - q_len``.

    Parameters
    ----------
    q_len, k_len
        Numbers of queries and keys.
    q_offset
        Index of the first query among the keys; ``k_len - q_len`` by default
        (the queries are the newest tokens).
    device
        Device of the mask.

    Returns
    -------
    Tensor
        Boolean ``(q_len, k_len)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.causal_mask(3, 3).int().tolist()
    [[1, 0, 0], [1, 1, 0], [1, 1, 1]]
    >>> posenc.causal_mask(2, 4).tolist()          # two new queries after two cached keys
    [[True, True, True, False], [True, True, True, True]]
    """
    q_len = check_int("q_len", q_len, minimum=1)
    k_len = check_int("k_len", k_len, minimum=1)
    q_offset = check_offset(q_len, k_len, q_offset, causal=True)
    i = torch.arange(q_len, device=device).unsqueeze(-1)
    j = torch.arange(k_len, device=device)
    return j <= i + q_offset


class Masks(NamedTuple):
    """What :func:`merge_masks` returns.

    Parameters
    ----------
    mask
        ``None``, a boolean keep-mask or an additive float tensor, 4-D
        ``(batch|1, heads|1, q_len, k_len)`` and contiguous, where no row is
        fully masked.
    is_causal
        Let SDPA apply the causal mask itself.
    seen
        ``None`` or a boolean ``(batch|1, heads|1, q_len, 1)``, false for the
        queries that see no key; their rows of ``mask`` are cleared so that the
        softmax stays finite, and the caller zeroes their output.
    """

    mask: torch.Tensor | None
    is_causal: bool
    seen: torch.Tensor | None


def merge_masks(
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    *,
    causal: bool,
    q_offset: int,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device: Device,
    allow_is_causal: bool = False,
) -> Masks:
    """Combine the caller's mask, the causal mask and a scheme's bias into one.

    Parameters
    ----------
    mask
        The caller's mask and bias, merged by :func:`posenc.attention`
        (``None``, a boolean keep-mask or an additive float tensor, e.g.
        ``ctx.mask``); it may mask whole rows.
    bias
        A scheme's finite additive bias, or ``None``.
    causal, q_offset, q_len, k_len
        The causal mask ``j <= q_offset + i``; it is skipped when every query
        sees every key.
    dtype, device
        Dtype of a floating result (the query's for SDPA, the softmax's
        otherwise) and device of the causal mask.
    allow_is_causal
        Return ``is_causal=True`` instead of a mask when the causal mask is all
        there is and ``q_offset == 0`` (SDPA's top-left alignment).

    Returns
    -------
    :class:`Masks`.  The mask stays boolean when every term is boolean; any
    float term makes it an additive float tensor with ``-inf`` where a boolean
    term is false.
    """
    if causal and q_offset >= k_len - 1:
        causal = False  # the first query already sees every key, so all of them do
    if causal and allow_is_causal and mask is None and bias is None and q_offset == 0:
        return Masks(None, True, None)
    merged = None if mask is None else _cast(mask, dtype)
    if causal:
        merged = combine(merged, causal_mask(q_len, k_len, q_offset, device=device))
    if bias is not None:
        merged = combine(merged, bias.to(dtype))
    if merged is None:
        return Masks(None, False, None)
    seen = None
    if mask is not None:  # only the caller's mask can empty a row (legal offsets never do)
        if merged.dtype == torch.bool:
            seen = merged.any(-1, keepdim=True)
            merged = merged | ~seen
        else:
            seen = (merged != float("-inf")).any(-1, keepdim=True)
            merged = merged.masked_fill(~seen, 0.0)
        seen = as_4d(seen)
    # SDPA takes its fused kernels only with a 2-D or 4-D mask; 4-D contiguous is safe
    return Masks(as_4d(merged).contiguous(), False, seen)


def combine(a: torch.Tensor | None, b: torch.Tensor) -> torch.Tensor:
    """One mask from two: ``&`` of keep-masks, ``+`` of additive ones, ``-inf`` where mixed."""
    if a is None:
        return b
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    if a.dtype == torch.bool:
        return torch.where(a, b, float("-inf"))
    if b.dtype == torch.bool:
        return torch.where(b, a, float("-inf"))
    return a + b


def as_4d(t: torch.Tensor) -> torch.Tensor:
    """Prepend size-1 axes up to 4-D: ``(q, k)`` -> ``(1, 1, q, k)``."""
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == torch.bool else t.to(dtype)
