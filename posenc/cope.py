"""CoPE: contextual position encoding (Golovneva et al., 2024).

CoPE lets each query decide what to count.  Query ``i`` gates every key it
sees, ``g_ij = sigmoid(scale * q_i . k_j)``, and the position of key ``j``
relative to query ``i`` is the number of gated keys from ``j`` to ``i``:

    p_ij = sum_{t = j .. i} g_it              (fractional, >= 0)

A learned table of ``max_positions`` vectors ``e[0] .. e[P-1]`` (``head_dim``
wide) is interpolated at ``p_ij``, clamped to ``P - 1``:

    e(p) = (1 - w) e[floor(p)] + w e[ceil(p)],    w = p - floor(p)

and the score becomes ``scale * q_i . (k_j + e(p_ij))``.  With every gate at 1,
``p_ij = i - j + 1``: relative positions, counted inclusively.

Conventions from the released code (``facebookresearch/RAM``, ``projects/cope``)
-------------------------------------------------------------------------------
* gates use the *scaled* logits, ``sigmoid(q . k / sqrt(d))`` (``scale`` in
  posenc), and the position term is scaled with the content term,
  ``(q . k + q . e(p)) / sqrt(d)`` (the released default, the paper's
  ``q_i^T (k_j + e[p_ij])``);
* one table per layer, shared by the heads (each head has its own gates);
  it starts at zero, so an untrained CoPE changes nothing;
* interpolation is done on the logits: ``q . e[p]`` for every integer ``p``
  (a ``(q_len, P)`` product), then the two neighbours of each fractional
  ``p_ij`` are gathered and mixed, which is the same by linearity; the
  gradient reaches the gates through ``w`` only;
* a masked key (padding, the causal mask, any ``-inf`` of the caller's mask)
  has gate 0 and is not counted; finite values of the caller's mask or bias
  change the attention scores, not the gates;
* the count runs from key ``j`` to the last visible key (a reverse cumulative
  sum along the keys): ``t = j .. i`` under a causal mask, every later visible
  key without one (bidirectional use, as in the released code's encoder).

Token positions play no part: CoPE reads the order of the keys in ``k``
(oldest first) and which of them are visible, so ``q_positions`` and
``k_positions`` are ignored.

Paths: the positions of a query depend on the gates of every key between
``j`` and ``i``, a cumulative sum along the key axis that no FlexAttention
``score_mod`` (one score at a time) can compute.  CoPE therefore replaces
attention (its own ``attend``: explicit logits, then the shared softmax and
masks) and runs on the eager path only, with O(batch * heads * q_len * k_len)
memory for the logits, gates and positions; ``backend="flex"`` raises
``ValueError`` ("CoPE replaces attention") and ``"auto"`` takes the eager path.
Decoding through :class:`posenc.KVCache` gives the full pass's rows: the new
query's gates over the cached keys give the same counts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._checks import check_build_args, check_int
from .context import CallContext
from .masks import causal_mask
from .scheme import PositionalScheme
from .sdpa import dot_scores, repeat_kv, softmax_weights

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["CoPE"]


class CoPE(PositionalScheme):
    """Contextual positions counted by gates, with an interpolated table (Golovneva et al., 2024).

    Parameters
    ----------
    num_heads
        Number of query heads; each head computes its own gates.  Keys may
        have fewer heads (grouped-query attention).
    head_dim
        Size ``d`` of queries and keys, and of each table vector ``e[p]``.
    max_positions
        Number ``P`` of table vectors ``e[0] .. e[P-1]``; contextual positions
        are clamped to ``P - 1``.  The released code uses the training
        length + 1 (every count up to the length has its own vector).

    Attributes
    ----------
    pos_emb
        The learnable table ``e``, ``(max_positions, head_dim)``, initialised
        to zero as in the released code.

    Examples
    --------
    >>> import torch, posenc
    >>> cope = posenc.CoPE(num_heads=2, head_dim=8, max_positions=16)
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 6, 8, generator=g, dtype=torch.float64)
    >>> out = posenc.attention(q, k, v, encoding=cope, causal=True)
    >>> out.shape
    torch.Size([1, 2, 6, 8])
    >>> torch.allclose(out, posenc.attention(q, k, v, causal=True))   # the table starts at zero
    True
    """

    quadratic_memory = True
    reference = "golovneva2024cope"

    def __init__(self, num_heads: int, head_dim: int, max_positions: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.max_positions = check_int("max_positions", max_positions, minimum=1)
        self.pos_emb = nn.Parameter(torch.zeros(self.max_positions, self.head_dim))

    def _check(self, q: torch.Tensor) -> None:
        if q.shape[-1] != self.head_dim or q.shape[-3] != self.num_heads:
            raise ValueError(
                f"q must have num_heads={self.num_heads} heads of head_dim={self.head_dim} "
                f"features for {type(self).__name__}({self.num_heads}, {self.head_dim}, "
                f"{self.max_positions}), "
                f"got shape {tuple(q.shape)} (batch, heads, len, head_dim)"
            )

    @staticmethod
    def _visible(ctx: CallContext) -> torch.Tensor | None:
        """Boolean ``(batch|1, heads|1, q_len, k_len)``: the keys each query sees, or ``None``."""
        seen: torch.Tensor | None = None
        if ctx.mask is not None:
            seen = ctx.mask if ctx.mask.dtype == torch.bool else ctx.mask != float("-inf")
        if ctx.causal and ctx.q_offset < ctx.k_len - 1:
            keep = causal_mask(ctx.q_len, ctx.k_len, ctx.q_offset, device=ctx.device)
            seen = keep if seen is None else seen & keep
        return seen

    def positions(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """Contextual positions ``p_ij``, ``(batch, heads, q_len, k_len)``, before clamping.

        ``q`` ``(batch, heads, q_len, d)`` and ``k`` ``(batch, kv_heads, k_len, d)``;
        masked keys have gate 0.  Float32 at least (float64 for float64).
        """
        return self._positions(self._dots(q, k), ctx)

    def _dots(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """``q . k`` in the working dtype (float32 at least, and the table's)."""
        work = torch.promote_types(q.dtype, self.pos_emb.dtype)
        return dot_scores(q.to(work), k, 1.0)

    def _positions(self, dots: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        gates = torch.sigmoid(ctx.scale * dots)
        visible = self._visible(ctx)
        if visible is not None:
            gates = gates * visible
        # p_ij = the gates summed from key j to the last key: a reverse cumulative sum
        return gates.flip(-1).cumsum(-1).flip(-1)

    def logits(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """``scale * q_i . (k_j + e(p_ij))``, ``(batch, heads, q_len, k_len)``, before masking."""
        self._check(q)
        dots = self._dots(q, k)
        p = self._positions(dots, ctx).clamp(max=self.max_positions - 1)
        at_integers = q.to(p.dtype) @ self.pos_emb.to(p.dtype).t()  # q_i . e[n], n < P
        below = p.detach().floor()
        weight = p - below  # the gradient reaches the gates through this weight only
        below = below.long()
        low = at_integers.gather(-1, below)
        high = at_integers.gather(-1, (below + 1).clamp(max=self.max_positions - 1))
        return ctx.scale * (dots + low + weight * (high - low))

    def weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """The softmax of :meth:`logits` under the call's masks, in ``q``'s dtype."""
        w = softmax_weights(
            self.logits(q, k, ctx), mask=ctx.mask, causal=ctx.causal, q_offset=ctx.q_offset
        )
        return w.to(q.dtype)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        """``weights @ v``, ``(batch, heads, q_len, d_v)``."""
        w = softmax_weights(
            self.logits(q, k, ctx), mask=ctx.mask, causal=ctx.causal, q_offset=ctx.q_offset
        )
        return (w @ repeat_kv(v, q.shape[-3]).to(w.dtype)).to(q.dtype)

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
        """``max_positions = max_len + 1`` (the released code's default); 65 without ``max_len``."""
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        options.setdefault("max_positions", 65 if max_len is None else max_len + 1)
        return cls(num_heads, head_dim, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """A random table, short enough (``P = 4``) that long rows are clamped."""
        g = torch.Generator().manual_seed(0)
        cope = cls(num_heads, head_dim, 4)
        with torch.no_grad():
            cope.pos_emb.copy_(torch.randn(cope.pos_emb.shape, generator=g))
        return {"": cope}

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"max_positions={self.max_positions}"
        )
