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
  rounds once and raises ``ValueError`` when a value would overflow or
  become subnormal.

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
        limit = self.position_limit(like.dtype)
        check_position_values("positions", positions)  # p - centre must not wrap around
        shift = positions.to(torch.int64) - self.centre
        if shift.numel() and has_values(shift) and bool((shift.abs() > limit).any()):
            lo, hi = int(shift.min()) + self.centre, int(shift.max()) + self.centre
            raise ValueError(
                f"positions must lie within {limit} of centre={self.centre} for {like.dtype} "
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

    def _scale(self, x: torch.Tensor, positions: torch.Tensor, *, keys: bool) -> torch.Tensor:
        f = self.factors(positions, x, keys=keys)
        if positions.dim() == 2 and x.dim() == 4:  # (batch, len): shared by the heads
            f = f.unsqueeze(1)
        return x.to(f.dtype) * f

    def _check_representable(
        self, name: str, x: torch.Tensor, scaled: torch.Tensor, positions: torch.Tensor
    ) -> None:
        """Refuse scaled values that ``x``'s dtype would round to inf or to a subnormal.

        The factors are computed and applied in float32 and rounded once to a
        float16 or bfloat16 input's dtype; a large factor times a key of size 5
        can exceed float16's 65504 well inside :meth:`position_limit`, and a
        small one can push a query below its normal range, where the score
        loses its precision.
        """
        if scaled.dtype == x.dtype or not has_values(scaled) or not scaled.numel():
            return
        info = torch.finfo(x.dtype)
        size = scaled.abs()
        lost = (size > info.max) | ((size < info.tiny) & (x.abs() >= info.tiny))
        if bool(lost.any()):
            lo, hi = int(positions.min()), int(positions.max())
            raise ValueError(
                f"xPos scales {name} outside the normal range of {x.dtype} at positions {lo} to "
                f"{hi} (|{name}| * zeta**(+-(p - centre)/scale_base) reaches "
                f"{float(size.max()):.3g}, or leaves a normal value below {info.tiny:.3g}), so "
                f"its scores would overflow or lose their precision; choose a centre nearer to "
                f"the positions (centre={(lo + hi) // 2}, say), a larger scale_base or float32"
            )

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Scale and rotate ``q`` ``(batch, heads, q_len, d)`` and ``k`` at their positions.

        Queries are multiplied by ``zeta ** ((m - centre) / scale_base)`` and
        keys by ``zeta ** (-(n - centre) / scale_base)``, pair by pair, then
        rotated as by RoPE at ``ctx.q_positions`` and ``ctx.k_positions``.
        Returns ``(q, k)`` in their dtypes.
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
        self._check_representable("q", q, qs, ctx.q_positions)
        self._check_representable("k", k, ks, ctx.k_positions)
        # the factor is shared by the two features of a pair, so it commutes with the rotation
        qr, kr = self.rope.rotate(qs, ks, ctx)
        return qr.to(q.dtype), kr.to(k.dtype)

    def extra_repr(self) -> str:
        s = f"head_dim={self.head_dim}, base={self.base}, scale_base={self.scale_base}"
        s += f", layout={self.layout!r}"
        if self.centre:
            s += f", centre={self.centre}"
        return s
