"""DA-Transformer: distance-aware attention (Wu, Wu and Huang, 2021).

:cite:t:`wu2021da` rescale attention by the real token distance.  Head ``h``
weights the distance with a learnable scalar ``w_h``, ``R_ij = w_h |i - j|``
(``w_h > 0`` favours far tokens, ``w_h < 0`` near ones), and maps it through a
learnable sigmoid with its own scalar ``v_h``::

    f(x; v) = (1 + e^v) / (1 + e^(v - x))

so that ``f(0) = 1`` (distance zero changes nothing), ``f -> 0`` as
``x -> -inf``, ``f < 1 + e^v`` and ``f`` increases with ``x``.  The attention
weights are the ReLU'd scores multiplied elementwise by ``f(R)`` and
normalised by their row sum (no softmax)::

    A_ij = relu(scale * q_i . k_j) * f(R_ij) / sum_j' relu(scale * q_i . k_j') f(R_ij')

Because ReLU is positively homogeneous, ``scale`` (the paper's ``1/sqrt(d)``)
cancels in the normalisation; it is kept for the shape of the formula.

A row whose scores are all ``<= 0`` (or all masked) has a zero sum.  Such a
query attends to nothing: its weights are all zero and its output is the zero
vector, with no NaN (we divide by 1 where the sum is 0).
"""

from __future__ import annotations

import torch
from torch import nn

from ._checks import check_float, check_floating, check_int
from .scheme import PositionalScheme, attention, causal_mask, query_key_positions

__all__ = ["learnable_sigmoid", "DAAttention"]


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
    come from ``posenc.attention_weights(q, k, encoding=module)``; their rows
    sum to 1, or to 0 for a query that attends to nothing.

    Parameters
    ----------
    num_heads
        Number of heads; each has its own ``w`` and ``v``.
    w_init, v_init
        Initial values of every ``w_h`` and ``v_h``.  With ``w = 0`` every
        coefficient is 1 and the layer starts as plain ReLU attention.

    Notes
    -----
    Queries sit at ``q_offset + i`` and keys at ``j`` (see
    :mod:`posenc.scheme`); the distance is ``|q_offset + i - j|``.  Masked
    entries (causal mask, ``-inf`` or ``False`` in ``bias``) get weight zero
    before the row is normalised; a finite additive ``bias`` is added to the
    scaled scores before the ReLU.
    """

    materializes_bias = True

    def __init__(self, num_heads: int, *, w_init: float = 0.0, v_init: float = 0.0):
        nn.Module.__init__(self)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        w_init = check_float("w_init", w_init)
        v_init = check_float("v_init", v_init)
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
        """Rescaled, row-normalised ReLU weights ``(..., q_len, k_len)``."""
        if q.dim() < 3 or q.shape[-3] != self.num_heads:
            raise ValueError(
                f"q must have shape (..., num_heads={self.num_heads}, q_len, head_dim), "
                f"got {tuple(q.shape)}"
            )
        q_positions, k_positions = query_key_positions(q, k, q_offset)
        scores = scale * (q @ k.transpose(-1, -2))
        keep = None
        if bias is not None:
            if bias.dtype == torch.bool:
                keep = bias
            else:
                keep = bias != float("-inf")
                scores = scores + torch.where(keep, bias, 0).to(scores.dtype)
        if causal:
            mask = causal_mask(q.shape[-2], k.shape[-2], q_offset, device=q.device)
            keep = mask if keep is None else keep & mask
        a = torch.relu(scores) * self.coefficients(q_positions, k_positions, q.dtype)
        if keep is not None:
            a = a.masked_fill(~keep, 0.0)
        total = a.sum(-1, keepdim=True)
        # an all-zero row attends to nothing: divide by 1 there instead of 0
        return a / torch.where(total > 0, total, torch.ones_like(total))

    def attend(self, q, k, v, *, bias, causal, q_offset, scale):
        """Rescaled ReLU attention: ``weights @ v``, shape ``(..., q_len, d_v)``."""
        return self.weights(q, k, bias=bias, causal=causal, q_offset=q_offset, scale=scale) @ v

    def forward(self, q, k, v, *, bias=None, causal=False, q_offset=None, scale=None):
        """Same as ``posenc.attention(q, k, v, encoding=self, ...)``."""
        return attention(
            q, k, v, encoding=self, bias=bias, causal=causal, q_offset=q_offset, scale=scale
        )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
