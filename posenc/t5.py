"""T5 relative-position buckets and their learned per-head bias (Raffel et al., 2020).

T5 adds a learned scalar per head to each attention score, looked up by the
*bucket* of the relative position ``key - query``.  Small distances get a bucket
each; larger ones share logarithmically wider buckets up to ``max_distance``,
beyond which everything falls into the last bucket.

Sign convention (the same as Mesh TensorFlow and Hugging Face ``transformers``):
the relative position is ``key - query``, so a key *after* the query is
positive.

* ``bidirectional=True`` (encoder): half the buckets per direction.  Keys at or
  before the query (``key - query <= 0``) use buckets ``0 .. num_buckets/2 - 1``;
  keys after it (``> 0``) use ``num_buckets/2 .. num_buckets - 1``.
* ``bidirectional=False`` (decoder): all buckets describe the past; every
  future key (``key - query > 0``) shares bucket 0 with distance 0, since a
  causal mask hides it anyway.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, overload

import torch
from torch import nn

from ._checks import (
    MAX_DISTANCE,
    as_positions,
    beyond_limit,
    check_build_args,
    check_heads,
    check_int,
    check_offset,
    check_tensor,
)
from ._runtime import has_values, symbolic, tracing
from ._types import Positions, ScoreMod
from .context import CallContext, as_context
from .scheme import PositionalScheme

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["t5_relative_bucket", "T5RelativeBias"]


def _check_bucket_args(bidirectional: bool, num_buckets: int, max_distance: int) -> tuple[int, int]:
    if not isinstance(bidirectional, bool):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    num_buckets = check_int("num_buckets", num_buckets, minimum=1)
    if bidirectional and (num_buckets < 4 or num_buckets % 2):
        raise ValueError(
            "num_buckets must be an even integer >= 4 when bidirectional=True "
            f"(each direction needs an exact and a logarithmic bucket), got {num_buckets}"
        )
    if not bidirectional and num_buckets < 2:
        raise ValueError(
            f"num_buckets must be >= 2 when bidirectional=False (an exact and a logarithmic "
            f"bucket), got {num_buckets}"
        )
    per_direction = num_buckets // 2 if bidirectional else num_buckets
    max_exact = per_direction // 2
    max_distance = check_int("max_distance", max_distance, minimum=1)
    if max_distance > MAX_DISTANCE:
        raise ValueError(
            f"max_distance must be <= 2**32 = {MAX_DISTANCE} (positions lie within 2**31 of 0, "
            f"so no two are farther apart), got {max_distance}"
        )
    if max_distance <= max_exact:
        raise ValueError(
            f"max_distance must exceed the exact range ({max_exact} distances per direction "
            f"with num_buckets={num_buckets}), got {max_distance}"
        )
    return num_buckets, max_distance


def t5_relative_bucket(
    relative_position: Positions,
    *,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> torch.Tensor:
    """Map relative positions ``key - query`` to T5's buckets.

    Let ``B = num_buckets / 2`` if bidirectional else ``num_buckets`` (buckets
    per direction), ``E = B // 2`` and ``n`` the distance (``|key - query|``
    when bidirectional; ``max(query - key, 0)`` otherwise).  Then the bucket
    within a direction is ``n`` for ``n < E`` (exact) and
    ``min(E + floor((B - E) * log(n / E) / log(max_distance / E)), B - 1)``
    otherwise (logarithmic, saturating at ``max_distance``).  Bidirectional
    buckets add ``B`` for keys after the query.  The logarithms are taken in
    float64.

    Parameters
    ----------
    relative_position
        Integer tensor (any shape) or sequence of ints: ``key - query``; every
        int64 value gets its exact bucket (distances past ``max_distance``
        share the last one).
    bidirectional
        Split the buckets by direction (encoder) or describe only the past
        (decoder); see the module docstring for the sign convention.
    num_buckets
        Total number of buckets: even and >= 4 if bidirectional, >= 2 otherwise.
    max_distance
        Distance from which every position shares the last bucket of its
        direction; must exceed ``E``.

    Returns
    -------
    ``int64`` tensor of the same shape and device, values in ``[0, num_buckets)``.
    """
    num_buckets, max_distance = _check_bucket_args(bidirectional, num_buckets, max_distance)
    rel = as_positions("relative_position", relative_position, limit=None)
    # Every distance >= max_distance (<= MAX_DISTANCE) shares the last bucket, so the
    # clamp changes no bucket; it keeps abs() and negation of int64 extremes from wrapping.
    rel = rel.clamp(-MAX_DISTANCE, MAX_DISTANCE)
    per_direction = num_buckets
    offset = torch.zeros_like(rel)
    if bidirectional:
        per_direction //= 2
        offset = (rel > 0).long() * per_direction
        distance = rel.abs()
    else:
        distance = (-rel).clamp(min=0)
    return offset + _direction_bucket(distance, per_direction, max_distance)


def _direction_bucket(
    distance: torch.Tensor, per_direction: int, max_distance: int
) -> torch.Tensor:
    """The bucket within one direction of int64 ``distance >= 0``: T5's float64 formula."""
    max_exact = per_direction // 2
    # clamp(min=1) only keeps log() finite on entries that take the exact branch anyway.
    ratio = distance.clamp(min=1).to(torch.float64) / max_exact
    spread = torch.log(ratio) / math.log(max_distance / max_exact) * (per_direction - max_exact)
    log_bucket = (max_exact + spread.floor().long()).clamp(max=per_direction - 1)
    return torch.where(distance < max_exact, distance, log_bucket)


def _log_boundaries(per_direction: int, max_distance: int, device: torch.device) -> torch.Tensor:
    """The least distance of each logarithmic bucket ``E+1 .. B-1`` within a direction.

    Bisection on :func:`_direction_bucket` itself, evaluated on ``device``, so
    that ``min(n, E) + #{b: n >= boundary_b}`` equals it at every distance
    ``n`` (the formula is non-decreasing in ``n``; a skipped bucket shares its
    boundary with the next).  ``(B - E - 1,)`` int64: its size does not depend
    on ``max_distance``.
    """
    max_exact = per_direction // 2
    want = torch.arange(max_exact + 1, per_direction, device=device)
    lo = torch.full_like(want, max_exact)  # bucket(lo) = E < want
    hi = torch.full_like(want, max_distance)  # bucket(hi) = B - 1 >= want
    for _ in range((max_distance - max_exact).bit_length()):
        mid = (lo + hi) // 2
        up = _direction_bucket(mid, per_direction, max_distance) >= want
        lo, hi = torch.where(up, lo, mid), torch.where(up, mid, hi)
    return hi


class T5RelativeBias(PositionalScheme):
    """T5's learned per-head relative-position bias (Raffel et al., 2020).

    An embedding ``weight`` of shape ``(num_buckets, num_heads)`` holds one
    scalar per bucket and head; the bias of head ``h`` for query position ``p``
    and key position ``s`` is ``weight[t5_relative_bucket(s - p), h]``.

    As a :class:`~posenc.PositionalScheme` it adds that bias to the
    scaled scores, so queries must have shape ``(..., num_heads, q_len, d)``.
    T5 itself does *not* scale scores by ``1/sqrt(d)`` (its initialisation
    absorbs the factor): to reproduce a T5 checkpoint exactly, call
    ``posenc.attention(q, k, v, encoding=bias_module, scale=1.0)``.  On the
    eager path the bias is a dense ``(num_heads, q_len, k_len)`` tensor, O(n^2)
    per head, built from an O(n^2) bucket table; :meth:`score_mod` gives the
    fused FlexAttention path, which builds neither.  :meth:`table` returns the
    bias for a number of queries and keys (``module(q_len)`` still does).

    Parameters
    ----------
    num_heads
        Number of heads.
    bidirectional, num_buckets, max_distance
        Bucketing, see :func:`t5_relative_bucket` (T5 uses bidirectional
        buckets in the encoder and unidirectional ones in the decoder).
    init_std
        Standard deviation of the normal initialisation of ``weight``.

    Examples
    --------
    >>> import torch, posenc
    >>> _ = torch.manual_seed(0)
    >>> t5 = posenc.T5RelativeBias(4, bidirectional=False, num_buckets=8, max_distance=16)
    >>> t5.buckets(torch.arange(4), torch.arange(4)).tolist()   # query rows, key columns
    [[0, 0, 0, 0], [1, 0, 0, 0], [2, 1, 0, 0], [3, 2, 1, 0]]
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 4, 5, 8, generator=g)
    >>> posenc.attention(q, k, v, encoding=t5, causal=True, scale=1.0).shape   # T5: no 1/sqrt(d)
    torch.Size([1, 4, 5, 8])
    """

    quadratic_memory = True
    reference = "raffel2020t5"
    shared_across_layers = True  # T5 holds one bias table for all layers

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        init_std: float = 0.02,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.num_buckets, self.max_distance = _check_bucket_args(
            bidirectional, num_buckets, max_distance
        )
        self.bidirectional = bidirectional
        # (device, B, max_distance) -> _log_boundaries, computed once
        self._boundaries: dict[tuple[torch.device, int, int], torch.Tensor] = {}
        self.weight = nn.Parameter(torch.empty(self.num_buckets, self.num_heads))
        nn.init.normal_(self.weight, std=init_std)

    def buckets(self, q_positions: Positions, k_positions: Positions) -> torch.Tensor:
        """Bucket table ``(q_len, k_len)`` for integer query and key positions.

        Positions ``(q_len,)`` and ``(k_len,)``; per-sample positions ``(batch,
        q_len)`` and ``(batch, k_len)`` give ``(batch, q_len, k_len)``.  Every
        position must lie strictly within ``2**31`` of 0 (``ValueError``).
        """
        q_positions = as_positions("q_positions", q_positions, device=self.weight.device)
        k_positions = as_positions("k_positions", k_positions, device=self.weight.device)
        return self._buckets(q_positions, k_positions)

    def _buckets(self, q_positions: torch.Tensor, k_positions: torch.Tensor) -> torch.Tensor:
        return t5_relative_bucket(
            k_positions[..., None, :] - q_positions[..., :, None],
            bidirectional=self.bidirectional,
            num_buckets=self.num_buckets,
            max_distance=self.max_distance,
        )

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
        """``bidirectional=not causal`` and ``max_distance = max(max_len, num_buckets)``."""
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        options.setdefault("bidirectional", not causal)
        if max_len is not None:
            options.setdefault("max_distance", max(max_len, options.get("num_buckets", 32)))
        return cls(num_heads, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """Small buckets and a weight drawn from N(0, 1), so that every bucket matters."""
        m = cls(num_heads, num_buckets=8, max_distance=12)
        with torch.no_grad():
            m.weight.normal_()
        return {"": m}

    @overload
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
        mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
        causal: bool = False, q_offset: int | None = None,
        q_positions: Positions | None = None, k_positions: Positions | None = None,
        scale: float | None = None,
    ) -> torch.Tensor: ...  # fmt: skip

    @overload
    def forward(
        self, q: int, k_len: int | None = None, *, q_offset: int | None = None
    ) -> torch.Tensor: ...

    def forward(self, q: torch.Tensor | int, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Attention with this bias, ``module(q, k, v, ...)``; :meth:`table` for an int q_len."""
        if isinstance(q, int):  # the old meaning of calling the module
            return self.table(q, *args, **kwargs)
        out: torch.Tensor = super().forward(q, *args, **kwargs)
        return out

    def table(
        self, q_len: int, k_len: int | None = None, *, q_offset: int | None = None
    ) -> torch.Tensor:
        """Bias ``(num_heads, q_len, k_len)`` for keys ``0..k_len-1`` and queries from ``q_offset``.

        ``k_len`` defaults to ``q_len`` and ``q_offset`` to ``k_len - q_len``
        (queries aligned with the last keys).
        """
        q_len = check_int("q_len", q_len, minimum=1)
        k_len = q_len if k_len is None else check_int("k_len", k_len, minimum=1)
        q_offset = check_offset(q_len, k_len, q_offset, causal=False)
        device = self.weight.device
        return self.bias_from_positions(
            torch.arange(q_len, device=device) + q_offset, torch.arange(k_len, device=device)
        )

    def bias_from_positions(self, q_positions: Positions, k_positions: Positions) -> torch.Tensor:
        """Bias ``(num_heads, q_len, k_len)`` for explicit integer positions.

        Per-sample positions ``(batch, len)`` give ``(batch, num_heads, q_len, k_len)``.
        """
        q_positions = as_positions("q_positions", q_positions, device=self.weight.device)
        k_positions = as_positions("k_positions", k_positions, device=self.weight.device)
        # Embedding lookup gives (..., q_len, k_len, heads); heads move before (q_len, k_len).
        bias = self.weight[self._buckets(q_positions, k_positions)].movedim(-1, -3)
        if has_values(q_positions) and has_values(k_positions):
            return bias  # as_positions has checked the values
        # traced: positions could not be checked; NaN where one is out of range
        bad = beyond_limit(q_positions)[..., :, None] | beyond_limit(k_positions)[..., None, :]
        return bias.masked_fill(bad.unsqueeze(-3), float("nan"))

    def bias(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        ctx: CallContext | Positions,
        *legacy: Positions | float | None,
    ) -> torch.Tensor:
        """The dense bias at the context's positions, ``(num_heads, q_len, k_len)``.

        Also accepts the old form ``bias(q, k, q_positions, k_positions, scale)``.
        """
        check_tensor("q", q)
        ctx = as_context(q, k, ctx, *legacy, hook=f"{type(self).__name__}.bias")
        check_heads(f"{type(self).__name__}({self.num_heads})", q, self.num_heads)
        return self.bias_from_positions(ctx.q_positions, ctx.k_positions)

    def score_mod(self, ctx: CallContext) -> ScoreMod:
        """``score + weight[bucket(k_pos - q_pos), h]``, the bucket found score by score.

        Within a direction the bucket of distance ``n`` is ``min(n, E) +
        #{b: n >= boundary_b}`` over the boundaries of the logarithmic buckets
        (found once by bisection on the float64 formula): exactly
        :func:`t5_relative_bucket`, with ``O(num_buckets)`` memory whatever
        ``max_distance``.
        """
        per_direction = self.num_buckets // 2 if self.bidirectional else self.num_buckets
        key = (ctx.device, per_direction, self.max_distance)
        bounds = self._boundaries.get(key)
        if bounds is None:  # on ctx.device: the same float64 log as t5_relative_bucket there
            bounds = _log_boundaries(per_direction, self.max_distance, ctx.device)
            if not tracing() and not symbolic(bounds):  # never keep a traced or fake tensor
                self._boundaries[key] = bounds
        work = torch.promote_types(ctx.dtype, torch.float32)
        table = self.weight.t().to(device=ctx.device, dtype=work)  # (num_heads, num_buckets)
        # constants as tensors: a Python int captured here would be traced as a symbol
        exact, per = torch.tensor([per_direction // 2, per_direction], device=ctx.device)
        bidirectional = self.bidirectional

        def mod(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
        ) -> torch.Tensor:
            rel = k_pos - q_pos
            base: torch.Tensor | int
            if bidirectional:
                n, base = rel.abs(), torch.where(rel > 0, per, 0)
            else:
                n, base = (-rel).clamp(min=0), 0
            bucket = torch.minimum(n, exact) + base
            for i in range(bounds.shape[0]):  # unrolled: elementwise ops only
                bucket = bucket + (n >= bounds[i]).long()
            return score + table[h, bucket]

        return mod

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, "
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}"
        )
