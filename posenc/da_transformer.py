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

from ._checks import check_choice, check_float, check_floating, check_int
from .scheme import PositionalScheme, attention, causal_mask, query_key_positions

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


class DAAttention(nn.Module, PositionalScheme):
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
    :mod:`posenc.scheme`); the distance is ``|q_offset + i - j|``.  Masked
    entries (causal mask, ``-inf`` or ``False`` in ``bias``) get weight zero.
    A finite additive ``bias`` is added to the logits ``ReLU(scale * q.k) * R^``
    with ``normalize="softmax"`` (as every scheme adds a bias to its logits),
    and to the scaled scores before the ReLU with ``normalize="row_sum"``.
    A query that sees no key (every key masked, or, with ``"row_sum"``, no
    positive score) gets zero weights and a zero output, never NaN.
    Half-precision inputs are computed in float32 and rounded once.
    """

    materializes_bias = True

    def __init__(
        self,
        num_heads: int,
        *,
        w_init: float = 0.0,
        v_init: float = 0.0,
        normalize: str = "softmax",
    ):
        nn.Module.__init__(self)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        w_init = check_float("w_init", w_init)
        v_init = check_float("v_init", v_init)
        self.normalize = check_choice("normalize", normalize, NORMALIZATIONS)
        self.w = nn.Parameter(torch.full((num_heads,), w_init))
        self.v = nn.Parameter(torch.full((num_heads,), v_init))

    def coefficients(self, q_positions, k_positions, dtype=torch.float32) -> torch.Tensor:
        """``f(w_h |p - s|; v_h)`` for query positions ``p`` and key positions ``s``.

        Integer tensors ``(q_len,)`` and ``(k_len,)``; returns
        ``(num_heads, q_len, k_len)`` in ``dtype`` (float32 at least).
        """
        work = torch.float64 if dtype == torch.float64 else torch.float32
        dist = (q_positions[:, None] - k_positions[None, :]).abs().to(work)
        w = self.w.to(work)[:, None, None]
        v = self.v.to(work)[:, None, None]
        return learnable_sigmoid(w * dist, v).to(dtype)

    def weights(self, q, k, *, bias, causal, q_offset, scale):
        """Attention weights ``(..., q_len, k_len)``, per :attr:`normalize`."""
        w = self._weights(q, k, bias=bias, causal=causal, q_offset=q_offset, scale=scale)
        return w.to(q.dtype)

    def _weights(self, q, k, *, bias, causal, q_offset, scale):
        """The weights in float32 at least (float64 for float64 inputs)."""
        if q.dim() < 3 or q.shape[-3] != self.num_heads:
            raise ValueError(
                f"q must have shape (..., num_heads={self.num_heads}, q_len, head_dim), "
                f"got {tuple(q.shape)}"
            )
        work = torch.promote_types(q.dtype, torch.float32)
        q, k = q.to(work), k.to(work)
        q_positions, k_positions = query_key_positions(q, k, q_offset)
        coef = self.coefficients(q_positions, k_positions, work)
        scores = scale * (q @ k.transpose(-1, -2))
        keep, additive = None, None
        if bias is not None:
            if bias.dtype == torch.bool:
                keep = bias
            else:
                keep = bias != float("-inf")
                additive = torch.where(keep, bias, 0).to(work)
        if causal:
            mask = causal_mask(q.shape[-2], k.shape[-2], q_offset, device=q.device)
            keep = mask if keep is None else keep & mask
        if self.normalize == "row_sum":
            if additive is not None:
                scores = scores + additive
            a = torch.relu(scores) * coef
            if keep is not None:
                a = a.masked_fill(~keep, 0.0)
            total = a.sum(-1, keepdim=True)
            # an all-zero row attends to nothing: divide by 1 there instead of 0
            return a / torch.where(total > 0, total, torch.ones_like(total))
        logits = torch.relu(scores) * coef
        if additive is not None:
            logits = logits + additive
        if keep is None:
            return torch.softmax(logits, dim=-1)
        keep = keep.expand(logits.shape)
        seen = keep.any(-1, keepdim=True)
        # a row with no visible key: softmax over zeros (finite), then zeroed
        logits = logits.masked_fill(~keep, float("-inf")).masked_fill(~seen, 0.0)
        return torch.softmax(logits, dim=-1) * seen

    def attend(self, q, k, v, *, bias, causal, q_offset, scale):
        """Distance-aware attention: ``weights @ v``, shape ``(..., q_len, d_v)``."""
        w = self._weights(q, k, bias=bias, causal=causal, q_offset=q_offset, scale=scale)
        return (w @ v.to(w.dtype)).to(v.dtype)

    def forward(self, q, k, v, *, bias=None, causal=False, q_offset=None, scale=None):
        """Same as ``posenc.attention(q, k, v, encoding=self, ...)``."""
        return attention(
            q, k, v, encoding=self, bias=bias, causal=causal, q_offset=q_offset, scale=scale
        )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, normalize={self.normalize!r}"
