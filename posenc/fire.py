"""FIRE: functional interpolation for relative positions (Li et al., 2024).

FIRE adds to the scaled score of query position ``i`` and key position ``j``
in head ``h`` a learned function of the distance, normalised by the query's
own position:

    b_h(i, j) = f_theta( psi(i - j) / psi(max(L, i)) )[h],    psi(x) = log(c * x + 1)

* ``f_theta`` is a small MLP, ``1 -> mlp_width -> num_heads`` with a ReLU,
  shared by the heads (one output per head);
* ``psi`` stretches short distances (``c > 0`` is learned);
* dividing by ``psi(i)`` (*progressive interpolation*) maps every causal pair
  into ``[0, 1]`` whatever the sequence length, so a longer context feeds
  ``f_theta`` the interval it was trained on;
* the learned threshold ``L`` keeps short contexts from being over-normalised:
  for ``i <= L`` the normaliser is the constant ``psi(L)`` and the bias is a
  function of ``i - j`` alone.

The bias depends on ``(i, j)`` only through the ratio
``r = psi(i - j) / psi(max(L, i))`` (:meth:`FIRE.ratio`).

Conventions the paper leaves to its code
----------------------------------------
posenc follows the PyTorch listing in the paper's appendix: width 32, ReLU,
``c`` initialised at 0.1, ``L = |L_multiplier * init_L|`` with ``init_L = 512``
fixed and the multiplier learned (starting at 1), ``eps = 1e-6`` added to the
denominator, and ``psi`` taken of ``|c * x|``, so that ``c`` drifting negative
in training leaves the logarithm defined.

FIRE is defined for causal attention (``j <= i``), the only setting of the
paper.  For keys after the query (``j > i``, bidirectional attention) posenc
keeps the listing's ``|i - j|``: a key ``t`` places after the query gets the
bias of the key ``t`` places before it.  Negative query positions take the
normaliser ``psi(L)``.

Paths: :meth:`FIRE.score_mod` evaluates the MLP score by score inside the
FlexAttention kernel (no O(n^2) tensor); the eager path evaluates the same
function on the grid of positions (a dense ``(heads, q_len, k_len)`` bias).
Both compute in float32 at least (float64 for float64 inputs).

Inside the fused kernel on a CPU the two logarithms of the ratio are read from
tables instead of evaluated per score: ``psi`` over the distances of the call
and the normaliser ``psi(max(L, i)) + eps`` over its query positions, each
computed with the operations of the formula and divided as in it, so the ratio
is the eager path's to rounding.  The tables have static sizes (powers of two of at least
256) and cover fewer than ``q_len + k_len`` values; where the distances or the
query positions span more (positions far apart), the kernel evaluates that
part directly (see :func:`posenc.kerple.kernel_tables`, shared with Kerple).
The hidden units of ``f_theta`` are summed in four interleaved partial sums
on both paths, so that the compiled kernel adds along four independent chains
rather than one of ``mlp_width`` dependent additions.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import as_positions, check_build_args, check_float, check_int
from ._types import Positions, ScoreMod
from .context import CallContext
from .kerple import kernel_tables, lookup, static_table
from .scheme import PositionalScheme

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FIRE"]

# Elementwise maps on float tensors: psi or the normaliser (one argument), the ratio (two).
_Map = Callable[[torch.Tensor], torch.Tensor]
_Ratio = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class FIRE(PositionalScheme):
    """FIRE's learned, length-normalised relative bias (Li et al., 2024).

    Parameters
    ----------
    num_heads
        Number of query heads ``H``: the MLP ``f_theta`` has ``H`` outputs.
        Keys may have fewer heads (grouped-query attention).
    mlp_width
        Hidden width of ``f_theta``, an integer >= 1 (32, as in the paper's
        code).
    init_c
        Initial value of the learned ``c`` in ``psi(x) = log(c x + 1)``, a
        finite number > 0 (0.1).
    init_L
        Initial threshold ``L`` of the normaliser ``psi(max(L, i))``, a finite
        number > 0 (512; :meth:`build` takes a quarter of ``max_len``).  ``L``
        is learned through :attr:`L_multiplier`.
    eps
        Added to the denominator ``psi(max(L, i))``, a finite number > 0
        (1e-6); fixed, not learned.

    The names are the paper's.  The MLP's weights take ``nn.Linear``'s
    default initialisation, from torch's global generator.

    Attributes
    ----------
    mlp
        ``f_theta``: ``Linear(1, mlp_width)``, ReLU, ``Linear(mlp_width, num_heads)``.
    c
        Learnable scalar ``c``.
    L_multiplier
        Learnable scalar; :attr:`L` is ``|L_multiplier * init_L|``.
    init_L
        Buffer: the fixed scale of ``L``.

    Notes
    -----
    Calling :func:`posenc.attention` with ``encoding=fire`` adds ``b_h(i, j)``
    to the scaled scores; :meth:`bias_from_positions` returns the bias alone,
    ``(num_heads, q_len, k_len)`` (``(batch, num_heads, q_len, k_len)`` for
    per-sample positions).

    Examples
    --------
    >>> import torch, posenc
    >>> fire = posenc.FIRE(4, init_L=8.0).double()
    >>> fire.L.item()
    8.0
    >>> r = fire.ratio(range(12), range(12))   # (q_len, k_len), what the bias depends on
    >>> r.shape, bool((r.diagonal() == 0).all()), bool(((r.tril() >= 0) & (r.tril() <= 1)).all())
    (torch.Size([12, 12]), True, True)
    >>> bool(fire.ratio([3], [0]) == fire.ratio([7], [4]))   # i <= L: a function of i - j
    True
    >>> round(fire.ratio([16], [0]).item(), 4)   # beyond L: the farthest key gets about 1
    1.0
    >>> fire.bias_from_positions(range(6), range(6)).shape
    torch.Size([4, 6, 6])
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 4, 6, 8, generator=g, dtype=torch.float64)
    >>> posenc.attention(q, k, v, encoding=fire, causal=True).shape
    torch.Size([1, 4, 6, 8])
    """

    quadratic_memory = True  # the eager path builds the dense bias; the fused path does not
    reference = "li2024fire"

    init_L: torch.Tensor  # a buffer, 0-d

    def __init__(
        self,
        num_heads: int,
        *,
        mlp_width: int = 32,
        init_c: float = 0.1,
        init_L: float = 512.0,  # noqa: N803  (the paper's name)
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.mlp_width = check_int("mlp_width", mlp_width, minimum=1)
        init_c = check_float("init_c", init_c, positive=True)
        init_L = check_float("init_L", init_L, positive=True)  # noqa: N806
        self.eps = check_float("eps", eps, positive=True)
        self.mlp = nn.Sequential(
            nn.Linear(1, self.mlp_width), nn.ReLU(), nn.Linear(self.mlp_width, self.num_heads)
        )
        self.c = nn.Parameter(torch.tensor(init_c))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))
        self.register_buffer("init_L", torch.tensor(init_L))

    def _layers(self) -> tuple[nn.Linear, nn.Linear]:
        """The two linear layers of ``f_theta``."""
        first, second = self.mlp[0], self.mlp[2]
        assert isinstance(first, nn.Linear) and isinstance(second, nn.Linear)
        return first, second

    @property
    def L(self) -> torch.Tensor:  # noqa: N802  (the paper's name)
        """The threshold ``L = |L_multiplier * init_L|``, a 0-d tensor."""
        return (self.L_multiplier * self.init_L).abs()

    def _work(self, dtype: torch.dtype) -> torch.dtype:
        return torch.promote_types(torch.promote_types(dtype, torch.float32), self.c.dtype)

    def _parts(self, work: torch.dtype, device: torch.device) -> tuple[_Map, _Map]:
        """``psi`` and the normaliser ``psi(max(L, i)) + eps``, on float tensors."""
        c = self.c.to(device=device, dtype=work)
        L = self.L.to(device=device, dtype=work)  # noqa: N806
        eps = self.eps

        def psi(x: torch.Tensor) -> torch.Tensor:
            return torch.log1p(torch.abs(c * x))

        def normaliser(q_pos: torch.Tensor) -> torch.Tensor:
            return psi(torch.maximum(q_pos, L)) + eps

        return psi, normaliser

    def _interpolate(self, work: torch.dtype, device: torch.device) -> _Ratio:
        """``r(q_pos, k_pos)``, elementwise on tensors or 0-d kernel indices."""
        psi, normaliser = self._parts(work, device)

        def ratio(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
            return psi((q_pos - k_pos).to(work)) / normaliser(q_pos.to(work))

        return ratio

    def ratio(self, q_positions: Positions, k_positions: Positions) -> torch.Tensor:
        """``psi(i - j) / psi(max(L, i))``, ``(..., q_len, k_len)``: what the bias depends on.

        Integer positions (tensors or sequences of ints) ``(q_len,)`` and
        ``(k_len,)``, or ``(batch, len)``.
        """
        q_positions = as_positions("q_positions", q_positions, device=self.c.device)
        k_positions = as_positions("k_positions", k_positions, device=self.c.device)
        ratio = self._interpolate(self._work(self.c.dtype), self.c.device)
        return ratio(q_positions[..., :, None], k_positions[..., None, :])

    def _check(self, ctx: CallContext) -> None:
        if ctx.heads != self.num_heads:
            raise ValueError(
                f"q must have num_heads={self.num_heads} heads for FIRE({self.num_heads}), "
                f"got {ctx.heads}"
            )

    def score_mod(self, ctx: CallContext) -> ScoreMod:
        """``score + f_theta(r)[h]``, the MLP unrolled into elementwise operations.

        Written without reductions so that FlexAttention can run it score by
        score inside its kernel; on index grids it gives the dense bias.  The
        hidden units are summed in four interleaved partial sums.  Inside the
        fused kernel on a CPU, ``psi(i - j)`` and ``psi(max(L, i)) + eps`` are
        read from tables over the call's distances and query positions
        (computed here, by the formula, with static power-of-two sizes) while
        each range spans fewer than ``q_len + k_len`` values.
        """
        self._check(ctx)
        work = self._work(ctx.dtype)
        ratio = self._interpolate(work, ctx.device)
        first, second = self._layers()
        w1 = first.weight[:, 0].to(device=ctx.device, dtype=work)
        b1 = first.bias.to(device=ctx.device, dtype=work)
        w2 = second.weight.t().to(device=ctx.device, dtype=work)  # (width, heads)
        b2 = second.bias.to(device=ctx.device, dtype=work)
        width = self.mlp_width
        kernel = self._kernel_ratio(ctx, work)

        def mod(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
        ) -> torch.Tensor:
            if kernel is not None and q_pos.dim() == 0:  # one score, inside the fused kernel
                x = kernel(q_pos, k_pos)
            else:
                x = ratio(q_pos, k_pos)
            # f_theta, its hidden units summed in four interleaved partial sums
            sums: list[torch.Tensor | float] = [0.0, 0.0, 0.0, 0.0]
            for m in range(width):
                sums[m % 4] = sums[m % 4] + w2[m][h] * torch.relu(w1[m] * x + b1[m])
            return score + (b2[h] + ((sums[0] + sums[1]) + (sums[2] + sums[3])))

        return mod

    def _kernel_ratio(self, ctx: CallContext, work: torch.dtype) -> _Ratio | None:
        """The ratio inside the fused CPU kernel, its logarithms read from tables, or ``None``.

        ``psi`` over the call's distances and the normaliser over its query
        positions are tabulated by the formula's own operations, then divided
        as in :meth:`ratio`; a part whose range is too wide for a table (see
        :func:`posenc.kerple.kernel_tables`) is evaluated directly.
        """
        plan = kernel_tables(ctx, *self.parameters())
        if plan is None:
            return None
        psi, normaliser = self._parts(work, ctx.device)
        distances = normaliser_table = None
        d_last, q_last, q_lo = (plan.distances or 1) - 1, (plan.queries or 1) - 1, plan.q_lo
        if plan.distances is not None:
            d = torch.arange(plan.distances, device=ctx.device)
            distances = static_table(psi(d.to(work)))
        if plan.queries is not None:
            q = q_lo + torch.arange(plan.queries, device=ctx.device)
            normaliser_table = static_table(normaliser(q.to(work)))

        def kernel(q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
            if distances is not None:
                num = lookup(distances, (q_pos - k_pos).abs().clamp(max=d_last))
            else:
                num = psi((q_pos - k_pos).to(work))
            if normaliser_table is not None:
                den = lookup(normaliser_table, (q_pos - q_lo).clamp(0, q_last))
            else:
                den = normaliser(q_pos.to(work))
            return num / den

        return kernel

    def bias_from_positions(self, q_positions: Positions, k_positions: Positions) -> torch.Tensor:
        """The bias ``(num_heads, q_len, k_len)`` (``(batch, ...)`` for ``(batch, len)`` positions).

        Computed with ``f_theta`` as a plain MLP on the ratios (float32 at
        least), independently of :meth:`score_mod`'s unrolled form.
        """
        r = self.ratio(q_positions, k_positions).unsqueeze(-1)
        first, second = self._layers()
        hidden = torch.relu(F.linear(r, first.weight.to(r.dtype), first.bias.to(r.dtype)))
        return F.linear(hidden, second.weight.to(r.dtype), second.bias.to(r.dtype)).movedim(-1, -3)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, mlp_width={self.mlp_width}, eps={self.eps:g}"

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
        """``init_L = max_len / 4`` when the training length is known, else 512.

        The paper trains at length 2048 with ``L`` starting at 512; a quarter of
        the training length keeps that ratio, so that a model trained on short
        sequences also sees the normaliser grow with ``i``.
        """
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        if max_len is not None:
            options.setdefault("init_L", max_len / 4)
        return cls(num_heads, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """Random ``f_theta`` and a small threshold (``L = 3``), so that both regimes show."""
        g = torch.Generator().manual_seed(0)
        fire = cls(num_heads, mlp_width=8, init_c=0.7, init_L=3.0)
        with torch.no_grad():
            for p in fire.mlp.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        return {"": fire}
