"""Learned absolute position tables (as in BERT and GPT-2).

A learned encoding is a trainable matrix with one row per position, looked up
by index and added to the token embeddings (Devlin et al., 2019; Radford et
al., 2019; earlier Gehring et al., 2017).  It is as expressive as a table can
be, but it knows nothing about rows it was never trained on and nothing at all
past its last row: :class:`LearnedEmbedding` refuses such positions instead of
failing with an opaque index error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import (
    as_positions,
    check_build_args,
    check_float,
    check_float_dtype,
    check_int,
)
from ._runtime import has_values
from ._types import Device, Positions

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["LearnedEmbedding"]


class LearnedEmbedding(nn.Module):
    """A trainable ``(max_positions, dim)`` position table.

    Parameters
    ----------
    max_positions
        Number of rows: positions ``0 .. max_positions-1`` exist, nothing else.
    dim
        Feature size (any positive integer).
    init_std
        Rows are initialised i.i.d. from ``N(0, init_std**2)``.  The default
        0.02 is the ``initializer_range`` of the reference BERT and GPT-2
        configurations (BERT truncates the normal at two standard deviations;
        the difference is immaterial here).
    device, dtype
        Of the parameter ``weight``; float32 by default.

    Notes
    -----
    ``forward(positions)`` returns ``weight[positions]`` with shape
    ``(*positions.shape, dim)``; ``forward(seq_len)`` (an ``int``) returns rows
    ``offset .. offset+seq_len-1``, ``(seq_len, dim)``.  Add the result to
    token embeddings ``(..., seq, dim)``.  Positions outside
    ``[0, max_positions)`` raise ``ValueError``; under ``torch.compile`` or
    ``torch.export``, where the values cannot be read while tracing, the
    lookup's own bounds check raises a ``RuntimeError`` instead (a negative
    position never wraps around to the last rows).

    In :data:`posenc.SCHEMES` it is ``"learned"``, a scheme that acts on the
    input (``acts_on = "input"``): a model adds :meth:`encode` ``(positions)``
    to its token embeddings.

    Examples
    --------
    >>> import torch, posenc
    >>> _ = torch.manual_seed(0)
    >>> table = posenc.LearnedEmbedding(max_positions=16, dim=8)
    >>> table(4).shape                          # rows 0 .. 3
    torch.Size([4, 8])
    >>> torch.equal(table(torch.tensor([[2, 3]])), table.weight[None, 2:4])
    True
    >>> table(torch.tensor([16]))
    Traceback (most recent call last):
    ...
    ValueError: position 16 is past the learned table: max_positions=16 allows positions 0..15; ...
    """

    # registry metadata (posenc.SCHEMES): a table added to the input embeddings
    acts_on = "input"
    quadratic_memory = False
    reference = "gehring2017convs2s"
    shared_across_layers = False

    @classmethod
    def build(
        cls,
        num_heads: int,
        head_dim: int,
        *,
        max_len: int | None = None,
        causal: bool = True,
        **options: Any,
    ) -> Self:
        """A ``(max_len, num_heads * head_dim)`` table (``max_len`` 512 if not given)."""
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        return cls(512 if max_len is None else max_len, num_heads * head_dim, **options)

    def __init__(
        self,
        max_positions: int,
        dim: int,
        *,
        init_std: float = 0.02,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        self.max_positions = check_int("max_positions", max_positions, minimum=1)
        self.dim = check_int("dim", dim, minimum=1)
        self.init_std = check_float("init_std", init_std, minimum=0.0)
        dtype = check_float_dtype("dtype", torch.float32 if dtype is None else dtype)
        self.weight = nn.Parameter(
            torch.empty(self.max_positions, self.dim, device=device, dtype=dtype)
        )
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Draw every row from ``N(0, init_std**2)`` (uses the global torch RNG)."""
        with torch.no_grad():
            self.weight.normal_(0.0, self.init_std)

    def forward(self, positions: Positions | int, *, offset: int = 0) -> torch.Tensor:
        """Rows of the table: ``(*positions.shape, dim)``, or ``(seq_len, dim)`` for an int."""
        if isinstance(positions, int) and not isinstance(positions, bool):
            seq_len = check_int("seq_len", positions, minimum=0)
            offset = check_int("offset", offset, minimum=0)
            if seq_len and offset + seq_len > self.max_positions:  # checked without tensors
                raise ValueError(
                    f"position {offset + seq_len - 1} is past the learned table: max_positions="
                    f"{self.max_positions} allows positions 0..{self.max_positions - 1}"
                )
            positions = torch.arange(offset, offset + seq_len, device=self.weight.device)
        else:
            positions = as_positions("positions", positions, device=self.weight.device)
        if positions.numel() and has_values(positions):
            lo, hi = (int(t) for t in torch.aminmax(positions))
            if lo < 0:
                raise ValueError(f"positions must be >= 0, got {lo}")
            if hi >= self.max_positions:
                raise ValueError(
                    f"position {hi} is past the learned table: max_positions={self.max_positions} "
                    f"allows positions 0..{self.max_positions - 1}; a learned table has no rows "
                    "beyond the length it was built for"
                )
        # F.embedding, not weight[positions]: indexing would wrap a negative position
        return F.embedding(positions, self.weight)

    def encode(self, positions: Positions) -> torch.Tensor:
        """Rows for integer ``positions``: ``(*positions.shape, dim)`` (same as calling)."""
        rows: torch.Tensor = self(positions)  # nn.Module.__call__ is untyped
        return rows

    def extra_repr(self) -> str:
        return f"max_positions={self.max_positions}, dim={self.dim}, init_std={self.init_std}"
