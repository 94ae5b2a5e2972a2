"""Stick-breaking attention (Tan, Yang, Courville, Panda and Shen, ICLR 2025).

:cite:t:`tan2025stickbreaking` replace the softmax by a stick-breaking process.
Each query ``i`` gives every visible key ``j`` a break point ``beta_ij =
sigmoid(z_ij)``, ``z_ij = scale * q_i . k_j`` (``scale = 1 / sqrt(d)``, no
bias).  Walking from the nearest key back to the earliest, each key takes the
fraction ``beta_ij`` of what is left of a stick of length 1::

    A_ij = beta_ij * prod_{j < k < i} (1 - beta_ik)          attend_current=False
    A_ij = beta_ij * prod_{j < k <= i} (1 - beta_ik)         attend_current=True

so a key loses weight with every visible key between it and the query, and
order enters through the process itself: no positional encoding is added.  The
output is ``sum_j A_ij v_j``.

What the reference computes
---------------------------
Transcribed (the formula, not the code) from the authors' reference,
``stickbreaking_attention/sb_ref.py`` of github.com/shawntan/stickbreaking-attention,
commit ``3147a3841b025a31d271fc8f873120ff6fa0461b``: ``log A = logsigmoid(z) +
(reverse cumulative sum of logsigmoid(-z) over the later visible keys)``, then
``exp``; masked keys neither take weight nor break the stick (their
``log(1 - beta)`` is replaced by 0).  Its tests (``tests/test_attn.py``,
``ref_fwd``) mask ``j >= i`` by default, ``j > i`` with ``attend_current=True``,
and the Triton kernel ``sb_attn`` defaults to ``attend_current=False``: strictly
earlier keys, the default here.

The leftover mass
-----------------
The weights of a row sum to ``1 - prod_j (1 - beta_ij) <= 1`` (the product over
the visible keys); the rest of the stick is *dropped*: the output is exactly
``weights @ v``, never renormalised.  The reference returns that leftover,
``1 - A.sum(-1)``, beside ``A @ v`` and leaves it to the caller; the
repository's tests add ``leftover * v_i`` (the query's own value), and models
built on it differ (some add it to the current value, some to a learned
vector).  That is a modelling choice outside attention: do it on the output,
``out + (1 - stickbreaking_weights(q, k).sum(-1))[..., None] * v``.  A query
with no visible key (the first token with ``attend_current=False``) gets
zero weights and the zero vector.

Masks, positions and a non-causal call
--------------------------------------
Masks are posenc's (see :func:`posenc.attention`): a key masked out (``False``
or ``-inf``) is removed from the process, so masking equals dropping the key;
a finite additive mask or bias is added to ``z``.  With ``causal=True`` (the
paper's setting) the visible keys are ``j < q_offset + i``, or ``j <= q_offset
+ i`` with ``attend_current=True``, by index as posenc's causal mask.  The
paper defines only that case.  ``causal=False`` is posenc's extension, the
reference formula with a mask that hides nothing: every unmasked key takes
part, broken from the last key back to the first; with
``attend_current=False`` the key at the query's own position
(``k_position == q_position``) is left out, so a query aligned with the last
key of a cache gets the causal result either way.  Positions play no other
part.

Cost
----
Eager, in log space: ``log beta = logsigmoid(z)``, ``log(1 - beta) =
logsigmoid(-z)``, a reverse cumulative sum over the keys, then ``exp`` (a
weight underflows to 0 rather than becoming NaN, for any finite ``z``).  It
materialises several ``(batch, heads, q_len, k_len)`` tensors: O(q_len *
k_len) memory and time, like explicit softmax attention; no FlexAttention form
(it is not a softmax).  Computed in float32 for half, bfloat16 and float32
inputs (float64 in float64) and rounded once at the end.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ._checks import check_build_args
from .attend import attention, attention_weights
from .context import CallContext
from .scheme import PositionalScheme
from .sdpa import dot_scores, repeat_kv

__all__ = ["StickBreakingAttention", "stickbreaking_attention", "stickbreaking_weights"]


def _check_bool(name: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def _visible_and_logits(
    q: torch.Tensor, k: torch.Tensor, ctx: CallContext, attend_current: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(visible, z)``: which keys take part, ``(b|1, h|1, q_len, k_len)``, and the logits."""
    z = dot_scores(q, k, ctx.scale)  # float32 at least, float64 stays
    qi = torch.arange(ctx.q_len, device=z.device)[:, None]
    kj = torch.arange(ctx.k_len, device=z.device)[None, :]
    if ctx.causal:  # by index, as posenc's causal mask
        visible = kj < qi + ctx.q_offset + (1 if attend_current else 0)
    elif attend_current:
        visible = torch.ones(ctx.q_len, ctx.k_len, dtype=torch.bool, device=z.device)
    else:  # leave out the query's own token, found by position
        own = ctx.q_positions[..., :, None] == ctx.k_positions[..., None, :]
        visible = ~(own[:, None] if own.dim() == 3 else own)
    mask = ctx.mask
    if mask is not None:
        if mask.dtype == torch.bool:
            visible = visible & mask
        else:  # -inf removes the key; a finite value is added to the logit
            keep = mask != float("-inf")
            visible = visible & keep
            z = z + torch.where(keep, mask.to(z.dtype), 0.0)
    return visible, z


def _weights(
    q: torch.Tensor, k: torch.Tensor, ctx: CallContext, attend_current: bool
) -> torch.Tensor:
    """The stick-breaking weights in float32 at least (float64 for float64 inputs)."""
    visible, z = _visible_and_logits(q, k, ctx, attend_current)
    log_beta = F.logsigmoid(z)
    # masked keys do not break the stick: log(1 - beta) = 0 there
    log_rest = torch.where(visible, F.logsigmoid(-z), 0.0)
    # sum over the keys after j: a reverse cumulative sum, shifted by one key (no
    # subtraction, so a small sum keeps its digits beside a large log(1 - beta_ij))
    after = log_rest[..., 1:].flip(-1).cumsum(-1).flip(-1)
    after = torch.cat([after, torch.zeros_like(log_rest[..., :1])], dim=-1)
    return torch.where(visible, log_beta + after, float("-inf")).exp()


class StickBreakingAttention(PositionalScheme):
    """Stick-breaking attention of :cite:t:`tan2025stickbreaking`, as a :class:`PositionalScheme`.

    Replaces the softmax (the ``attend`` hook): ``A_ij = beta_ij * prod (1 -
    beta_ik)`` over the visible keys ``k`` between ``j`` and the query, with
    ``beta = sigmoid(scale * q . k)``; see the module docstring for the
    conventions (leftover mass dropped, masks, ``causal=False``).  Use it as
    ``posenc.attention(q, k, v, encoding=StickBreakingAttention(), causal=True)``;
    the weights come from ``posenc.attention_weights``.  No parameters; it
    serves any number of heads.  A decoder passes ``causal=True``, as in the
    paper.

    Parameters
    ----------
    attend_current
        ``False`` (default, as the authors' kernel): a query sees the strictly
        earlier keys, ``j < i``, so the first token attends to nothing.
        ``True``: the query's own key too, ``j <= i``, which breaks the stick
        first.

    Notes
    -----
    Rows sum to at most 1 (``weights_sum_to_one`` is false); the output is
    exactly ``weights @ v``.  Memory O(q_len * k_len) (``quadratic_memory``);
    ``backend="flex"`` refuses it.

    Examples
    --------
    Three keys with equal logits ``z``: each earlier key keeps ``1 - beta`` less.

    >>> import torch, posenc
    >>> sb = posenc.StickBreakingAttention()
    >>> q = torch.ones(1, 1, 4, 1, dtype=torch.float64)   # z = 1 for every pair
    >>> w = posenc.attention_weights(q, q, encoding=sb, causal=True)
    >>> b = torch.sigmoid(torch.tensor(1.0, dtype=torch.float64))
    >>> torch.allclose(w[0, 0, 3], torch.stack([b * (1 - b) ** 2, b * (1 - b), b, 0 * b]))
    True
    >>> w[0, 0, 0].tolist()        # the first token sees no earlier key
    [0.0, 0.0, 0.0, 0.0]
    """

    quadratic_memory = True
    reference = "tan2025stickbreaking"
    weights_sum_to_one = False

    def __init__(self, *, attend_current: bool = False):
        super().__init__()
        self.attend_current = _check_bool("attend_current", attend_current)

    @classmethod
    def build(
        cls,
        num_heads: int,
        head_dim: int,
        *,
        max_len: int | None = None,
        causal: bool = True,
        **options: Any,
    ) -> StickBreakingAttention:
        """An instance (no parameters, any ``num_heads`` and ``head_dim``); ``options`` go to it.

        Parameters
        ----------
        num_heads, head_dim, max_len, causal
            Checked as for every scheme; stick-breaking needs none of them.
        **options
            ``attend_current``.

        Returns
        -------
        StickBreakingAttention
        """
        check_build_args(num_heads, head_dim, max_len, causal)
        return cls(**options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """The default (strictly earlier keys) and ``attend_current=True``."""
        return {"": cls(), "attend_current": cls(attend_current=True)}

    def weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """Stick-breaking weights ``(batch, heads, q_len, k_len)`` in ``q``'s dtype (rows <= 1)."""
        return _weights(q, k, ctx, self.attend_current).to(q.dtype)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        """``weights @ v`` ``(batch, heads, q_len, d_v)``; the leftover mass is dropped."""
        w = _weights(q, k, ctx, self.attend_current)
        return (w @ repeat_kv(v, q.shape[-3]).to(w.dtype)).to(v.dtype)

    def extra_repr(self) -> str:
        return f"attend_current={self.attend_current}"


def stickbreaking_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    attend_current: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """Causal stick-breaking attention, ``sum_j A_ij v_j`` (the leftover mass dropped).

    ``posenc.attention(q, k, v, encoding=StickBreakingAttention(attend_current=...),
    causal=True, scale=scale)``; for masks or explicit positions call that.

    Parameters
    ----------
    q
        Queries ``(batch, heads, q_len, d)``.
    k, v
        Keys ``(batch, kv_heads, k_len, d)`` and values ``(batch, kv_heads,
        k_len, d_v)``, ``kv_heads`` dividing ``heads`` (grouped-query
        attention); ``q_len <= k_len``, the queries being the last
        ``q_len`` tokens (decoding with a cache).  Fewer dimensions are
        accepted as in :func:`posenc.attention`.
    attend_current
        Whether query ``i`` also sees key ``i`` (default ``False``: strictly
        earlier keys, as the authors' kernel).
    scale
        Multiplier of ``q . k`` in ``beta = sigmoid(scale * q . k)``; default
        ``1 / sqrt(d)``.

    Returns
    -------
    Tensor ``(batch, heads, q_len, d_v)`` in ``q``'s dtype, computed in float32
    at least (float64 stays float64).  Memory O(q_len * k_len).

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(2, 4, 6, 16, generator=g)
    >>> k, v = torch.randn(2, 2, 2, 6, 16, generator=g)      # 2 key/value heads
    >>> out = posenc.stickbreaking_attention(q, k, v)
    >>> out.shape
    torch.Size([2, 4, 6, 16])
    >>> w = posenc.stickbreaking_weights(q, k)
    >>> torch.allclose(out, w @ v.repeat_interleave(2, dim=1), atol=1e-6)
    True
    >>> bool((w.sum(-1) <= 1).all())                         # the leftover is dropped
    True
    """
    attend_current = _check_bool("attend_current", attend_current)
    scheme = StickBreakingAttention(attend_current=attend_current)
    return attention(q, k, v, encoding=scheme, causal=True, scale=scale, backend="eager")


def stickbreaking_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    attend_current: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """The weights ``A`` of :func:`stickbreaking_attention`, ``(batch, heads, q_len, k_len)``.

    Parameters
    ----------
    q, k
        As for :func:`stickbreaking_attention`.
    attend_current, scale
        As for :func:`stickbreaking_attention`.

    Returns
    -------
    Tensor ``(batch, heads, q_len, k_len)`` in ``q``'s dtype; zero on and above
    the diagonal (on it too with ``attend_current=False``), rows summing to
    ``1 - prod_j (1 - beta_ij) <= 1``.

    Examples
    --------
    The leftover of a row is the product of ``1 - beta`` over its keys:

    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k = torch.randn(2, 1, 1, 5, 8, generator=g, dtype=torch.float64)
    >>> w = posenc.stickbreaking_weights(q, k, attend_current=True)
    >>> beta = torch.sigmoid(q @ k.mT / 8**0.5).tril()
    >>> torch.allclose(1 - w.sum(-1), (1 - beta).prod(-1))
    True
    """
    attend_current = _check_bool("attend_current", attend_current)
    scheme = StickBreakingAttention(attend_current=attend_current)
    return attention_weights(q, k, encoding=scheme, causal=True, scale=scale)
