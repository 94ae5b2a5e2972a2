"""DA-Transformer: distance-aware attention (Wu, Wu and Huang, 2021).

:cite:t:`wu2021da` rescale attention by the real token distance.  Head ``h``
weights the distance with a learnable scalar ``w_h``, ``R_ij = w_h |i - j|``
(``w_h > 0`` favours far tokens, ``w_h < 0`` near ones), and maps it through a
learnable sigmoid with its own scalar ``v_h``::

    f(x; v) = (1 + e^v) / (1 + e^(v - x))

so that ``f(0) = 1`` (distance zero changes nothing), ``f -> 0`` as
``x -> -inf``, ``f < 1 + e^v`` and ``f`` increases with ``x``.  The rescaled
coefficients ``R^_ij = f(R_ij; v_h)`` multiply the ReLU'd raw scores, and a
softmax turns the result into weights (the paper's attention matrix)::

    A = softmax(ReLU(Q K^T) * R^ / sqrt(d))                     normalize="softmax"

The ReLU is there because a score can have either sign: multiplying a negative
score by a larger coefficient would push it *down*, the opposite of what the
coefficient means.  After the ReLU every key with a non-positive score gets the
logit 0, so it keeps a share of the attention (``e^0`` against ``e^{logit}``);
only positive scores are amplified or damped by distance.

``normalize="row_sum"`` keeps an earlier form of this module, which drops the
softmax and divides by the row sum instead::

    A_ij = ReLU(s_ij) * R^_ij / sum_j' ReLU(s_ij') * R^_ij'     normalize="row_sum"

It is *not* the paper's model: keys with a non-positive score get weight
exactly 0 (sparse weights), and ``scale`` cancels (ReLU is positively
homogeneous).  A row whose scores are all ``<= 0`` then attends to nothing
(weights and output zero).  It is kept for models trained with it.
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_choice, check_float, check_floating, check_heads, check_int
from .context import CallContext
from .masks import merge_masks
from .scheme import PositionalScheme
from .sdpa import dot_scores, repeat_kv, softmax_weights

__all__ = ["learnable_sigmoid", "DAAttention"]

NORMALIZATIONS = ("softmax", "row_sum")


def learnable_sigmoid(x: torch.Tensor, v: torch.Tensor | float) -> torch.Tensor:
    """``(1 + e^v) / (1 + e^(v - x))``, the rescaling function of DA-Transformer.

    Computed as ``exp(softplus(v) - softplus(v - x))`` with
    ``softplus(t) = log(1 + e^t)`` evaluated by ``logaddexp(0, t)``, which never
    overflows and keeps ``f(0) = 1`` exactly (the two terms are then the same
    number).  PyTorch's ``F.softplus`` is not used: it switches to the identity
    above ``t = 20`` and would be off by ~1e-9 there.

    Parameters
    ----------
    x
        Floating-point tensor, any shape.
    v
        Tensor broadcastable with ``x``, or a float.

    Returns
    -------
    Tensor of the broadcast shape, in ``(0, 1 + e^v)``.
    """
    x = check_floating("x", x)
    v = torch.as_tensor(v, dtype=x.dtype, device=x.device)
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return torch.exp(torch.logaddexp(zero, v) - torch.logaddexp(zero, v - x))


class DAAttention(PositionalScheme):
    """Distance-aware attention of :cite:t:`wu2021da`, as a :class:`PositionalScheme`.

    Use it as ``posenc.attention(q, k, v, encoding=DAAttention(num_heads))`` or
    call the module, ``module(q, k, v, causal=..., q_offset=...)``; ``q`` and
    ``k`` have shape ``(..., num_heads, len, head_dim)``.  It replaces the
    whole attention computation (the ``attend`` hook) and materialises the
    ``(num_heads, q_len, k_len)`` coefficients and the weights: O(q_len * k_len)
    extra memory and time per head, as the paper notes.  The weights themselves
    come from ``posenc.attention_weights(q, k, encoding=module)``.

    Parameters
    ----------
    num_heads
        Number of heads; each has its own ``w`` and ``v``.
    w_init, v_init
        Initial values of every ``w_h`` and ``v_h``.  With ``w = 0`` every
        coefficient is 1 and the layer starts as ``softmax(ReLU(Q K^T) / sqrt(d))``.
    normalize
        ``"softmax"`` (default): the paper, ``softmax(ReLU(scale * Q K^T) * R^)``.
        ``"row_sum"``: ``ReLU(scale * Q K^T) * R^`` divided by its row sum, the
        form this module computed before; see the module docstring for how the
        two differ.

    Notes
    -----
    Queries sit at ``q_offset + i`` and keys at ``j`` (see
    :func:`posenc.attention`); the distance is ``|q_offset + i - j|``, or
    ``|p - s|`` for explicit (per-sample) positions.  Keys and values may have
    fewer heads than queries (grouped-query attention).  Masked entries
    (causal mask, ``False`` or ``-inf`` in ``mask`` or ``bias``) get weight zero.
    A finite additive mask or bias is added to the logits ``ReLU(scale * q.k) *
    R^`` with ``normalize="softmax"`` (as every scheme adds a bias to its
    logits), and to the scaled scores before the ReLU with ``normalize="row_sum"``.
    A query that sees no key (every key masked, or, with ``"row_sum"``, no
    positive score) gets zero weights and a zero output, never NaN.
    Half-precision inputs are computed in float32 and rounded once.

    Examples
    --------
    >>> import torch, posenc
    >>> da = posenc.DAAttention(4)          # w = 0: every coefficient is 1
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 4, 6, 8, generator=g, dtype=torch.float64)
    >>> out = posenc.attention(q, k, v, encoding=da, causal=True)
    >>> future = torch.ones(6, 6, dtype=torch.bool).triu(1)
    >>> logits = (q @ k.mT / 8**0.5).relu().masked_fill(future, float("-inf"))
    >>> torch.allclose(out, torch.softmax(logits, dim=-1) @ v)
    True
    """

    quadratic_memory = True
    reference = "wu2021da"

    def __init__(
        self,
        num_heads: int,
        *,
        w_init: float = 0.0,
        v_init: float = 0.0,
        normalize: str = "softmax",
    ):
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        w_init = check_float("w_init", w_init)
        v_init = check_float("v_init", v_init)
        self.normalize = check_choice("normalize", normalize, NORMALIZATIONS)
        self.w = nn.Parameter(torch.full((num_heads,), w_init))
        self.v = nn.Parameter(torch.full((num_heads,), v_init))

    def coefficients(
        self,
        q_positions: torch.Tensor,
        k_positions: torch.Tensor,
        dtype: torch.dtype = torch.float32,
    ) -> torch.Tensor:
        """``f(w_h |p - s|; v_h)`` for query positions ``p`` and key positions ``s``.

        Integer tensors ``(q_len,)`` and ``(k_len,)``; returns
        ``(num_heads, q_len, k_len)`` in ``dtype`` (float32 at least).
        Per-sample positions ``(batch, len)`` give ``(batch, num_heads, q_len, k_len)``.
        """
        work = torch.float64 if dtype == torch.float64 else torch.float32
        dist = (q_positions[..., :, None] - k_positions[..., None, :]).abs().to(work)
        w = self.w.to(work)[:, None, None]
        v = self.v.to(work)[:, None, None]
        return learnable_sigmoid(w * dist.unsqueeze(-3), v).to(dtype)

    # per instance, as PositionalScheme allows where an option changes it (a read-only property
    # where the base class has a plain class attribute)
    @property
    def weights_sum_to_one(self) -> bool:  # type: ignore[override]
        return self.normalize == "softmax"  # a row of ReLU scores may sum to zero

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """Both normalisations, with ``w`` and ``v`` spread over the heads."""
        out: dict[str, PositionalScheme] = {}
        for label, normalize in (("", "softmax"), ("row_sum", "row_sum")):
            m = cls(num_heads, normalize=normalize)
            with torch.no_grad():
                m.w.copy_(torch.linspace(-0.6, 0.4, num_heads))
                m.v.copy_(torch.linspace(1.0, -1.0, num_heads))
            out[label] = m
        return out

    def weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """Attention weights ``(batch, num_heads, q_len, k_len)``, per ``normalize``."""
        return self._weights(q, k, ctx).to(q.dtype)

    def _weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """The weights in float32 at least (float64 for float64 inputs)."""
        mask, causal, q_offset, scale = ctx.mask, ctx.causal, ctx.q_offset, ctx.scale
        q_positions, k_positions = ctx.q_positions, ctx.k_positions
        check_heads(f"{type(self).__name__}({self.num_heads})", q, self.num_heads)
        scores = dot_scores(q, k, scale)  # float32 at least; k repeated for grouped heads
        coef = self.coefficients(q_positions, k_positions, scores.dtype)
        if self.normalize == "softmax":  # the paper: the mask applies to the logits
            logits = torch.relu(scores) * coef
            return softmax_weights(logits, mask=mask, causal=causal, q_offset=q_offset)
        m = merge_masks(
            mask,
            None,
            causal=causal,
            q_offset=q_offset,
            q_len=scores.shape[-2],
            k_len=scores.shape[-1],
            dtype=scores.dtype,
            device=scores.device,
        )
        a = torch.relu(scores) * coef
        if m.mask is not None:
            if m.mask.dtype == torch.bool:
                keep = m.mask
            else:  # a finite additive term enters before the ReLU, -inf removes the key
                keep = m.mask != float("-inf")
                a = torch.relu(scores + torch.where(keep, m.mask, 0.0)) * coef
            a = a.masked_fill(~keep, 0.0)
        if m.seen is not None:
            a = torch.where(m.seen, a, 0.0)
        total = a.sum(-1, keepdim=True)
        # an all-zero row attends to nothing: divide by 1 there instead of 0
        return a / torch.where(total > 0, total, torch.ones_like(total))

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        """Distance-aware attention: ``weights @ v``, shape ``(batch, num_heads, q_len, d_v)``."""
        w = self._weights(q, k, ctx)
        return (w @ repeat_kv(v, q.shape[-3]).to(w.dtype)).to(v.dtype)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, normalize={self.normalize!r}"
