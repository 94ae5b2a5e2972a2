"""Type aliases of the public signatures (what users' type checkers see)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

import torch

__all__: list[str] = []  # private module

#: Integer positions: an integer tensor, a ``range`` or a sequence of Python ints.
Positions: TypeAlias = "torch.Tensor | range | Sequence[int]"
#: Where a tensor lives: a ``torch.device``, its name (``"cpu"``, ``"cuda:0"``), an index.
Device: TypeAlias = "torch.device | str | int | None"
#: A FlexAttention score modification ``f(score, b, h, q_idx, k_idx) -> score``.
ScoreMod: TypeAlias = (
    "Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]"  # noqa: E501
)
