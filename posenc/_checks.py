"""Argument checks shared by every public function.

Each check raises a ``TypeError`` (wrong kind of value) or ``ValueError``
(right kind, wrong value) whose message names the parameter and says what is
allowed, so that a user sees ``dim must be a positive even integer, got 7``
rather than a shape error three calls deeper.
"""

from __future__ import annotations

import numbers
from collections.abc import Iterable
from typing import Any

import torch

from ._runtime import has_values
from ._types import Device

__all__: list[str] = []  # private module

# Every position, wherever it enters posenc, lies strictly within MAX_POSITION of
# 0.  Beyond 2**31 the float64 angle p * w of RoPE and of the sinusoidal table
# carries an error above float32 roundoff (2**31 * 2**-53 ~ 2.4e-7 rad);
# below it, differences of positions (at most 2**32) and every float64
# conversion are exact.  No model has such contexts.  Relative positions
# (key - query) are bounded by MAX_DISTANCE, the largest such difference.
MAX_POSITION = 2**31
MAX_DISTANCE = 2 * MAX_POSITION
_INT64 = 2**63


def check_int(name: str, value: Any, *, minimum: int | None = None) -> int:
    """Return ``value`` as an ``int``; reject bools, floats and values below ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    number = int(value)
    if minimum is not None and number < minimum:
        kind = {0: "a non-negative integer", 1: "a positive integer"}.get(
            minimum, f"an integer >= {minimum}"
        )
        raise ValueError(f"{name} must be {kind}, got {number}")
    return number


def check_length(name: str, value: Any) -> int:
    """Return a count of positions ``0 .. value-1`` (a table size, a grid side) as an ``int``.

    Non-negative, and at most ``MAX_POSITION`` so that the last position lies
    strictly within ``MAX_POSITION`` of 0.
    """
    length = check_int(name, value, minimum=0)
    if length > MAX_POSITION:
        raise ValueError(
            f"{name} must be <= 2**31 = {MAX_POSITION} (positions 0 .. {name} - 1 lie strictly "
            f"within 2**31 of 0), got {length}"
        )
    return length


def check_even(name: str, value: Any, *, minimum: int = 2) -> int:
    """Return ``value`` as an ``int`` if it is even and at least ``minimum``."""
    number = check_int(name, value, minimum=minimum)
    if number % 2:
        raise ValueError(f"{name} must be an even integer >= {minimum}, got {number}")
    return number


def check_float(
    name: str, value: Any, *, positive: bool = False, minimum: float | None = None
) -> float:
    """Return ``value`` as a finite ``float``, optionally requiring ``> 0`` or ``>= minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    number = float(value)
    if number != number or number in (float("inf"), float("-inf")):
        raise ValueError(f"{name} must be finite, got {number}")
    if positive and number <= 0:
        raise ValueError(f"{name} must be > 0, got {number}")
    if minimum is not None and number < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {number}")
    return number


def check_choice(name: str, value: Any, choices: Iterable[str]) -> str:
    """Return ``value`` if it is one of ``choices``."""
    allowed = tuple(choices)
    if not isinstance(value, str) or value not in allowed:
        listed = ", ".join(repr(c) for c in allowed)
        raise ValueError(f"{name} must be one of {listed}, got {value!r}")
    return value


def check_tensor(name: str, value: Any, *, min_dim: int = 0) -> torch.Tensor:
    """Return ``value`` if it is a tensor with at least ``min_dim`` dimensions."""
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.dim() < min_dim:
        raise ValueError(
            f"{name} must have at least {min_dim} dimensions, got shape {tuple(value.shape)}"
        )
    return value


def check_floating(name: str, value: Any, *, min_dim: int = 0) -> torch.Tensor:
    """Return ``value`` if it is a floating-point tensor with at least ``min_dim`` dimensions."""
    t = check_tensor(name, value, min_dim=min_dim)
    if not t.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got dtype {t.dtype}")
    return t


def as_positions(
    name: str, value: Any, *, device: Device = None, limit: int | None = MAX_POSITION
) -> torch.Tensor:
    """Return integer positions as an ``int64`` tensor on ``device``.

    Accepts an integer tensor, or a sequence/range of Python ints.  Float
    positions are rejected: a position is an index, and silently truncating
    ``2.7`` to ``2`` would hide a bug in the caller.  Every value must lie
    strictly within ``limit`` of 0 (:func:`check_position_range`); a tensor's
    values are checked when they can be read (not while tracing, not for meta
    tensors), Python ints always, before any tensor is built.  ``limit=None``
    checks only that the values fit in int64.
    """
    bound = _INT64 if limit is None else limit
    if isinstance(value, torch.Tensor):
        if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
            raise TypeError(f"{name} must hold integers, got dtype {value.dtype}")
        t = value.to(device=device if device is not None else value.device, dtype=torch.int64)
        if limit is not None:
            check_position_values(name, t, limit=limit)
        return t
    if isinstance(value, range):
        if len(value):
            check_position_range(name, min(value[0], value[-1]), max(value[0], value[-1]), bound)
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
    if items:
        check_position_range(name, int(min(items)), int(max(items)), bound)
    return torch.tensor(items, dtype=torch.int64, device=device)


def check_position_range(name: str, lo: int, hi: int, limit: int = MAX_POSITION) -> None:
    """Raise unless every position from ``lo`` to ``hi`` lies strictly within ``limit`` of 0.

    The one bound on positions: :func:`as_positions`, :func:`check_position_values`,
    :func:`check_offset` and the modules' offsets all end here.  ``limit`` is
    a power of two (``MAX_POSITION``, ``MAX_DISTANCE`` or ``2**63``).
    """
    if lo <= -limit or hi >= limit:
        got = f"{lo}" if lo == hi else f"values from {lo} to {hi}"
        raise ValueError(
            f"{name} must lie strictly within 2**{limit.bit_length() - 1} = {limit} of 0, got {got}"
        )


def beyond_limit(positions: torch.Tensor, limit: int = MAX_POSITION) -> torch.Tensor:
    """Boolean tensor: where ``positions`` lie ``limit`` or more from 0.

    For traced code, which cannot raise on values: poison those outputs (NaN)
    instead of returning a silently wrong number.
    """
    return (positions <= -limit) | (positions >= limit)


def check_float_dtype(name: str, dtype: Any) -> torch.dtype:
    """Return ``dtype`` if it is a floating-point ``torch.dtype``."""
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"{name} must be a floating-point torch.dtype, got {dtype!r}")
    return dtype


def check_heads(
    owner: str, q: torch.Tensor, num_heads: int, *, head_dim: int | None = None
) -> None:
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


def check_offset(q_len: int, k_len: int, q_offset: Any, *, causal: bool) -> int:
    """Return the position of the first query among the keys (default ``k_len - q_len``).

    With ``causal=True`` the offset must be >= 0 (else the first query sees no
    key).  Every query position ``q_offset .. q_offset + q_len - 1`` must lie
    strictly within ``MAX_POSITION`` of 0.
    """
    if q_offset is None:
        offset = k_len - q_len
        if causal and offset < 0:
            raise ValueError(
                f"a causal mask needs q_len <= k_len when q_offset is not given "
                f"(queries align with the last keys), got q_len={q_len}, k_len={k_len}"
            )
    else:
        offset = check_int("q_offset", q_offset)
        if causal and offset < 0:
            raise ValueError(f"q_offset must be >= 0 with causal=True, got {offset}")
    try:
        check_position_range("q_offset", offset, offset + q_len - 1)
    except ValueError:
        raise ValueError(
            f"q_offset must keep every query position q_offset .. q_offset + q_len - 1 strictly "
            f"within 2**31 = {MAX_POSITION} of 0, got q_offset={offset} with q_len={q_len}"
        ) from None
    return offset


def check_position_values(name: str, positions: torch.Tensor, *, limit: int = MAX_POSITION) -> None:
    """Raise if a position lies ``limit`` or more from 0 (when values are readable).

    One host read (min and max together); nothing while tracing or for meta
    tensors, where :func:`beyond_limit` lets the caller poison the output.
    """
    if positions.numel() and has_values(positions):
        lo, hi = torch.stack(torch.aminmax(positions)).tolist()
        check_position_range(name, lo, hi, limit)


def check_mask(name: str, value: Any, q: torch.Tensor, k_len: int) -> torch.Tensor:
    """Return a caller's mask or bias for scores ``(*q.shape[:-2], q_len, k_len)``.

    A boolean tensor is a keep-mask, a floating one is additive; other dtypes
    are refused.  The shape is ``(q_len, k_len)`` or has one axis per score
    axis, each of size 1 or equal; a 3-D tensor with 4-D ``q`` is refused as
    ambiguous.  With more than 4 score axes, the batch axes are merged as
    :func:`posenc.attention` merges those of ``q``.
    """
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    t: torch.Tensor = value
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


def check_build_args(
    num_heads: Any, head_dim: Any, max_len: Any, causal: Any
) -> tuple[int, int, int | None]:
    """``(num_heads, head_dim, max_len)`` of a scheme's ``build``, checked under those names."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__} {causal!r}")
    heads = check_int("num_heads", num_heads, minimum=1)
    dim = check_int("head_dim", head_dim, minimum=1)
    length = None if max_len is None else check_int("max_len", max_len, minimum=1)
    return heads, dim, length


def warn_caller(message: str, category: type[Warning]) -> None:
    """``warnings.warn`` attributed to the first frame outside posenc: the user's call."""
    import os
    import sys
    import types
    import warnings

    package = os.path.dirname(os.path.abspath(__file__))
    # stacklevel 1 is this function, 2 its caller (frame 1), ...
    level = 2
    frame: types.FrameType | None = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(package):
        level, frame = level + 1, frame.f_back
    warnings.warn(message, category, stacklevel=level)
