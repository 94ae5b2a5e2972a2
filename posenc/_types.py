"""Type aliases of the public signatures (what users' type checkers see).

Runtime objects, not strings: the reference (Sphinx) evaluates a signature's annotations
and shows what an alias stands for.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias, Union

import torch

__all__: list[str] = []  # private module

#: Integer positions: an integer tensor, a ``range`` or a sequence of Python ints.
Positions: TypeAlias = Union[torch.Tensor, range, Sequence[int]]  # noqa: UP007
#: Where a tensor lives: a ``torch.device``, its name (``"cpu"``, ``"cuda:0"``), an index.
Device: TypeAlias = Union[torch.device, str, int, None]  # noqa: UP007
#: A FlexAttention score modification ``f(score, b, h, q_idx, k_idx) -> score``.
ScoreMod: TypeAlias = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
