"""Transformer-XL relative attention with segment memory (Dai et al., 2019).

:cite:t:`dai2019transformerxl` split the score between query ``i`` and key
``j`` into four terms.  With ``q_i = W_q x_i``, ``k_j = W_{k,E} x_j``, the
sinusoid ``R_{i-j}`` of the distance ``i - j`` (query minus key) and two
learned per-head vectors ``u`` and ``v``::

    score(i, j) = q_i . k_j                 (a) content
                + q_i . W_{k,R} R_{i-j}     (b) content-dependent position
                + u   . k_j                 (c) global content bias
                + v   . W_{k,R} R_{i-j}     (d) global position bias

The fast form groups them as ``(q_i + u) . k_j`` for (a)+(c) and
``(q_i + v) . W_{k,R} R_{i-j}`` for (b)+(d).  The second product is first
computed against the table of distances in *descending* order (one row per
distance, not per pair), then moved into ``(i, j)`` indexing by
:func:`rel_shift`, a pad-and-reshape that needs no gather.

Distances here are ``query - key`` (the paper's ``i - j``, non-negative under a
causal mask), unlike the ``key - query`` used for relative positions elsewhere
in :mod:`posenc`; the sinusoid ``R`` is the sinusoidal table with the
``[sin, cos]`` halves concatenated (``layout="concat"``), as in the reference
implementation.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_even, check_float, check_floating, check_int
from .scheme import PositionalScheme, attention, scaled_dot_product
from .sinusoidal import sinusoidal_table

__all__ = ["rel_shift", "relative_sinusoids", "TransformerXLScheme", "TransformerXLAttention"]


def rel_shift(x: torch.Tensor) -> torch.Tensor:
    """Move scores against descending distances into (query, key) indexing.

    Parameters
    ----------
    x
        ``(..., q_len, k_len)``; ``x[..., i, r]`` is the score of query ``i``
        against the relative embedding of distance ``k_len - 1 - r`` (so column
        0 is the largest distance and the last column is distance 0).

    Returns
    -------
    ``y`` of the same shape with ``y[..., i, j] = x[..., i, j + q_len - 1 - i]``
    wherever ``j <= i + k_len - q_len``, i.e. on every entry that a causal mask
    with queries aligned to the last keys keeps.  The other entries (the upper
    triangle) hold leftovers of the reshape: finite but meaningless, so they
    must be masked.

    Notes
    -----
    Transformer-XL's trick: prepend a zero column, view the ``(q_len, k_len+1)``
    block as ``(k_len+1, q_len)``, drop its first row and view the rest as
    ``(q_len, k_len)``.  Dropping ``q_len`` leading elements moves row ``i``
    left by ``q_len - i`` columns, which is the shift each row needs.  Doing it
    the other way round (appending the column, or dropping the last row) shifts
    the wrong way, a known bug in some re-implementations.
    """
    x = check_floating("x", x, min_dim=2)
    *lead, q_len, k_len = x.shape
    padded = F.pad(x, (1, 0))  # (..., q_len, k_len + 1)
    padded = padded.reshape(*lead, k_len + 1, q_len)
    return padded[..., 1:, :].reshape(*lead, q_len, k_len)


def relative_sinusoids(
    distances: torch.Tensor, dim: int, *, base: float = 10000.0, dtype=torch.float32
) -> torch.Tensor:
    """Sinusoidal embeddings ``[sin(d w), cos(d w)]`` of integer distances ``d``, ``(n, dim)``.

    Rows of :func:`posenc.sinusoidal_table` with ``layout="concat"``; a
    negative distance uses ``sin(-a) = -sin(a)``, so the table is only built for
    ``0 .. max|d|``.  ``distances`` is an integer tensor ``(n,)``; the result is
    on its device.
    """
    dim = check_even("dim", dim)
    if distances.is_floating_point():
        raise TypeError(f"distances must hold integers, got dtype {distances.dtype}")
    size = int(distances.abs().max()) + 1 if distances.numel() else 0
    table = sinusoidal_table(
        size, dim, base=base, layout="concat", dtype=dtype, device=distances.device
    )
    rows = table[distances.abs()]
    sign = torch.where(distances < 0, -1.0, 1.0).to(dtype)[:, None]
    return torch.cat([rows[:, : dim // 2] * sign, rows[:, dim // 2 :]], dim=-1)


class TransformerXLScheme(nn.Module, PositionalScheme):
    """The position part of Transformer-XL attention, as a :class:`PositionalScheme`.

    Holds the per-head biases ``u`` and ``v`` and the projection ``W_{k,R}`` of
    the sinusoid.  Through :func:`posenc.attention` it shifts the queries by
    ``u`` (term (c)) and adds ``scale * rel_shift((q + v) (W_{k,R} R)^T)``
    (terms (b) and (d)) to the scores; the content term (a) is the ordinary
    ``q k^T``.  It materialises an O(q_len * k_len) bias.

    Parameters
    ----------
    num_heads, head_dim
        Queries and keys passed to :func:`posenc.attention` must have shape
        ``(..., num_heads, len, head_dim)``.
    d_model
        Width of the sinusoid ``R`` (even); defaults to ``num_heads * head_dim``.
    base
        Wavelength base of the sinusoid (10000 in the paper).

    Notes
    -----
    Distances are ``query - key`` with queries at ``q_offset + i`` and keys at
    ``j``.  For a causal mask only distances ``>= 0`` are embedded (the paper's
    setting); without one, negative distances use the same sinusoid, as in
    XLNet's bidirectional variant.
    """

    materializes_bias = True

    def __init__(self, num_heads: int, head_dim: int, *, d_model=None, base: float = 10000.0):
        nn.Module.__init__(self)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        d_model = num_heads * head_dim if d_model is None else d_model
        self.d_model = check_even("d_model", d_model)
        self.base = check_float("base", base, positive=True)
        self.u = nn.Parameter(torch.empty(num_heads, head_dim))
        self.v = nn.Parameter(torch.empty(num_heads, head_dim))
        self.w_kr = nn.Linear(self.d_model, num_heads * head_dim, bias=False)
        nn.init.normal_(self.u, std=0.02)
        nn.init.normal_(self.v, std=0.02)

    def _check(self, q):
        if q.dim() < 3 or q.shape[-3] != self.num_heads or q.shape[-1] != self.head_dim:
            raise ValueError(
                f"q must have shape (..., num_heads={self.num_heads}, q_len, "
                f"head_dim={self.head_dim}), got {tuple(q.shape)}"
            )

    def projected_sinusoids(self, distances: torch.Tensor, dtype) -> torch.Tensor:
        """``W_{k,R} R_d`` for integer distances ``(n,)``: shape ``(num_heads, n, head_dim)``."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        r = relative_sinusoids(distances, self.d_model, base=self.base, dtype=work)
        rk = F.linear(r.to(self.w_kr.weight.dtype), self.w_kr.weight).to(dtype)
        return rk.view(-1, self.num_heads, self.head_dim).transpose(0, 1)

    def position_scores(self, qv, k_len: int, q_offset: int, causal: bool) -> torch.Tensor:
        """Unscaled ``(q + v) . W_{k,R} R_{i-j}`` in (i, j) indexing, ``(..., q_len, k_len)``.

        ``qv`` is ``q + v``, shape ``(..., num_heads, q_len, head_dim)``.  The
        products are taken against ``D`` distances in descending order, from
        the largest (last query, key 0) down, and :func:`rel_shift` puts them in
        place: ``D = q_offset + q_len`` under a causal mask (down to distance 0;
        the paper's ``k_len`` when queries align with the last keys), otherwise
        ``q_len + k_len - 1`` (down to the smallest, negative, distance).
        Entries a causal mask removes are unspecified.
        """
        q_len = qv.shape[-2]
        top = q_offset + q_len - 1  # distance of the last query to key 0
        count = q_offset + q_len if causal else q_len + k_len - 1
        distances = torch.arange(top, top - count, -1, device=qv.device)
        rk = self.projected_sinusoids(distances, qv.dtype)  # (H, D, dh)
        shifted = rel_shift(qv @ rk.transpose(-1, -2))  # (..., q_len, D)
        if count >= k_len:
            return shifted[..., :k_len]
        # keys beyond the last query are all masked: pad with zeros
        return F.pad(shifted, (0, k_len - count))

    def attend(self, q, k, v, *, bias, causal, q_offset, scale):
        """Transformer-XL scores ``scale * ((q + u) k^T + rel_shift((q + v) (W_R R)^T))``."""
        self._check(q)
        u = self.u.to(q.dtype)[:, None, :]
        vb = self.v.to(q.dtype)[:, None, :]
        pos = scale * self.position_scores(q + vb, k.shape[-2], q_offset, causal)
        bias = pos if bias is None else bias + pos
        return scaled_dot_product(
            q + u, k, v, bias=bias, causal=causal, q_offset=q_offset, scale=scale
        )

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, d_model={self.d_model}"


class TransformerXLAttention(nn.Module):
    """Multi-head Transformer-XL attention with segment-level memory.

    Parameters
    ----------
    d_model
        Width of the input ``x`` and of the output (even: it is also the width
        of the sinusoid ``R``).
    num_heads, head_dim
        Heads and their size; the projections map ``d_model`` to
        ``num_heads * head_dim`` and back.
    mem_len
        How many past positions to keep as memory.  ``None`` keeps exactly the
        current segment (the paper's basic recurrence: segment ``t + 1``
        attends to segment ``t``); ``0`` keeps none.
    base
        Wavelength base of the sinusoid.

    Notes
    -----
    ``forward(x, mems)`` takes ``x: (batch, q_len, d_model)`` and optional
    ``mems: (batch, m, d_model)`` (the previous segment's input to this layer)
    and returns ``(out, new_mems)``: ``out`` is ``(batch, q_len, d_model)``;
    ``new_mems`` is the last ``mem_len`` rows of ``[mems; x]``, detached, so no
    gradient flows into earlier segments (the stop-gradient of the paper).
    Attention is causal over ``[mems; x]``: the query at ``x[i]`` sees the
    memory and ``x[0..i]``.  The computation runs through
    :func:`posenc.attention` with a :class:`TransformerXLScheme`.
    """

    def __init__(
        self, d_model: int, num_heads: int, head_dim: int, *, mem_len=None, base: float = 10000.0
    ):
        super().__init__()
        self.d_model = check_even("d_model", d_model)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.head_dim = check_int("head_dim", head_dim, minimum=1)
        self.mem_len = None if mem_len is None else check_int("mem_len", mem_len, minimum=0)
        inner = num_heads * head_dim
        self.w_q = nn.Linear(d_model, inner, bias=False)
        self.w_ke = nn.Linear(d_model, inner, bias=False)
        self.w_v = nn.Linear(d_model, inner, bias=False)
        self.w_o = nn.Linear(inner, d_model, bias=False)
        self.scheme = TransformerXLScheme(num_heads, head_dim, d_model=d_model, base=base)

    def _inputs(self, x, mems):
        x = check_floating("x", x, min_dim=3)
        if x.dim() != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (batch, q_len, d_model={self.d_model}), got {tuple(x.shape)}"
            )
        if x.shape[1] == 0:
            raise ValueError("x must hold at least one position, got q_len=0")
        if mems is None:
            return x, x
        mems = check_floating("mems", mems, min_dim=3)
        if mems.dim() != 3 or mems.shape[0] != x.shape[0] or mems.shape[-1] != self.d_model:
            raise ValueError(
                f"mems must have shape (batch={x.shape[0]}, m, d_model={self.d_model}), "
                f"got {tuple(mems.shape)}"
            )
        return x, torch.cat([mems.to(x.dtype), x], dim=1)

    def _heads(self, t):
        return t.view(t.shape[0], t.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def project(self, x: torch.Tensor, mems: torch.Tensor | None = None):
        """Per-head ``q`` from ``x`` and ``k``, ``v`` from ``[mems; x]``.

        Shapes ``(batch, num_heads, q_len, head_dim)`` and
        ``(batch, num_heads, m + q_len, head_dim)``: what :meth:`forward` passes
        to :func:`posenc.attention` with :attr:`scheme`.
        """
        x, context = self._inputs(x, mems)
        return self._project(x, context)

    def _project(self, x, context):
        q = self._heads(self.w_q(x))
        return q, self._heads(self.w_ke(context)), self._heads(self.w_v(context))

    def forward(self, x: torch.Tensor, mems: torch.Tensor | None = None):
        """Attend from ``x`` over ``[mems; x]``; return ``(out, new_mems)``."""
        x, context = self._inputs(x, mems)
        q, k, v = self._project(x, context)
        out = attention(q, k, v, encoding=self.scheme, causal=True)  # (B, H, q_len, dh)
        out = self.w_o(out.transpose(1, 2).reshape(x.shape[0], x.shape[1], -1))
        if self.mem_len is None:
            new_mems = x.detach()
        else:
            new_mems = context[:, max(0, context.shape[1] - self.mem_len) :].detach()
        return out, new_mems

    def score_terms(self, x: torch.Tensor, mems: torch.Tensor | None = None):
        """The four unscaled score terms, each ``(batch, num_heads, q_len, k_len)``.

        Returns ``(a, b, c, d)`` in absolute ``(i, j)`` indexing (query ``i`` of
        ``x``, key ``j`` of ``[mems; x]``), computed pair by pair from the
        distance ``i + m - j`` with no shift: (a) ``q_i . k_j``, (b)
        ``q_i . W_{k,R} R_{i-j}``, (c) ``u . k_j``, (d) ``v . W_{k,R} R_{i-j}``.
        The attention logits are ``(a + b + c + d) / sqrt(head_dim)`` on the
        causal entries ``j <= m + i``; the others are computed but unused.
        Costs O(q_len * k_len * head_dim) memory: meant for analysis.
        """
        x, context = self._inputs(x, mems)
        q, k, _ = self._project(x, context)
        q_len, k_len = q.shape[-2], k.shape[-2]
        offset = k_len - q_len
        dist = (
            offset
            + torch.arange(q_len, device=x.device)[:, None]
            - torch.arange(k_len, device=x.device)
        )
        rk = self.scheme.projected_sinusoids(dist.reshape(-1), q.dtype)  # (H, q*k, dh)
        rk = rk.view(self.num_heads, q_len, k_len, self.head_dim)
        u = self.scheme.u.to(q.dtype)[:, None, :]
        v = self.scheme.v.to(q.dtype)[:, None, None, :]
        a = q @ k.transpose(-1, -2)
        b = torch.einsum("bhid,hijd->bhij", q, rk)
        c = (u @ k.transpose(-1, -2)).expand_as(a)
        d = (v * rk).sum(-1).expand_as(a)
        return a, b, c, d

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, num_heads={self.num_heads}, head_dim={self.head_dim}, "
            f"mem_len={self.mem_len}"
        )
