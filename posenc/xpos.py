"""xPos: RoPE whose scores decay with distance (Sun et al., 2023).

xPos keeps RoPE's rotation and adds a real factor per rotated pair.  Pair
``i`` of the ``d/2`` pairs of a head of size ``d`` has

    zeta_i = (2i + gamma d) / ((1 + gamma) d),    gamma = 0.4,

so ``zeta_i`` runs from ``0.4 / 1.4`` (the fastest-turning pair) to nearly 1
(the slowest).  The query at position ``m`` is multiplied by
``zeta_i ** (m / scale_base)`` and the key at position ``n`` by
``zeta_i ** (-n / scale_base)`` before the rotation; the score of the pair is
then RoPE's score times ``zeta_i ** ((m - n) / scale_base)``: still a function
of ``m - n`` only, and decaying geometrically as the key falls behind the
query.  (The paper writes ``zeta^n``; its released code, torchscale, divides
the position by ``scale_base = 512``, and so does every later implementation.)

The centre
----------
The factors themselves are not relative: ``zeta_0 ** (40000 / 512)`` is below
the smallest normal float32 and its reciprocal, the key's factor, overflows.
Any fixed shift ``c`` of the positions cancels in the score,
``zeta ** ((m - c) - (n - c))``, so the factors are taken relative to a centre:
``zeta_i ** ((m - centre) / scale_base)`` for queries and
``zeta_i ** (-(n - centre) / scale_base)`` for keys.

* torchscale and rotary-embedding-torch (``use_xpos=True``) centre each call at
  ``seq_len // 2``.  That leaves every score unchanged but changes the stored
  keys whenever the length changes, so a cache of transformed keys cannot be
  kept (torchscale transforms every cached key again at each decoding step).
* posenc uses one fixed ``centre`` per module (default 0, the paper's absolute
  positions), so :class:`posenc.KVCache` scales each key once, when it is
  added.  ``XPos(d, centre=L // 2, layout="interleaved")`` reproduces
  rotary-embedding-torch's rotated queries and keys for a sequence of length
  ``L``; the attention output is the same for every centre.
* A position farther than :meth:`XPos.position_limit` from the centre would
  push a factor outside the normal range of the dtype; it raises
  ``ValueError`` (under ``torch.compile``/``torch.export`` and transforms,
  where values cannot be read, those rows become NaN instead of silently
  wrong).  The limit is ``scale_base * ln(1 / tiny) / ln(1 / zeta_0)``: about
  35 700 positions for float32 and bfloat16 and 3 960 for float16 at
  ``scale_base = 512``; float64 reaches about 290 000.  In float16 and
  bfloat16 the scaled queries and keys must also fit the dtype, which depends
  on their size: a factor of 14 000 (position 3 900 in float16) times a key
  of size 5 exceeds float16's 65 504.  :meth:`XPos.rotate` scales in float32,
  rounds once and raises ``ValueError`` when a value would overflow, or when
  the factors push normal entries to subnormals that cost some score more
  accuracy than rounding to the dtype does anyway (entries already tiny in the
  input, or too small to matter in the score, are not refused: see
  :meth:`XPos.rotate`).  The message names a centre that fits the call when
  one does (the middle of its positions), and float32 always does.

Conventions are RoPE's (:mod:`posenc.rope`): counter-clockwise rotation,
``layout="half"`` pairs features ``(i, i + d/2)`` and ``"interleaved"`` pairs
``(2i, 2i + 1)``; the factor of pair ``i`` multiplies both features of the
pair.  Factors are computed in float64 and applied in float32 or better; a
bf16/fp16 result is rounded once.
"""

from __future__ import annotations

import math

import torch

from ._angles import compute_dtype
from ._checks import check_even, check_float, check_floating, check_int, check_position_values
from ._runtime import has_values
from .context import CallContext
from .rope import RotaryEmbedding
from .scheme import PositionalScheme
from .sdpa import repeat_kv

__all__ = ["XPos", "xpos_zeta"]

GAMMA = 0.4  # the paper's gamma in zeta_i = (2i + gamma d) / ((1 + gamma) d)
# log(1 / zeta_0) = log((1 + gamma) / gamma): the fastest decay, the same for every head size
_FASTEST = math.log((1 + GAMMA) / GAMMA)


def xpos_zeta(head_dim: int) -> torch.Tensor:
    """The per-pair decay ``zeta_i = (2i + 0.4 d) / (1.4 d)``, float64 ``(head_dim // 2,)``.

    Every entry lies in ``[0.4 / 1.4, 1)``, increasing with ``i``.

    Parameters
    ----------
    head_dim
        Size ``d`` of a query/key head (even).

    Returns
    -------
    Tensor
        float64 ``(head_dim // 2,)``.

    Examples
    --------
    >>> import posenc
    >>> posenc.xpos_zeta(8).round(decimals=4).tolist()
    [0.2857, 0.4643, 0.6429, 0.8214]
    """
    d = check_even("head_dim", head_dim)
    two_i = torch.arange(0, d, 2, dtype=torch.float64)
    return (two_i + GAMMA * d) / ((1 + GAMMA) * d)


class XPos(PositionalScheme):
    """xPos as a :class:`~posenc.PositionalScheme`: RoPE with a relative decay.

    In the paper's symbols: head size ``d``, pair ``i`` turning by
    ``theta_i = base ** (-2i/d)`` radians per position, decay ``zeta_i =
    (2i + gamma d) / ((1 + gamma) d)`` with ``gamma = 0.4`` (fixed, as in the
    paper and both implementations); :attr:`zeta` holds it.

    Parameters
    ----------
    head_dim
        Size ``d`` of each query/key head (even); every feature is rotated.
    base
        RoPE's frequency base (``theta`` in rotary-embedding-torch).
    scale_base
        Positions are divided by it in the exponent of ``zeta`` (``scale_base``
        in torchscale, ``xpos_scale_base`` in rotary-embedding-torch; 512 in
        both).  Larger means a slower decay.
    layout
        ``"half"`` (GPT-NeoX/transformers pairing) or ``"interleaved"``
        (RoFormer, torchscale and rotary-embedding-torch).
    centre
        Position at which both factors are 1 (see the module docstring); an
        integer, default 0.  Scores do not depend on it.

    Notes
    -----
    Shapes: queries ``(batch, heads, q_len, head_dim)``, keys ``(batch,
    kv_heads, k_len, head_dim)``, positions ``(len,)`` or ``(batch, len)``.
    The queries' factors are ``zeta ** ((m - centre) / scale_base)`` and the
    keys' their reciprocals at the keys' positions; the result has the dtype
    of the input.  No O(q_len * k_len) tensor is built: the fused path
    (``backend="flex"``) and the eager one (SDPA) both take the transformed
    ``q`` and ``k`` with no score change.  :class:`posenc.KVCache` calls
    :meth:`rotate` once per token and caches the keys scaled and rotated.

    Examples
    --------
    >>> import torch, posenc
    >>> xpos = posenc.XPos(64)
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 10, 64, generator=g, dtype=torch.float64)
    >>> posenc.attention(q, k, v, encoding=xpos, causal=True).shape
    torch.Size([1, 2, 10, 64])

    Scores depend only on the distance between positions, as with RoPE:

    >>> near = posenc.CallContext.of(q, k)
    >>> far = posenc.CallContext.of(q, k, q_positions=torch.arange(10) + 300,
    ...                             k_positions=torch.arange(10) + 300)
    >>> qa, ka = xpos.rotate(q, k, near)
    >>> qb, kb = xpos.rotate(q, k, far)
    >>> torch.allclose(qa @ ka.mT, qb @ kb.mT)
    True
    """

    reference = "sun2023xpos"
    float64_buffers = ("log_zeta",)

    log_zeta: torch.Tensor  # a buffer, float64 ``(head_dim // 2,)``

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        scale_base: float = 512.0,
        layout: str = "half",
        centre: int = 0,
    ) -> None:
        super().__init__()
        self.head_dim = check_even("head_dim", head_dim)
        self.scale_base = check_float("scale_base", scale_base, positive=True)
        self.centre = check_int("centre", centre)
        if abs(self.centre) >= 2**31:
            raise ValueError(f"centre must lie strictly within 2**31 of 0, got {self.centre}")
        self.rope = RotaryEmbedding(self.head_dim, base=base, layout=layout)
        # log(zeta_i), float64 whatever module.to(dtype) does (float64_buffers)
        self.register_buffer("log_zeta", torch.log(xpos_zeta(self.head_dim)), persistent=False)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        # scale_base 8 instead of 512: over a few positions the decay is then far from 1
        return {
            "": cls(head_dim, scale_base=8.0),
            "interleaved": cls(head_dim, scale_base=8.0, layout="interleaved", centre=3),
        }

    @property
    def base(self) -> float:
        return self.rope.base

    @property
    def layout(self) -> str:
        return self.rope.layout

    @property
    def zeta(self) -> torch.Tensor:
        """``zeta_i``, float64 ``(head_dim // 2,)``."""
        return self.log_zeta.exp()

    def position_limit(self, dtype: torch.dtype = torch.float32) -> int:
        """Largest ``|position - centre|`` whose factors are normal numbers of ``dtype``."""
        tiny = torch.finfo(dtype).tiny
        return math.floor(self.scale_base * math.log(1 / tiny) / _FASTEST)

    def factors(self, positions: torch.Tensor, like: torch.Tensor, *, keys: bool) -> torch.Tensor:
        """Per-feature factors ``(*positions.shape, head_dim)`` in ``like``'s compute precision.

        ``zeta ** ((p - centre) / scale_base)`` for queries, its reciprocal
        for ``keys=True``; each pair's factor appears at both of its features
        (as laid out by ``layout``).  A position beyond :meth:`position_limit`
        for ``like.dtype`` raises ``ValueError`` when values are readable and
        gives NaN otherwise.
        """
        return self._factors(positions, like, keys=keys, centre=self.centre)

    def _factors(
        self, positions: torch.Tensor, like: torch.Tensor, *, keys: bool, centre: int
    ) -> torch.Tensor:
        limit = self.position_limit(like.dtype)
        check_position_values("positions", positions)  # p - centre must not wrap around
        shift = positions.to(torch.int64) - centre
        if shift.numel() and has_values(shift) and bool((shift.abs() > limit).any()):
            lo, hi = int(shift.min()) + centre, int(shift.max()) + centre
            raise ValueError(
                f"positions must lie within {limit} of centre={centre} for {like.dtype} "
                f"(beyond, the xPos factors zeta**(+-(p - centre)/scale_base) leave the range of "
                f"normal numbers); got positions from {lo} to {hi}: choose a centre nearer to "
                f"them, a larger scale_base or a wider dtype"
            )
        exponent = shift.to(torch.float64) / self.scale_base
        if keys:
            exponent = -exponent
        log_zeta = self.log_zeta.to(positions.device)
        f = torch.exp(exponent[..., None] * log_zeta)
        f = torch.where((shift.abs() <= limit)[..., None], f, torch.nan)
        f = f.to(compute_dtype(like.dtype))
        if self.layout == "interleaved":
            return f.repeat_interleave(2, dim=-1)
        return torch.cat((f, f), dim=-1)

    def _scale(
        self, x: torch.Tensor, positions: torch.Tensor, *, keys: bool, centre: int | None = None
    ) -> torch.Tensor:
        centre = self.centre if centre is None else centre
        f = self._factors(positions, x, keys=keys, centre=centre)
        if positions.dim() == 2 and x.dim() == 4:  # (batch, len): shared by the heads
            f = f.unsqueeze(1)
        return x.to(f.dtype) * f

    def _check_representable(
        self,
        q: torch.Tensor,
        qs: torch.Tensor,
        k: torch.Tensor,
        ks: torch.Tensor,
        ctx: CallContext,
    ) -> None:
        """Refuse scaled values whose rounding to the dtype loses more than it (see :meth:`rotate`).

        ``qs`` and ``ks`` are the float32 scaled values of a float16/bfloat16
        ``q`` and ``k``; nothing is checked for other dtypes or when values
        cannot be read (traced).
        """
        if qs.dtype == q.dtype or not (has_values(qs) and has_values(ks)):
            return
        if not qs.numel() or not ks.numel():
            return
        problem = _precision_loss(q, qs, ks, "q", ctx.q_positions)
        problem = problem or _precision_loss(k, ks, qs, "k", ctx.k_positions)
        if problem is None:
            return
        # advice that works: the centre in the middle of the call's positions, checked here
        pos = torch.cat((ctx.q_positions.flatten(), ctx.k_positions.flatten()))
        middle = (int(pos.min()) + int(pos.max())) // 2
        advice = ""
        if middle != self.centre:
            try:
                q2 = self._scale(q, ctx.q_positions, keys=False, centre=middle)
                k2 = self._scale(k, ctx.k_positions, keys=True, centre=middle)
            except ValueError:  # beyond the position limit of the dtype around that centre
                pass
            else:
                fine = _precision_loss(q, q2, k2, "q", ctx.q_positions) is None
                if fine and _precision_loss(k, k2, q2, "k", ctx.k_positions) is None:
                    advice = (
                        f"XPos(..., centre={middle}) (the middle of the positions: the scores "
                        f"do not depend on the centre, and there they fit), or "
                    )
        raise ValueError(
            f"xPos scales {problem} (centre={self.centre}, scale_base={self.scale_base}); use "
            f"{advice}float32 inputs"
        )

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale and rotate ``q`` ``(batch, heads, q_len, d)`` and ``k`` at their positions.

        Queries are multiplied by ``zeta ** ((m - centre) / scale_base)`` and
        keys by ``zeta ** (-(n - centre) / scale_base)``, pair by pair, then
        rotated as by RoPE at ``ctx.q_positions`` and ``ctx.k_positions``.
        Returns ``(q, k)`` in their dtypes.

        In float16 and bfloat16 the scaled values are computed in float32 and
        rounded once, and the call is refused (``ValueError``) when that
        rounding would lose more than the dtype's own.  A value past the
        dtype's largest overflows.  A value the factor pushes from the normal
        range to a subnormal is rounded with an absolute error up to
        ``tiny * u`` (``u`` the unit roundoff: ``2**-11`` in float16,
        ``2**-8`` in bfloat16) instead of a relative ``u``; it is refused only
        if, for some query ``q'`` and key ``k'`` of the call, the error those
        roundings can add to the score, ``tiny * u * sum |k'_j|`` over the
        query's pushed entries ``j``, exceeds the error rounding ``q'`` to the
        dtype may cost that score anyway, ``u * sum_j |q'_j k'_j|`` (and the
        same for keys).  Entries already subnormal in the input are not
        counted.  The check reads values, so it runs eagerly only.
        """
        q = check_floating("q", q, min_dim=2)
        k = check_floating("k", k, min_dim=2)
        for name, t in (("q", q), ("k", k)):
            if t.shape[-1] != self.head_dim:
                raise ValueError(
                    f"{name} must have last dimension head_dim={self.head_dim}, got {t.shape[-1]}"
                )
        qs = self._scale(q, ctx.q_positions, keys=False)
        ks = self._scale(k, ctx.k_positions, keys=True)
        self._check_representable(q, qs, k, ks, ctx)
        # the factor is shared by the two features of a pair, so it commutes with the rotation
        qr, kr = self.rope.rotate(qs, ks, ctx)
        return qr.to(q.dtype), kr.to(k.dtype)

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, base={self.base}, scale_base={self.scale_base}"
        s += f", layout={self.layout!r}"
        if self.centre:
            s += f", centre={self.centre}"
        return s


# ---------------------------------------------------------------------- precision in fp16/bf16

_CHUNK = 1 << 22  # elements of the (rows, len, d) block the check gathers at a time


def _precision_loss(
    x: torch.Tensor, xs: torch.Tensor, other: torch.Tensor, name: str, positions: torch.Tensor
) -> str | None:
    """Why rounding ``xs`` (``x`` scaled, float32) to ``x.dtype`` loses accuracy, or None.

    ``other`` holds the scaled partners (keys for queries, and the reverse), with
    ``kv_heads`` dividing ``heads`` as in attention.  See
    :meth:`XPos._check_representable` for the criterion.
    """
    info = torch.finfo(x.dtype)
    size = xs.abs()
    if bool((size > info.max).any()):
        return (
            f"{name} outside the normal range of {x.dtype}: |{name}| * "
            f"zeta**(+-(p - centre)/scale_base) reaches {float(size.max()):.3g} at positions "
            f"{int(positions.min())} to {int(positions.max())}, beyond its largest value "
            f"{info.max:.6g}"
        )
    # entries the factor pushes from the normal range to a subnormal
    pushed = (size < info.tiny) & (x.abs() >= info.tiny)
    if not bool(pushed.any()):
        return None
    partners = other.abs()
    if xs.dim() >= 3 and partners.dim() == xs.dim() and partners.shape[-3] != xs.shape[-3]:
        mine, theirs = xs.shape[-3], partners.shape[-3]
        if mine % theirs == 0:  # queries: each key head serves mine // theirs query heads
            partners = repeat_kv(partners, mine)
        elif theirs % mine == 0:  # keys: their partners are the query heads of their group
            partners = partners.unflatten(-3, (mine, theirs // mine)).flatten(-3, -2)
        else:  # no grouping: compare every row with every partner
            pushed, size = (t.flatten(-3, -2).unsqueeze(-3) for t in (pushed, size))
            partners = partners.flatten(-3, -2).unsqueeze(-3)
    lead = torch.broadcast_shapes(size.shape[:-2], partners.shape[:-2])
    size = size.expand(*lead, *size.shape[-2:]).reshape(-1, *size.shape[-2:])
    pushed = pushed.expand(*lead, *pushed.shape[-2:]).reshape(-1, *pushed.shape[-2:])
    partners = partners.expand(*lead, *partners.shape[-2:]).reshape(-1, *partners.shape[-2:])
    rows = pushed.any(-1).nonzero()  # (slice, row) of every row with such an entry
    step = max(1, _CHUNK // max(1, partners.shape[-2] * partners.shape[-1]))
    worst = 0.0
    for chunk in rows.split(step):
        n, r = chunk.unbind(-1)
        block = partners[n]  # (rows, other_len, d)
        # bound on the error the subnormal roundings add to each score, over the error
        # rounding the row to the dtype may cost it anyway (the unit roundoff cancels)
        added = info.tiny * torch.einsum("cd,cld->cl", pushed[n, r].to(block.dtype), block)
        own = torch.einsum("cd,cld->cl", size[n, r], block)
        worst = max(worst, float((added / own.clamp_min(torch.finfo(own.dtype).tiny)).max()))
    if worst <= 1.0:
        return None
    count = int(pushed.sum())
    return (
        f"{name} outside the normal range of {x.dtype}: the factors "
        f"zeta**(+-(p - centre)/scale_base) push {count} normal entries of {name} below "
        f"{info.tiny:.3g} at positions {int(positions.min())} to {int(positions.max())}, where "
        f"their rounding can add {worst:.3g} times the error that rounding to {x.dtype} allows "
        f"a score"
    )
