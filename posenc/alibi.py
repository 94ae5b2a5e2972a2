"""ALiBi: attention with linear biases (Press, Smith and Lewis, 2022).

ALiBi adds no embedding at all.  Head ``h`` adds ``-m_h * |i - j|`` to the
score of query position ``i`` and key position ``j``: a fixed, head-specific
penalty that grows linearly with distance.  The slopes ``m_h`` form a geometric
sequence, so some heads look far back and others stay local.

Conventions (shared with :func:`posenc.attention`): keys sit at positions
``0 .. k_len-1``; queries at ``q_offset .. q_offset+q_len-1`` with the default
``q_offset = k_len - q_len`` (queries are the newest tokens, as with a KV
cache).  The bias only depends on ``|key - query|``, so its sign convention
cannot go wrong; the bias is always <= 0.
"""

from __future__ import annotations

import torch

from ._checks import check_float_dtype, check_heads, check_int, check_offset
from ._types import Device, Positions, ScoreMod
from .context import CallContext, as_context
from .scheme import PositionalScheme

__all__ = ["alibi_slopes", "alibi_bias", "ALiBi"]


def _power_of_two_slopes(n: int) -> list[float]:
    # 2^(-8h/n), h = 1..n: start and ratio are both 2^(-8/n).
    return [2.0 ** (-8.0 * h / n) for h in range(1, n + 1)]


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Per-head ALiBi slopes, float64 tensor of shape ``(num_heads,)``.

    For a power of two ``n`` these are the paper's geometric slopes
    ``2^(-8h/n)``, ``h = 1..n`` (e.g. 1/2, 1/4, ..., 1/256 for 8 heads).

    For any other ``n`` we follow the rule of the paper's reference code
    (``ofirpress/attention_with_linear_biases``, also used by BLOOM and MPT
    checkpoints): take the ``P`` slopes of the largest power of two ``P < n``,
    then append every other slope of the ``2P``-head sequence (its 1st, 3rd,
    5th, ... entries, ``2^(-4(2r-1)/P)``), the first ``n - P`` of them.  Those
    extra slopes fall *between* the first ``P`` ones, so the vector is
    decreasing within each of the two blocks but not overall (for 12 heads:
    2^-1 ... 2^-8, then 2^-0.5, 2^-1.5, 2^-2.5, 2^-3.5).  We keep this order
    because pretrained ALiBi models were trained with it; do not sort it.

    Parameters
    ----------
    num_heads
        Number of attention heads, a positive integer.

    Returns
    -------
    Tensor ``(num_heads,)``, float64, on the CPU; every slope lies in (0, 1).
    """
    n = check_int("num_heads", num_heads, minimum=1)
    p = 1 << (n.bit_length() - 1)  # largest power of two <= n
    slopes = _power_of_two_slopes(p)
    if p != n:
        slopes += _power_of_two_slopes(2 * p)[0::2][: n - p]
    return torch.tensor(slopes, dtype=torch.float64)


def _bias_from_positions(
    slopes: torch.Tensor, q_positions: torch.Tensor, k_positions: torch.Tensor, dtype: torch.dtype
) -> torch.Tensor:
    """``-slope * |q - k|`` as ``(..., heads, q_len, k_len)``, computed in float64 and cast once.

    Positions ``(q_len,)``/``(k_len,)`` give ``(heads, q_len, k_len)``; per-sample
    positions ``(batch, len)`` give ``(batch, heads, q_len, k_len)``.
    """
    # Negate the integer distance, not the product, so the diagonal is +0.0 rather than -0.0.
    distance = (q_positions[..., :, None] - k_positions[..., None, :]).abs()
    neg_distance = (-distance).to(torch.float64).unsqueeze(-3)
    slopes = slopes.to(device=neg_distance.device)
    return (slopes[:, None, None] * neg_distance).to(dtype)


def alibi_bias(
    num_heads: int,
    q_len: int,
    k_len: int | None = None,
    *,
    causal: bool = True,
    q_offset: int | None = None,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
) -> torch.Tensor:
    """ALiBi score bias of shape ``(num_heads, q_len, k_len)``.

    With ``causal=False`` the bias is the symmetric ``-m_h * |i - j|`` in
    absolute positions (query ``i`` sits at ``q_offset + i``).

    With ``causal=True`` it is ``-m_h * (k_len - 1 - j)``, the same for
    every query.  The paper's reference code adds ``+m_h * j`` to every row
    instead; posenc's form is that bias shifted by the per-head constant
    ``-m_h * (k_len - 1)``, so no entry is positive.  Both equal the
    symmetric bias plus a per-row constant (here
    ``-m_h * (k_len - 1 - (q_offset + i))``) on every key the query may
    attend to (``j <= q_offset + i``), and softmax is blind to a per-row
    constant.  Entries above the causal diagonal are *not*
    set to ``-inf``: mask them yourself, e.g. ``attention(..., causal=True)``.
    The result is a broadcast view (stride 0 over queries) costing only
    ``O(num_heads * k_len)`` memory; call ``.contiguous()`` before writing to it.

    Parameters
    ----------
    num_heads
        Number of heads; slopes come from :func:`alibi_slopes`.
    q_len, k_len
        Numbers of queries and keys; ``k_len`` defaults to ``q_len``.
    causal
        Return the cheap causal form (see above) instead of the symmetric bias.
    q_offset
        Position of the first query; defaults to ``k_len - q_len`` (queries
        aligned with the last keys).  With ``causal=True`` it must be >= 0 and,
        by default, ``q_len <= k_len``.
    dtype, device
        Output dtype (floating point) and device.  Distances and slopes are
        combined in float64 and rounded once to ``dtype``.

    Returns
    -------
    Tensor ``(num_heads, q_len, k_len)``; materialises ``O(q_len * k_len)``
    entries per head when ``causal=False``.
    """
    slopes = alibi_slopes(num_heads)
    q_len = check_int("q_len", q_len, minimum=1)
    k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=1)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    dtype = check_float_dtype("dtype", dtype)
    q_offset = check_offset(q_len, k_len, q_offset, causal=causal)
    k_positions = torch.arange(k_len, device=device)
    if causal:
        # The distance to the last key, -m (k_len - 1 - j): one row, shared by all queries.
        last = torch.full((1,), k_len - 1, device=device)
        return _bias_from_positions(slopes, last, k_positions, dtype).expand(-1, q_len, -1)
    q_positions = torch.arange(q_len, device=device) + q_offset
    return _bias_from_positions(slopes, q_positions, k_positions, dtype)


class ALiBi(PositionalScheme):
    """ALiBi as a :class:`~posenc.PositionalScheme` for :func:`posenc.attention`.

    Adds ``-m_h * |query - key|`` (positions as given by ``attention``, so a
    ``q_offset``, a KV cache or the per-sample positions of a left-padded
    batch are handled) to the scaled scores of head ``h``.  Queries must have
    shape ``(..., num_heads, q_len, d)``; keys may have fewer heads
    (grouped-query attention).

    Both paths read the buffer ``slopes`` ``(num_heads,)``, float64 (kept so by
    ``module.to(dtype)``; not in the state dict, since ``num_heads`` sets it):
    :meth:`score_mod` for FlexAttention (no O(n^2) tensor) and :meth:`bias`
    for the eager path, a dense ``(num_heads, q_len, k_len)`` bias (``(batch,
    num_heads, q_len, k_len)`` for per-sample positions) computed in float64
    and rounded once.  PyTorch's SDPA has no
    built-in ALiBi, so the eager path hands it that tensor as ``attn_mask``.
    A subclass that sets other slopes (say, twice as steep) keeps both paths.
    The bias is symmetric, so the same scheme serves causal (mask added by
    ``attention``) and bidirectional attention.

    Parameters
    ----------
    num_heads
        Number of heads; the slopes are :func:`alibi_slopes` ``(num_heads)``.

    Examples
    --------
    >>> import torch, posenc
    >>> alibi = posenc.ALiBi(4)
    >>> alibi.slopes.tolist()
    [0.25, 0.0625, 0.015625, 0.00390625]
    >>> z = torch.zeros(1, 4, 3, 8, dtype=torch.float64)   # (batch, heads, len, d)
    >>> alibi.bias(z, z, posenc.CallContext.of(z, z))[0].tolist()   # head 0
    [[0.0, -0.25, -0.5], [-0.25, 0.0, -0.25], [-0.5, -0.25, 0.0]]
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 2, 4, 6, 8, generator=g, dtype=torch.float64)
    >>> posenc.attention(q, k, v, encoding=alibi, causal=True).shape
    torch.Size([2, 4, 6, 8])
    """

    quadratic_memory = True
    reference = "press2022alibi"
    float64_buffers = ("slopes",)

    slopes: torch.Tensor  # a buffer, float64 (num_heads,)

    def __init__(self, num_heads: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        # not persistent: a function of num_heads, and checkpoints saved before it existed load
        self.register_buffer("slopes", alibi_slopes(self.num_heads), persistent=False)

    def bias(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        ctx: CallContext | Positions,
        *legacy: Positions | float | None,
    ) -> torch.Tensor:
        """``-slopes[h] * |q_pos - k_pos|``, ``(num_heads, q_len, k_len)`` in ``q``'s dtype.

        Also accepts the old form ``bias(q, k, q_positions, k_positions, scale)``.
        """
        ctx = as_context(q, k, ctx, *legacy, hook=f"{type(self).__name__}.bias")
        check_heads(f"{type(self).__name__}({self.num_heads})", q, self.num_heads)
        return _bias_from_positions(self.slopes, ctx.q_positions, ctx.k_positions, q.dtype)

    def score_mod(self, ctx: CallContext) -> ScoreMod:
        """``score - slopes[h] * |q_pos - k_pos|`` in float32 at least."""
        work = torch.promote_types(ctx.dtype, torch.float32)
        slopes = self.slopes.to(device=ctx.device, dtype=work)

        def mod(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
        ) -> torch.Tensor:
            return score - slopes[h] * (q_pos - k_pos).abs().to(work)

        return mod

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}"
