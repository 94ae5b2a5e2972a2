"""The call context: everything a scheme's hooks know about one attention call.

:func:`posenc.attention` validates its arguments once and hands every hook one
:class:`CallContext` instead of a list of positional arguments.  The positions
in it are the ones the scheme must use: the defaults (keys at ``0 .. k_len-1``,
queries at ``q_offset .. q_offset+q_len-1``), the caller's ``q_positions`` and
``k_positions`` (a left-padded batch), or the positions a
:class:`posenc.KVCache` keeps for its keys.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ._checks import (
    as_positions,
    check_float,
    check_floating,
    check_mask,
    check_offset,
    check_position_values,
    warn_caller,
)
from ._types import Positions
from .masks import as_4d, combine

__all__ = ["CallContext"]


class CallContext(NamedTuple):
    """What a scheme's hooks know about one call of :func:`posenc.attention`.

    Attributes
    ----------
    q_positions, k_positions
        Integer (int64) positions of the queries and keys, ``(q_len,)`` and
        ``(k_len,)`` shared by the batch, or ``(batch, q_len)`` and ``(batch,
        k_len)`` per sample (both per sample, or neither).  Every position lies
        strictly within ``2**31`` of 0.
    q_offset
        Index of the first query among the keys: the causal mask is
        ``j <= q_offset + i`` by index, whatever the positions.
    scale
        Multiplier of ``q @ k.T`` (``1 / sqrt(head_dim)`` by default).
    causal
        Whether the causal mask applies.
    mask
        The caller's ``mask`` and ``bias`` merged: ``None``, a boolean
        keep-mask or an additive float tensor, 4-D ``(batch|1, heads|1,
        q_len|1, k_len|1)``.  Pass it on to the helpers
        (:func:`posenc.scaled_dot_product`, :func:`posenc.softmax_weights`,
        :func:`posenc.merge_masks`); it may mask whole rows.
    batch, heads, kv_heads, q_len, k_len, head_dim
        Sizes of the 4-D ``q (batch, heads, q_len, head_dim)`` and ``k (batch,
        kv_heads, k_len, head_dim)`` the hooks receive.
    dtype, device
        Of ``q``.
    """

    q_positions: torch.Tensor
    k_positions: torch.Tensor
    q_offset: int
    scale: float
    causal: bool
    mask: torch.Tensor | None
    batch: int
    heads: int
    kv_heads: int
    q_len: int
    k_len: int
    head_dim: int
    dtype: torch.dtype
    device: torch.device

    @classmethod
    def of(
        cls,
        q: torch.Tensor,
        k: torch.Tensor,
        *,
        q_positions: Positions | None = None,
        k_positions: Positions | None = None,
        q_offset: int | None = None,
        scale: float | None = None,
        causal: bool = False,
        mask: torch.Tensor | None = None,
    ) -> CallContext:
        """A context for calling a hook on ``q`` and ``k`` directly, not through ``attention``.

        ``q`` ``(..., heads, q_len, d)`` and ``k`` ``(..., kv_heads, k_len, d)``
        (fewer dimensions count as batch and heads of 1).  Positions default as
        in :func:`posenc.attention`; they are taken as given (integers of any
        shape a hook accepts), so that a hook sees exactly what its caller
        passed.  ``mask`` must already be merged (4-D or ``None``).
        """
        q_len, k_len = q.shape[-2], k.shape[-2]
        if q_offset is None:
            q_offset = k_len - q_len
        device = q.device
        if k_positions is None:
            k_positions = torch.arange(k_len, device=device)
        if q_positions is None:
            q_positions = torch.arange(q_len, device=device) + q_offset
        return cls(
            as_positions("q_positions", q_positions, device=device),
            as_positions("k_positions", k_positions, device=device),
            q_offset,
            1.0 / math.sqrt(q.shape[-1]) if scale is None else scale,
            causal,
            mask,
            q.shape[0] if q.dim() >= 4 else 1,
            q.shape[-3] if q.dim() >= 3 else 1,
            k.shape[-3] if k.dim() >= 3 else 1,
            q_len,
            k_len,
            q.shape[-1],
            q.dtype,
            device,
        )


def as_context(
    q: torch.Tensor, k: torch.Tensor, ctx: Any, *legacy: Any, hook: str = "the hook"
) -> CallContext:
    """``ctx``, or a context built from a hook's old positional arguments.

    Hooks used to take ``(q, k, q_positions, k_positions[, scale])``; the
    built-in schemes still accept that form when called directly, e.g.
    ``rope.rotate(q, k, q_pos, k_pos)``, and warn (:class:`DeprecationWarning`,
    naming ``hook``; not while ``torch.compile`` traces the call, which cannot
    inspect the caller's frame): the old form goes in 0.2.0.

    Parameters
    ----------
    q, k
        The hook's query and key tensors.
    ctx
        A :class:`CallContext`, or the old form's ``q_positions``.
    *legacy
        The old form's remaining arguments: ``k_positions`` and ``scale``.
    hook
        The hook as the caller wrote it (``"RotaryEmbedding.rotate"``), for the warning.

    Returns
    -------
    CallContext
        ``ctx`` itself, or one built with :meth:`CallContext.of`.
    """
    if isinstance(ctx, CallContext) and not legacy:
        return ctx
    if not torch.compiler.is_compiling():
        warn_caller(
            f"{hook}(q, k, q_positions, k_positions, ...) is deprecated and will be removed "
            f"in posenc 0.2.0: pass a posenc.CallContext, {hook}(q, k, posenc.CallContext.of("
            f"q, k, q_positions=..., k_positions=...))",
            DeprecationWarning,
        )
    k_positions = legacy[0] if legacy else None
    scale = legacy[1] if len(legacy) > 1 else None
    return CallContext.of(q, k, q_positions=ctx, k_positions=k_positions, scale=scale)


def prepare(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor | None,
    *,
    mask: torch.Tensor | None,
    bias: torch.Tensor | None,
    causal: bool,
    q_offset: int | None,
    q_positions: Positions | None,
    k_positions: Positions | None,
    scale: float | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, CallContext]:
    """Validate the arguments of :func:`posenc.attention`: ``(q, k, v)`` as 4-D, and the context.

    ``v`` may be ``None`` (:func:`posenc.attention_weights`).
    """
    q = check_floating("q", q, min_dim=2)
    k = check_floating("k", k, min_dim=2)
    named = [("q", q), ("k", k)]
    if v is not None:
        named.append(("v", check_floating("v", v, min_dim=2)))
    names = ", ".join(n for n, _ in named[:-1]) + " and " + named[-1][0]
    if len({t.dtype for _, t in named}) > 1:
        got = ", ".join(str(t.dtype) for _, t in named)
        raise TypeError(f"{names} must share a dtype, got {got}")
    if len({t.device for _, t in named}) > 1:
        got = ", ".join(str(t.device) for _, t in named)
        raise ValueError(f"{names} must be on one device, got {got}")
    if len({t.dim() for _, t in named}) > 1:
        got = ", ".join(str(tuple(t.shape)) for _, t in named)
        raise ValueError(f"{names} must have the same number of dimensions, got shapes {got}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if v is not None and k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q_len == 0 or k_len == 0:
        raise ValueError(f"q_len and k_len must be positive, got {q_len} and {k_len}")
    _check_heads(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    q_offset = check_offset(q_len, k_len, q_offset, causal=causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        scale = check_float("scale", scale, positive=True)
    caller = None
    for name, t in (("mask", mask), ("bias", bias)):
        if t is not None:
            caller = combine(caller, as_4d(check_mask(name, t, q, k_len)))
    q_positions, k_positions = _positions(q, k_len, q_offset, q_positions, k_positions)
    q4, k4 = _to_4d(q), _to_4d(k)
    v4 = None if v is None else _to_4d(v)
    ctx = CallContext(
        q_positions, k_positions, q_offset, scale, causal, caller,
        q4.shape[0], q4.shape[1], k4.shape[1], q_len, k_len, q.shape[-1], q.dtype, q.device,
    )  # fmt: skip
    return q4, k4, v4, ctx


def _check_heads(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor | None) -> None:
    if q.dim() < 3:
        return
    if q.shape[:-3] != k.shape[:-3] or (v is not None and v.shape[:-3] != k.shape[:-3]):
        shapes = [tuple(q.shape), tuple(k.shape)] + ([] if v is None else [tuple(v.shape)])
        raise ValueError(
            "q, k and v must have the same batch dimensions (all but the last three: heads, "
            f"len, d), got shapes {', '.join(map(str, shapes))}"
        )
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if v is not None and v.shape[-3] != kv_heads:
        raise ValueError(
            f"k and v must have the same number of heads, got {kv_heads} and {v.shape[-3]}"
        )
    if heads % kv_heads:
        raise ValueError(
            f"k and v must have a number of heads that divides q's (grouped-query attention), "
            f"got {kv_heads} heads for k and v and {heads} for q"
        )


def _to_4d(t: torch.Tensor) -> torch.Tensor:
    """``(len, d)`` -> ``(1, 1, len, d)``, ``(h, len, d)`` -> ``(1, h, len, d)``, batch merged."""
    if t.dim() <= 4:
        return as_4d(t)
    return t.reshape(-1, *t.shape[-3:])


def _positions(
    q: torch.Tensor,
    k_len: int,
    q_offset: int,
    q_positions: Positions | None,
    k_positions: Positions | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Integer positions ``(len,)`` or ``(batch, len)`` for the scheme hooks, on q's device."""
    q_len, device = q.shape[-2], q.device
    if q_positions is None and k_positions is None:
        return torch.arange(q_len, device=device) + q_offset, torch.arange(k_len, device=device)
    if q_positions is not None:
        q_positions = _check_positions("q_positions", q_positions, q, q_len, "q_len")
    if k_positions is not None:
        k_positions = _check_positions("k_positions", k_positions, q, k_len, "k_len")
    if k_positions is None:
        k_positions = torch.arange(k_len, device=device)
    if q_positions is None:
        if q_offset < 0 or q_offset + q_len > k_len:
            raise ValueError(
                f"q_positions must be given when the queries are not among the keys "
                f"(q_offset={q_offset}, q_len={q_len}, k_len={k_len}): with k_positions alone, "
                f"query i takes the position of key q_offset + i"
            )
        q_positions = k_positions[..., q_offset : q_offset + q_len]
    if q_positions.dim() != k_positions.dim():  # one per sample: both per sample
        batch = (q_positions if q_positions.dim() == 2 else k_positions).shape[0]
        q_positions = q_positions.expand(batch, q_len) if q_positions.dim() == 1 else q_positions
        k_positions = k_positions.expand(batch, k_len) if k_positions.dim() == 1 else k_positions
    return q_positions, k_positions


def _check_positions(
    name: str, value: Positions, q: torch.Tensor, length: int, length_name: str
) -> torch.Tensor:
    t = as_positions(name, value, device=q.device)
    if t.dim() not in (1, 2) or t.shape[-1] != length:
        raise ValueError(
            f"{name} must have shape ({length_name},) = ({length},) or (batch, {length_name}), "
            f"got shape {tuple(t.shape)}"
        )
    if t.dim() == 2:
        if q.dim() != 4:
            raise ValueError(
                f"{name} of shape (batch, {length_name}) needs q, k and v of shape (batch, "
                f"heads, len, d), got q of shape {tuple(q.shape)}"
            )
        if t.shape[0] not in (1, q.shape[0]):
            raise ValueError(
                f"{name} has {t.shape[0]} rows but q has batch size {q.shape[0]}: one row of "
                f"positions per batch item"
            )
    check_position_values(name, t)
    return t
