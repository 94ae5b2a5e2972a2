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

__all__: list[str] = []  # private module


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
