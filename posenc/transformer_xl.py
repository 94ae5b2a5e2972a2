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
``(q_i + v) . W_{k,R} R_{i-j}`` for (b)+(d).  The paper computes the second
product against the table of distances in *descending* order (one row per
distance, not per pair), then moves it into ``(i, j)`` indexing with
:func:`rel_shift`, a pad-and-reshape that needs no gather
(:meth:`TransformerXLScheme.position_scores`).  That trick needs consecutive
positions.  Through :func:`posenc.attention` the scheme uses angle addition
instead: ``sin((p - s) w)`` and ``cos((p - s) w)`` split into products of
functions of ``p`` and of ``s``, so (b)+(d) is one matmul of a query-side
``(q_len, d_model)`` factor with a key-side ``(k_len, d_model)`` one, for any
positions (per-sample positions of a left-padded batch, a KV cache at any
offset) and with no table that grows with the offset.

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

from ._checks import (
    MAX_DISTANCE,
    check_even,
    check_float,
    check_floating,
    check_heads,
    check_int,
    check_position_values,
    check_tensor,
)
from .attend import attention
from .context import CallContext
from .scheme import PositionalScheme
from .sdpa import dot_scores, scaled_dot_product, softmax_weights
from .sinusoidal import sinusoidal_inv_freq

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
    distances: torch.Tensor, dim: int, *, base: float = 10000.0, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Sinusoidal embeddings ``[sin(d w), cos(d w)]`` of integer distances ``d``, ``(..., dim)``.

    Rows of :func:`posenc.sinusoidal_table` with the ``[sin block, cos block]``
    layout, at any integer (also negative) distance: angles are evaluated in
    float64, directly from the distances, and rounded once to ``dtype``.
    ``distances`` is an integer tensor of any shape; the result is on its device.

    Parameters
    ----------
    distances
        Integer distances, any shape.
    dim
        Feature size, a positive even integer.
    base
        Wavelength base (10000 in the paper).
    dtype
        Floating dtype of the result.

    Returns
    -------
    Tensor
        ``(*distances.shape, dim)``: the sines in the first half, the cosines
        in the second.

    Examples
    --------
    >>> import torch, posenc
    >>> posenc.relative_sinusoids(torch.tensor([0, 1]), 4, dtype=torch.float64).round(
    ...     decimals=4).tolist()
    [[0.0, 0.0, 1.0, 1.0], [0.8415, 0.01, 0.5403, 1.0]]
    """
    dim = check_even("dim", dim)
    distances = check_tensor("distances", distances)
    if distances.is_floating_point() or distances.is_complex():
        raise TypeError(f"distances must hold integers, got dtype {distances.dtype}")
    # the difference of two positions: beyond it float64 angles lose whole turns
    check_position_values("distances", distances, limit=MAX_DISTANCE)
    inv_freq = sinusoidal_inv_freq(dim, base=base, device=distances.device)
    angles = distances.to(torch.float64)[..., None] * inv_freq
    return torch.cat([angles.sin(), angles.cos()], dim=-1).to(dtype)


class TransformerXLScheme(PositionalScheme):
    """The position part of Transformer-XL attention, as a :class:`PositionalScheme`.

    Holds the per-head biases ``u`` and ``v`` and the projection ``W_{k,R}`` of
    the sinusoid.  Through :func:`posenc.attention` it shifts the queries by
    ``u`` (term (c)) and adds ``scale * (q + v) . W_{k,R} R_{p-s}`` (terms (b)
    and (d), by :meth:`position_logits`) to the scores; the content term (a)
    is the ordinary ``q k^T``.  It materialises an O(q_len * k_len) bias.
    Keys and values may have fewer heads than the queries (grouped-query
    attention), and positions may be per sample.

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
    Distances are ``query - key``, by default with queries at ``q_offset + i``
    and keys at ``j``.  Under a causal mask only distances ``>= 0`` reach the
    softmax (the paper's setting); without one, negative distances use the same
    sinusoid, as in XLNet's bidirectional variant.

    Examples
    --------
    >>> import torch, posenc
    >>> _ = torch.manual_seed(0)
    >>> xl = posenc.TransformerXLScheme(num_heads=4, head_dim=16)
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 2, 4, 6, 16, generator=g)
    >>> posenc.attention(q, k, v, encoding=xl, causal=True).shape
    torch.Size([2, 4, 6, 16])
    >>> w = posenc.attention_weights(q, k, encoding=xl, causal=True)
    >>> torch.allclose(w.sum(-1), torch.ones(2, 4, 6)), bool(w[0, 0, 0, 1:].eq(0).all())
    (True, True)
    """

    quadratic_memory = True
    reference = "dai2019transformerxl"

    def __init__(
        self, num_heads: int, head_dim: int, *, d_model: int | None = None, base: float = 10000.0
    ) -> None:
        super().__init__()
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

    def _check(self, q: torch.Tensor) -> None:
        check_heads(type(self).__name__, q, self.num_heads, head_dim=self.head_dim)

    def projected_sinusoids(self, distances: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """``W_{k,R} R_d`` for integer distances ``(n,)``: shape ``(num_heads, n, head_dim)``."""
        work = torch.float64 if dtype == torch.float64 else torch.float32
        r = relative_sinusoids(distances, self.d_model, base=self.base, dtype=work)
        rk = F.linear(r.to(self.w_kr.weight.dtype), self.w_kr.weight).to(dtype)
        return rk.view(-1, self.num_heads, self.head_dim).transpose(0, 1)

    def position_scores(
        self, qv: torch.Tensor, k_len: int, q_offset: int, causal: bool
    ) -> torch.Tensor:
        """Unscaled ``(q + v) . W_{k,R} R_{i-j}`` in (i, j) indexing, ``(..., q_len, k_len)``.

        The paper's form, with :func:`rel_shift`, for keys at ``0 .. k_len-1``
        and queries at ``q_offset + i``.  ``qv`` is ``q + v``, shape
        ``(..., num_heads, q_len, head_dim)``.  The products are taken against
        ``D`` distances in descending order, from the largest (last query, key
        0) down, and :func:`rel_shift` puts them in place: ``D = q_offset +
        q_len`` under a causal mask (down to distance 0; the paper's ``k_len``
        when queries align with the last keys), otherwise ``q_len + k_len - 1``
        (down to the smallest, negative, distance).  Entries a causal mask
        removes are unspecified.  :meth:`position_logits` gives the same values
        for any positions.
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

    def position_logits(
        self, qv: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor
    ) -> torch.Tensor:
        """Unscaled ``(q + v) . W_{k,R} R_{p-s}`` for queries at ``p`` and keys at ``s``.

        ``qv`` is ``q + v``, ``(batch, num_heads, q_len, head_dim)``; positions
        are integers ``(len,)`` or ``(batch, len)``.  With ``c = (q + v)
        W_{k,R}`` split into its sine and cosine halves ``c_s``, ``c_c``,
        angle addition gives ``sum_f cos(s w_f) (c_s sin(p w_f) + c_c cos(p w_f))
        + sin(s w_f) (c_c sin(p w_f) - c_s cos(p w_f))``: one matmul, exact for
        any positions.  Returns ``(batch, num_heads, q_len, k_len)`` in float32
        (float64 for float64 input).
        """
        work = torch.float64 if qv.dtype == torch.float64 else torch.float32
        half = self.d_model // 2
        w_r = self.w_kr.weight.to(work).view(self.num_heads, self.head_dim, self.d_model)
        c = torch.einsum("bhqd,hdm->bhqm", qv.to(work), w_r)
        c_sin, c_cos = c[..., :half], c[..., half:]
        inv_freq = sinusoidal_inv_freq(self.d_model, base=self.base, device=qv.device)
        pq = q_positions.to(torch.float64)[..., None] * inv_freq  # (..., q_len, half)
        pk = k_positions.to(torch.float64)[..., None] * inv_freq
        sin_q, cos_q = pq.sin().to(work).unsqueeze(-3), pq.cos().to(work).unsqueeze(-3)
        sin_k, cos_k = pk.sin().to(work).unsqueeze(-3), pk.cos().to(work).unsqueeze(-3)
        query_side = torch.cat([c_sin * sin_q + c_cos * cos_q, c_cos * sin_q - c_sin * cos_q], -1)
        key_side = torch.cat([cos_k, sin_k], -1)  # (1 or batch, 1, k_len, d_model)
        return query_side @ key_side.transpose(-1, -2)

    def _shifted(
        self, q: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, scale: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(q + u, scale * position logits)``: what both hooks feed to the shared helpers."""
        self._check(q)
        u = self.u.to(q.dtype)[:, None, :]
        vb = self.v.to(q.dtype)[:, None, :]
        return q + u, scale * self.position_logits(q + vb, q_positions, k_positions)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """``u`` and ``v`` drawn from N(0, 1), far from their small initialisation."""
        m = cls(num_heads, head_dim)
        with torch.no_grad():
            m.u.normal_()
            m.v.normal_()
        return {"": m}

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        """Transformer-XL: ``softmax(scale * ((q + u) k^T + (q + v) . W_R R_{p-s})) v``."""
        qu, pos = self._shifted(q, ctx.q_positions, ctx.k_positions, ctx.scale)
        return scaled_dot_product(
            qu, k, v, mask=ctx.mask, bias=pos, causal=ctx.causal, q_offset=ctx.q_offset,
            scale=ctx.scale,
        )  # fmt: skip

    def weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        qu, pos = self._shifted(q, ctx.q_positions, ctx.k_positions, ctx.scale)
        logits = dot_scores(qu, k, ctx.scale) + pos
        w = softmax_weights(logits, mask=ctx.mask, causal=ctx.causal, q_offset=ctx.q_offset)
        return w.to(q.dtype)

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
        self,
        d_model: int,
        num_heads: int,
        head_dim: int,
        *,
        mem_len: int | None = None,
        base: float = 10000.0,
    ) -> None:
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

    def _inputs(
        self, x: torch.Tensor, mems: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
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

    def _heads(self, t: torch.Tensor) -> torch.Tensor:
        return t.view(t.shape[0], t.shape[1], self.num_heads, self.head_dim).transpose(1, 2)

    def project(
        self, x: torch.Tensor, mems: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Per-head ``q`` from ``x`` and ``k``, ``v`` from ``[mems; x]``.

        Shapes ``(batch, num_heads, q_len, head_dim)`` and
        ``(batch, num_heads, m + q_len, head_dim)``: what :meth:`forward` passes
        to :func:`posenc.attention` with its ``scheme``.
        """
        x, context = self._inputs(x, mems)
        return self._project(x, context)

    def _project(
        self, x: torch.Tensor, context: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = self._heads(self.w_q(x))
        return q, self._heads(self.w_ke(context)), self._heads(self.w_v(context))

    def forward(
        self, x: torch.Tensor, mems: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
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

    def score_terms(
        self, x: torch.Tensor, mems: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
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
