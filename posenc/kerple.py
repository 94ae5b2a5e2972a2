"""Kerple: kernelized relative positional bias (Chi, Fan, Ramadge and Rudnicky, 2022).

Kerple adds to the scaled score of query position ``m`` and key position
``n`` in head ``h`` a learned function of the distance ``|m - n|``:

    kind="log":    b_h(m, n) = -r1_h * log(1 + r2_h * |m - n|),   r1_h, r2_h > 0
    kind="power":  b_h(m, n) = -r1_h * |m - n| ** r2_h,           r1_h > 0, 0 < r2_h <= 2

Both are conditionally positive definite (CPD) kernels of the positions:
``sum_ij c_i c_j b(x_i, x_j) >= 0`` whenever ``sum_i c_i = 0``.  A CPD kernel
plus a large enough constant is positive definite, and softmax cannot see a
constant added to a whole row; that is the paper's argument for using a CPD
kernel as an additive bias.  The power form with ``r2 = 1`` is ALiBi with a
learned slope.  The bias is 0 on the diagonal and < 0 elsewhere, symmetric in
``m`` and ``n``, so it serves causal and bidirectional attention alike.

Parametrisation
---------------
The paper's code (``chijames/KERPLE``, ``ParallelKerpleLog`` and
``ParallelKerplePower``) keeps ``r1`` and ``r2`` positive by clamping the
stored values in place at every forward pass (minimum 0.01, and at most 2 for
the power exponent).  Writing to parameters inside the forward cannot run
under ``torch.compile``, ``torch.export`` or ``vmap``, so posenc stores
unconstrained values and maps them instead: ``r1 = softplus(raw_r1)`` (both
forms), ``r2 = softplus(raw_r2)`` for ``"log"`` and ``r2 = 2 * sigmoid(raw_r2)``
for ``"power"`` (so ``0 < r2 < 2``).  Every value stays in range with a
nonzero gradient.  The initial values follow the paper's code (uniform on
``(0, 2)`` for the log form's ``r1`` and the power form's ``r2``, on ``(0, 1)``
for the other, raised to at least 0.01), drawn from torch's global generator,
or are given as ``r1=``/``r2=``.  To load a checkpoint of the paper's code, pass
its ``bias_p``/``bias_a`` values: log form ``r1 = bias_p``, ``r2 = bias_a``;
power form ``r1 = bias_a``, ``r2 = bias_p``.

Conventions are those of :mod:`posenc.scheme`.  Precision: distances and the
bias are computed in float32, or float64 for float64 inputs, on both paths.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ._checks import check_choice, check_float_dtype, check_int
from .context import CallContext
from .scheme import PositionalScheme

__all__ = ["Kerple"]

KINDS = ("log", "power")
# The paper's code clamps r1 and r2 to at least this; posenc's initial values do the same.
PAPER_EPS = 0.01


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    # softplus(x) = log(1 + e^x)  <=>  x = y + log(1 - e^-y), stable for small and large y
    return y + torch.log(-torch.expm1(-y))


class Kerple(PositionalScheme):
    """Kerple's learned CPD bias, per head, as a :class:`~posenc.PositionalScheme`.

    ``r1`` and ``r2`` are the paper's names; ``m`` and ``n`` are the query and
    key positions, ``H`` the number of heads.

    Parameters
    ----------
    num_heads
        Number of query heads ``H``; ``r1`` and ``r2`` have one entry per head.
    kind
        ``"log"``: ``-r1 * log(1 + r2 * |m - n|)`` (the paper's logarithmic
        variant); ``"power"``: ``-r1 * |m - n| ** r2`` (its power variant).
    r1, r2
        Initial values: a positive number, or one per head (a sequence or
        tensor of shape ``(num_heads,)``); for ``kind="power"``, ``r2`` lies in
        ``(0, 2)``.  Default: the paper's random initialisation.
    device, dtype
        Of the parameters, as for any ``nn.Module`` (default: the default
        dtype, on the CPU).  Initial values are mapped to the unconstrained
        parameters in float64 and rounded once.

    Attributes
    ----------
    raw_r1, raw_r2
        The learnable ``(num_heads,)`` parameters; :attr:`r1` and :attr:`r2`
        are the positive values they map to (see the module docstring).

    Queries must have ``num_heads`` heads; keys may have fewer (grouped-query
    attention).  :meth:`score_mod` is the whole scheme: FlexAttention
    (``backend="flex"``, or ``"auto"`` on long inputs) adds the bias score by
    score and builds no O(q_len * k_len) tensor; the eager path evaluates the
    same function into a dense ``(1, num_heads, q_len, k_len)`` bias
    (``(batch, ...)`` for per-sample positions).  Both compute in float32, or
    float64 for float64 inputs.
    """

    quadratic_memory = True  # the eager path's dense bias; the fused path has none
    reference = "chi2022kerple"

    def __init__(
        self, num_heads: int, kind: str = "log", *, r1=None, r2=None, device=None, dtype=None
    ):
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.kind = check_choice("kind", kind, KINDS)
        # the paper's initial ranges: -p log(1 + a|m-n|) with p ~ U(0, 2), a ~ U(0, 1);
        # -a |m-n|^p with a ~ U(0, 1), p ~ U(0, 2)
        r1_high, r2_high = (2.0, 1.0) if self.kind == "log" else (1.0, 2.0)
        r2_upper = 2.0 if self.kind == "power" else None
        r1 = self._initial("r1", r1, r1_high, upper=None)
        r2 = self._initial("r2", r2, r2_high, upper=r2_upper)
        # mapped in float64, then rounded once to the parameters' dtype
        dtype = check_float_dtype("dtype", torch.get_default_dtype() if dtype is None else dtype)
        self.raw_r1 = nn.Parameter(_inverse_softplus(r1).to(device=device, dtype=dtype))
        raw_r2 = _inverse_softplus(r2) if self.kind == "log" else torch.logit(r2 / 2)
        self.raw_r2 = nn.Parameter(raw_r2.to(device=device, dtype=dtype))
        # in the parameters' dtype, a value may overflow or round onto its range's boundary
        self._check_stored("r1", r1, self.r1, upper=None)
        self._check_stored("r2", r2, self.r2, upper=r2_upper)

    @classmethod
    def examples(cls, num_heads, head_dim):
        # one value per head, spread over each parameter's range, so that every head differs
        def spread(lo, hi):
            return torch.linspace(lo, hi, num_heads, dtype=torch.float64)

        return {
            "": cls(num_heads, "log", r1=spread(0.3, 2.0), r2=spread(0.2, 1.5)),
            "power": cls(num_heads, "power", r1=spread(0.2, 1.0), r2=spread(0.5, 1.9)),
        }

    def _initial(self, name, value, high, *, upper):
        h = self.num_heads
        if value is None:
            # uniform on (0, high) as in the paper's code, then its clamp at PAPER_EPS
            return (torch.rand(h, dtype=torch.float64) * high).clamp(min=PAPER_EPS)
        if isinstance(value, (bool, str, bytes)) or not (
            isinstance(value, (numbers.Real, torch.Tensor))
            or (isinstance(value, Sequence) and all(isinstance(x, numbers.Real) for x in value))
        ):
            raise TypeError(
                f"{name} must be a positive number or one per head (a sequence or tensor of "
                f"shape (num_heads,)), got {type(value).__name__} {value!r}"
            )
        t = torch.as_tensor(value, dtype=torch.float64)
        if t.is_complex() or t.dtype == torch.bool:
            raise TypeError(f"{name} must be real, got dtype {t.dtype}")
        if t.dim() == 0:
            t = t.expand(h)
        if t.shape != (h,):
            raise ValueError(
                f"{name} must be a number or have shape (num_heads,) = ({h},), "
                f"got shape {tuple(t.shape)}"
            )
        allowed = "> 0" if upper is None else f"in (0, {upper:g})"
        bad = ~torch.isfinite(t) | (t <= 0)
        if upper is not None:
            bad |= t >= upper
        if bool(bad.any()):
            raise ValueError(f"{name} must be finite and {allowed}, got {t.tolist()}")
        return t

    def _check_stored(self, name, wanted, stored, *, upper):
        """Refuse a value that the parameters' dtype stores as inf, 0 or its range's bound."""
        stored = stored.detach().double().cpu()
        bad = ~torch.isfinite(stored) | (stored <= 0)
        if upper is not None:
            bad |= stored >= upper
        if bool(bad.any()):
            dtype = self.raw_r1.dtype
            raise ValueError(
                f"{name}={wanted[bad].tolist()} cannot be stored in {dtype}: it maps to "
                f"{stored[bad].tolist()}; choose a value nearer 1 or a wider dtype"
            )

    @property
    def r1(self) -> torch.Tensor:
        """``r1``, shape ``(num_heads,)``, > 0."""
        return F.softplus(self.raw_r1)

    @property
    def r2(self) -> torch.Tensor:
        """``r2``, shape ``(num_heads,)``, > 0 (and < 2 for ``kind="power"``)."""
        if self.kind == "log":
            return F.softplus(self.raw_r2)
        return 2 * torch.sigmoid(self.raw_r2)

    def _kernel(self, distance, r1, r2):
        """``b`` from a float ``distance >= 0`` and broadcastable ``r1``, ``r2``."""
        if self.kind == "log":
            return -r1 * torch.log1p(r2 * distance)
        return -r1 * distance.pow(r2)

    def score_mod(self, ctx: CallContext):
        """``score + b_h(q_pos, k_pos)``: FlexAttention's form, and the eager bias by default."""
        if ctx.heads != self.num_heads:
            raise ValueError(
                f"{type(self).__name__}({self.num_heads}) needs q of shape (..., "
                f"num_heads={self.num_heads}, q_len, d), got {ctx.heads} heads"
            )
        work = torch.promote_types(ctx.dtype, torch.float32)
        r1 = self.r1.to(device=ctx.device, dtype=work)
        r2 = self.r2.to(device=ctx.device, dtype=work)

        def mod(score, b, h, q_pos, k_pos):
            distance = (q_pos - k_pos).abs().to(work)
            return score + self._kernel(distance, r1[h], r2[h])

        return mod

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kind={self.kind!r}"
