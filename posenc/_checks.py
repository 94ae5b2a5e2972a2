"""Argument checks shared by every public function.

Each check raises a ``TypeError`` (wrong kind of value) or ``ValueError``
(right kind, wrong value) whose message names the parameter and says what is
allowed, so that a user sees ``dim must be a positive even integer, got 7``
rather than a shape error three calls deeper.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable

import torch

from ._runtime import has_values

__all__: list[str] = []  # private module

# Largest |position| accepted anywhere positions enter attention.  Beyond 2**31
# the float64 angle p * w of RoPE carries an error above float32 roundoff
# (2**31 * 2**-53 ~ 2.4e-7 rad), and differences of positions could not
# overflow int64 for any value below it.  No model has such contexts.
MAX_POSITION = 2**31


def check_int(name: str, value, *, minimum: int | None = None) -> int:
    """Return ``value`` as an ``int``; reject bools, floats and values below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise ValueError(f"{name} must be {kind}, got {value}")
    return value


def check_even(name: str, value, *, minimum: int = 2) -> int:
    """Return ``value`` as an ``int`` if it is even and at least ``minimum``."""
    value = check_int(name, value, minimum=minimum)
    if value % 2:
        raise ValueError(f"{name} must be an even integer >= {minimum}, got {value}")
    return value


def check_float(name: str, value, *, positive: bool = False, minimum: float | None = None) -> float:
    """Return ``value`` as a finite ``float``, optionally requiring ``> 0`` or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    value = float(value)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def check_choice(name: str, value, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    choices = tuple(choices)
    if value not in choices:
        allowed = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {allowed}, got {value!r}")
    return value


def check_tensor(name: str, value, *, min_dim: int = 0) -> torch.Tensor:
    """Return ``value`` if it is a tensor with at least ``min_dim`` dimensions."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimensions, got shape {tuple(value.shape)}"
        )
    return value


def check_floating(name: str, value, *, min_dim: int = 0) -> torch.Tensor:
    """Return ``value`` if it is a floating-point tensor with at least ``min_dim`` dimensions."""
    value = check_tensor(name, value, min_dim=min_dim)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {value.dtype}")
    return value


def as_positions(name: str, value, *, device=None) -> torch.Tensor:
    """Return integer positions as an ``int64`` tensor on ``device``.

    Accepts an integer tensor, or a sequence/range of Python ints.  Float
    positions are rejected: a position is an index, and silently truncating
    ``2.7`` to ``2`` would hide a bug in the caller.
    """
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        return value.to(device=device if device is not None else value.device, dtype=torch.int64)
    if isinstance(value, range):
        return torch.arange(value.start, value.stop, value.step, device=device)
    try:
        items = list(value)
    except TypeError:
        raise TypeError(
            f"{name} must be an integer tensor or a sequence of ints, got {type(value).__name__}"
        ) from None
    for item in items:
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            raise TypeError(f"{name} must hold integers, got {item!r}")
    return torch.tensor(items, dtype=torch.int64, device=device)


def check_float_dtype(name: str, dtype) -> torch.dtype:
    """Return ``dtype`` if it is a floating-point ``torch.dtype``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def check_heads(owner: str, q, num_heads: int, *, head_dim: int | None = None) -> None:
    """Raise unless ``q`` is ``(..., num_heads, q_len, head_dim)``; ``owner`` names the scheme."""
    dim = "d" if head_dim is None else f"head_dim={head_dim}"
    if (
        q.dim() < 3
        or q.shape[-3] != num_heads
        or (head_dim is not None and q.shape[-1] != head_dim)
    ):
        raise ValueError(
            f"{owner} needs q of shape (..., num_heads={num_heads}, q_len, {dim}), "
            f"got shape {tuple(q.shape)}"
        )


def check_offset(q_len: int, k_len: int, q_offset, *, causal: bool) -> int:
    """Return the position of the first query among the keys (default ``k_len - q_len``).

    With ``causal=True`` the offset must be >= 0 (else the first query sees no
    key).  Every query position ``q_offset .. q_offset + q_len - 1`` must lie
    strictly within ``MAX_POSITION`` of 0.
    """
    if q_offset is None:
        q_offset = k_len - q_len
        if causal and q_offset < 0:
            raise ValueError(
                f"a causal mask needs q_len <= k_len when q_offset is not given "
                f"(queries align with the last keys), got q_len={q_len}, k_len={k_len}"
            )
    else:
        q_offset = check_int("q_offset", q_offset)
        if causal and q_offset < 0:
            raise ValueError(f"q_offset must be >= 0 with causal=True, got {q_offset}")
    if q_offset <= -MAX_POSITION or q_offset + q_len > MAX_POSITION:
        raise ValueError(
            f"q_offset must keep every query position q_offset .. q_offset + q_len - 1 strictly "
            f"within 2**31 = {MAX_POSITION} of 0, got q_offset={q_offset} with q_len={q_len}"
        )
    return q_offset


def check_position_values(name: str, positions: torch.Tensor) -> None:
    """Raise if a position lies ``MAX_POSITION`` or more from 0 (when values are readable)."""
    if positions.numel() and has_values(positions):
        if bool(((positions >= MAX_POSITION) | (positions <= -MAX_POSITION)).any()):
            raise ValueError(
                f"{name} must lie strictly within 2**31 = {MAX_POSITION} of 0, got values from "
                f"{int(positions.min())} to {int(positions.max())}"
            )


def check_mask(name: str, t, q: torch.Tensor, k_len: int) -> torch.Tensor:
    """Return a caller's mask or bias for scores ``(*q.shape[:-2], q_len, k_len)``.

    A boolean tensor is a keep-mask, a floating one is additive; other dtypes
    are refused.  The shape is ``(q_len, k_len)`` or has one axis per score
    axis, each of size 1 or equal; a 3-D tensor with 4-D ``q`` is refused as
    ambiguous.  With more than 4 score axes, the batch axes are merged as
    :func:`posenc.attention` merges those of ``q``.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.bool and not t.is_floating_point():
        raise TypeError(
            f"{name} must be a boolean keep-mask (True = attend) or a floating additive mask, "
            f"got dtype {t.dtype}; convert a 0/1 attention mask with {name}.bool()"
        )
    scores = (*q.shape[:-2], q.shape[-2], k_len)
    full = len(scores)
    names = {2: "(q_len, k_len)", 3: "(heads, q_len, k_len)"}.get(
        full, "(batch, heads, q_len, k_len)" if full == 4 else "(*batch, heads, q_len, k_len)"
    )
    ok = t.dim() in (2, full) and all(
        s in (1, want) for s, want in zip(t.shape, scores[-t.dim() :], strict=True)
    )
    if not ok:
        message = (
            f"{name} must have shape (q_len, k_len) = {scores[-2:]} or one axis per score axis "
            f"{names} = {scores}, each of size 1 or equal; got shape {tuple(t.shape)}"
        )
        if t.dim() == 3 and full == 4:
            message += (
                f". A 3-D {name} is ambiguous (batch or heads first?): use {name}[:, None] "
                f"for (batch, q_len, k_len) or {name}[None] for (heads, q_len, k_len)"
            )
        raise ValueError(message)
    if t.dim() == full and full > 4:  # flatten the batch dimensions, as for q
        t = t.expand(*scores[:-3], *t.shape[-3:]).reshape(-1, *t.shape[-3:])
    return t
