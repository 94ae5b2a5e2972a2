"""Relative position representations (Shaw, Uszkoreit and Vaswani, 2018).

Shaw et al. treat the sequence as a fully connected graph whose edge ``i -> j``
carries the label ``clip(j - i, -k, k)`` (relative position ``key - query``,
clipped at ``k = max_distance``), and learn two vectors per label, ``a^K`` and
``a^V`` of size ``head_dim``, shared across heads.  For query ``i``:

    e_ij  = (q_i . k_j + q_i . a^K_ij) / sqrt(d)
    z_i   = sum_j alpha_ij (v_j + a^V_ij),     alpha_i = softmax_j(e_ij)

Sec. 3.3 of the paper builds the relative tensor ``a^K_ij`` of shape
``(n, n, d)`` once, shared by every head and sequence of a batch, and
multiplies the queries (reshaped to ``(n, batch * heads, d)``) by it: O(n^2 d)
memory.  posenc does not build it; this is posenc's own computation, not the
paper's: ``q @ A^K.T`` is a ``(q_len, 2k+1)`` table, gathered into
``(q_len, k_len)`` by label; for the values, ``alpha`` is summed into the
``2k+1`` label bins, then one matmul with ``A^V``.  The scores themselves are
still O(q_len * k_len) per head.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._checks import check_build_args, check_int, check_offset
from ._types import Device, Positions
from .context import CallContext, as_context
from .scheme import PositionalScheme

if TYPE_CHECKING:
    from typing_extensions import Self
from .sdpa import dot_scores, repeat_kv, softmax_weights

__all__ = ["shaw_relative_indices", "ShawRelativeAttention"]


def _labels(
    q_positions: torch.Tensor, k_positions: torch.Tensor, max_distance: int
) -> torch.Tensor:
    """``clip(key - query, -k, k) + k``: an int64 ``(..., q_len, k_len)`` table in ``[0, 2k]``."""
    rel = k_positions[..., None, :] - q_positions[..., :, None]
    return rel.clamp(-max_distance, max_distance) + max_distance


def shaw_relative_indices(
    q_len: int,
    k_len: int,
    max_distance: int,
    *,
    q_offset: int | None = None,
    device: Device = None,
) -> torch.Tensor:
    """Edge labels of Shaw et al., ``clip(j - p_i, -k, k) + k``, shape ``(q_len, k_len)``.

    Key ``j`` sits at position ``j``; query ``i`` at ``p_i = q_offset + i`` with
    the default ``q_offset = k_len - q_len`` (queries aligned with the last
    keys).  The relative position is ``key - query``; label ``k`` means "same
    position", labels above ``k`` are keys after the query.

    Parameters
    ----------
    q_len, k_len
        Numbers of queries and keys (non-negative).
    max_distance
        The clipping distance ``k`` (non-negative); there are ``2k + 1`` labels.
    q_offset, device
        Position of the first query, and where to create the table.

    Returns
    -------
    ``int64`` tensor ``(q_len, k_len)`` with values in ``[0, 2 * max_distance]``.
    """
    q_len = check_int("q_len", q_len, minimum=0)
    k_len = check_int("k_len", k_len, minimum=0)
    max_distance = check_int("max_distance", max_distance, minimum=0)
    q_offset = check_offset(q_len, k_len, q_offset, causal=False)
    q_positions = torch.arange(q_len, device=device) + q_offset
    return _labels(q_positions, torch.arange(k_len, device=device), max_distance)


class ShawRelativeAttention(PositionalScheme):
    """Self-attention with learned relative key and value representations (Shaw et al., 2018).

    Parameters ``key_embeddings`` and ``value_embeddings`` have shape
    ``(2 * max_distance + 1, head_dim)``; row ``r`` belongs to relative position
    ``r - max_distance`` (``key - query``).  They are shared by every head and
    batch element, as in the paper.

    Use it as ``posenc.attention(q, k, v, encoding=shaw, causal=...)`` with
    ``q (..., q_len, head_dim)``, ``k (..., k_len, head_dim)`` and
    ``v (..., k_len, head_dim)`` (the value term needs ``d_v = head_dim``);
    ``k`` and ``v`` may have fewer heads than ``q`` (grouped-query attention),
    and per-sample positions ``(batch, len)`` give per-sample labels.
    ``scale`` (default ``1/sqrt(head_dim)``) multiplies both score terms.

    With ``values=True`` the scheme overrides ``attend`` (softmax computed
    explicitly, since SDPA cannot return the weights the value term needs);
    with ``values=False`` only the key term remains and it enters PyTorch's
    SDPA as an additive bias.  Masks go through the shared helpers of
    :mod:`posenc.sdpa` either way.  Either way the ``(..., q_len, k_len)`` scores
    are materialised (``quadratic_memory = True``); the ``(q_len, k_len,
    head_dim)`` relative tensors are not (see the module docstring).

    :func:`posenc.attention_weights` returns the softmax weights ``alpha``
    (key term included); the value term changes the output, not the weights.

    Parameters
    ----------
    head_dim
        Size of each head's queries, keys and values.
    max_distance
        Clipping distance ``k`` >= 1; relative positions beyond it share a label.
    values
        Learn ``a^V`` as well as ``a^K`` (the paper's full model).
    init_std
        Standard deviation of the normal initialisation; defaults to
        ``head_dim ** -0.5``.

    Examples
    --------
    >>> import torch, posenc
    >>> _ = torch.manual_seed(0)
    >>> shaw = posenc.ShawRelativeAttention(head_dim=8, max_distance=2)
    >>> shaw.key_embeddings.shape, shaw.value_embeddings.shape   # labels -2 .. 2
    (torch.Size([5, 8]), torch.Size([5, 8]))
    >>> posenc.shaw_relative_indices(4, 4, 2).tolist()   # row of each (query, key) pair
    [[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]]
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g)
    >>> posenc.attention(q, k, v, encoding=shaw, causal=True).shape
    torch.Size([1, 2, 6, 8])
    """

    quadratic_memory = True
    reference = "shaw2018self"

    value_embeddings: nn.Parameter | None  # None with values=False

    def __init__(
        self,
        head_dim: int,
        max_distance: int,
        *,
        values: bool = True,
        init_std: float | None = None,
    ) -> None:
        super().__init__()
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.max_distance = check_int("max_distance", max_distance, minimum=1)
        if not isinstance(values, bool):
            raise TypeError(f"values must be a bool, got {type(values).__name__}")
        std = self.head_dim**-0.5 if init_std is None else init_std
        labels = 2 * self.max_distance + 1
        self.key_embeddings = nn.Parameter(torch.randn(labels, self.head_dim) * std)
        if values:
            self.value_embeddings = nn.Parameter(torch.randn(labels, self.head_dim) * std)
        else:
            self.register_parameter("value_embeddings", None)

    def _check(self, q: torch.Tensor, v: torch.Tensor | None = None) -> None:
        if q.shape[-1] != self.head_dim:
            raise ValueError(
                f"q must have head_dim={self.head_dim} features, got shape {tuple(q.shape)}"
            )
        if v is not None and self.value_embeddings is not None and v.shape[-1] != self.head_dim:
            raise ValueError(
                f"v must have head_dim={self.head_dim} features for the value term, "
                f"got shape {tuple(v.shape)}"
            )

    def _key_term(
        self, q: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``q_i . a^K_ij`` as ``(batch, heads, q_len, k_len)``: a small matmul, then a gather.

        Also returns the labels, expanded to the same shape.
        """
        labels = _labels(q_positions, k_positions, self.max_distance).unsqueeze(-3)
        per_label = q @ self.key_embeddings.to(q.dtype).T  # (batch, heads, q_len, 2k+1)
        labels = labels.expand(*per_label.shape[:-1], labels.shape[-1])
        return torch.gather(per_label, -1, labels), labels

    # per instance, as PositionalScheme allows where an option changes it (a read-only property
    # where the base class has a plain class attribute)
    @property
    def output_is_weights_times_v(self) -> bool:  # type: ignore[override]
        return self.value_embeddings is None  # the value term adds to weights @ v

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
        """Clipping distance ``max_distance`` 16 unless given."""
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        options.setdefault("max_distance", 16)
        return cls(head_dim, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """The full model and the key term alone (an additive bias on the SDPA path)."""
        return {"": cls(head_dim, 3), "key": cls(head_dim, 3, values=False)}

    def bias(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        ctx: CallContext | Positions,
        *legacy: Positions | float | None,
    ) -> torch.Tensor:
        """``scale * q_i . a^K_ij`` ``(batch, heads, q_len, k_len)``; or the old 5-argument form."""
        ctx = as_context(q, k, ctx, *legacy, hook=f"{type(self).__name__}.bias")
        self._check(q)
        return ctx.scale * self._key_term(q, ctx.q_positions, ctx.k_positions)[0]

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        self._check(q, v)
        if self.value_embeddings is None:
            return super().attend(q, k, v, ctx)
        scale, q_positions, k_positions = ctx.scale, ctx.q_positions, ctx.k_positions
        out_dtype = q.dtype
        # Softmax in float32 at least; half-precision inputs are promoted, then cast back.
        work = torch.promote_types(q.dtype, torch.float32)
        q = q.to(work)
        key_term, labels = self._key_term(q, q_positions, k_positions)
        logits = dot_scores(q, k, scale) + scale * key_term
        alpha = softmax_weights(logits, mask=ctx.mask, causal=ctx.causal, q_offset=ctx.q_offset)
        # Sum alpha_ij into its label's bin: (..., q_len, 2k+1), then one matmul with A^V.
        bins = alpha.new_zeros(*alpha.shape[:-1], self.key_embeddings.shape[0])
        bins = bins.scatter_add(-1, labels, alpha)
        v = repeat_kv(v, q.shape[-3]).to(work)
        out = alpha @ v + bins @ self.value_embeddings.to(work)
        return out.to(out_dtype)

    # weights: the default (bias hook, explicit softmax) is alpha, whatever ``values`` is;
    # the value term shifts the output, not the weights.

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, max_distance={self.max_distance}, "
            f"values={self.value_embeddings is not None}"
        )
