"""Kerple: kernelized relative positional bias (Chi, Fan, Ramadge and Rudnicky, 2022).

Kerple adds to the scaled score of query position ``m`` and key position
``n`` in head ``h`` a learned function of the distance ``|m - n|``:

    kind="log":    b_h(m, n) = -r1_h * log(1 + r2_h * |m - n|),   r1_h, r2_h > 0
    kind="power":  b_h(m, n) = -r1_h * |m - n| ** r2_h,           r1_h > 0, 0 < r2_h <= 2

Both are conditionally positive definite (CPD) kernels of the positions:
``sum_ij c_i c_j b(x_i, x_j) >= 0`` whenever ``sum_i c_i = 0``, and softmax
cannot see a constant added to a whole row; that is the paper's argument for
using a CPD kernel as an additive bias.  The paper's Lemma 1 (a CPD kernel plus
a large enough constant is positive semidefinite on finitely many points) needs
the form to be *strictly* positive on nonzero zero-sum vectors: true for the log
form and for ``r2 < 2``, false at ``r2 = 2``, where ``-|m - n|**2`` restricted
to zero-sum vectors is ``2 (sum_i c_i x_i)**2``, zero on a whole subspace, and
no constant makes the matrix PSD.  The softmax argument does not need the
lemma.  The power form with ``r2 = 1`` is ALiBi with a
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

The fused path on a CPU
-----------------------
Inside the compiled FlexAttention kernel on a CPU, ``log1p`` (``pow`` for the
power form) evaluated for every score made Kerple 1.3 (1.9) times as slow as
ALiBi's fused path with 8-lane (AVX2) vectors (``benchmarks/bench_fused.py
--schemes-only``).  So :meth:`Kerple.score_mod` evaluates the bias once per
head and distance into a table, with the operations of the direct formula,
and the kernel reads ``table[h, |q_pos - k_pos|]``.  The table covers the
distances of the call and has a static size, a power of two of at least 256
(a new size compiles a new graph); it is used only while the largest distance
is below ``q_len + k_len``, so it never grows with the position values.
Inductor's C++ reads a table one vector lane at a time, so the read costs the
same per score whatever the vector width, while ``log1p`` costs less per
score the more lanes a vector has: with 16-lane (AVX-512) vectors the log form
evaluates ``log1p`` per score (``LOG_TABLE_MAX_VECTOR_BITS``), which the stored
runs cannot tell apart from its table read (the same compiled code measured
0.05 apart between two forms; see the performance appendix); the power form's
``pow`` stays costlier
and reads its table on every instruction set.
Otherwise (positions far apart, distances up to ``2**32``), on a GPU, in the
eager path and wherever values cannot be read (tracing, meta tensors,
functorch transforms) or gradients are recorded, the formula is evaluated
directly.  :func:`kernel_tables` and :func:`lookup` are shared with
:mod:`posenc.fire`.
"""

from __future__ import annotations

import numbers
from collections.abc import Sequence
from typing import NamedTuple, TypeAlias, Union

import torch
import torch.nn.functional as F
from torch import nn

from . import _compile
from ._checks import check_choice, check_float_dtype, check_int
from ._runtime import has_values
from ._types import Device, ScoreMod
from .context import CallContext
from .scheme import PositionalScheme

__all__ = ["Kerple"]

KINDS = ("log", "power")
# An initial r1 or r2: one positive number, or one per head.
Initial: TypeAlias = Union[float, Sequence[float], torch.Tensor, None]  # noqa: UP007
# The paper's code clamps r1 and r2 to at least this; posenc's initial values do the same.
PAPER_EPS = 0.01

# --- tables the fused CPU kernel reads (posenc.fire uses them too) ---------------------------

# A table the kernel reads has a static size, a power of two of at least this many
# entries: each new size compiles a new graph, so sizes must be few, and a symbolic
# size breaks PyTorch 2.13's CPU kernel (.ci/upstream/flex_cpu_symbolic_table.py).
TABLE_MIN_SIZE = 256

# The log form reads its table only where Inductor's CPU vectors are at most this wide: with
# 8-lane (AVX2) vectors the table made it clearly cheaper (benchmarks/results/
# fused_schemes_avx2*.json); with 16-lane (AVX-512) ones log1p per score and the table
# measured within the noise of identical code, so either choice is supported by the data.
LOG_TABLE_MAX_VECTOR_BITS = 256


def table_size(n: int) -> int:
    """The static size of a table of ``n`` entries: the next power of two, at least 256."""
    return max(TABLE_MIN_SIZE, 1 << max(n - 1, 0).bit_length())


class KernelTables(NamedTuple):
    """What tables the fused CPU kernel may read for one call (see :func:`kernel_tables`).

    ``distances``: the table size for distances ``|q_pos - k_pos|`` (entries ``0 ..
    distances - 1``), or ``None``; ``queries``: the table size for query positions
    ``q_lo .. q_lo + queries - 1``, or ``None``; ``q_lo``: the lowest query position,
    a 0-d int64 tensor (a tensor, so that a new value does not recompile the kernel).
    """

    distances: int | None
    queries: int | None
    q_lo: torch.Tensor


def kernel_tables(ctx: CallContext, *params: torch.Tensor) -> KernelTables | None:
    """Which tables a scheme may precompute for the fused kernel of this call, or ``None``.

    Tables pay on a CPU, where Inductor evaluates each transcendental function
    of a score_mod once per score.  ``None`` on other devices, where values
    cannot be read (tracing, meta tensors, functorch transforms; ``params`` are
    the scheme's parameters), and while autograd records (the CPU kernel has no
    backward, so the call runs eager).  A table covers a range that spans fewer
    than ``q_len + k_len`` values, so its size never grows with the position
    values; a range that spans more gets ``None`` and the formula.  One host
    read of the positions' extremes.
    """
    qp, kp = ctx.q_positions, ctx.k_positions
    if ctx.device.type != "cpu" or qp.numel() == 0 or kp.numel() == 0:
        return None
    if not (has_values(qp) and has_values(kp)):
        return None
    for p in params:
        if not has_values(p) or (p.requires_grad and torch.is_grad_enabled()):
            return None
    q_lo, q_hi, k_lo, k_hi = torch.stack((qp.min(), qp.max(), kp.min(), kp.max())).tolist()
    limit = ctx.q_len + ctx.k_len
    largest = max(q_hi - k_lo, k_hi - q_lo, 0)  # the largest |q_pos - k_pos|
    return KernelTables(
        table_size(largest + 1) if largest < limit else None,
        table_size(q_hi - q_lo + 1) if q_hi - q_lo < limit else None,
        torch.tensor(q_lo, device=qp.device),
    )


def static_table(table: torch.Tensor) -> torch.Tensor:
    """``table``, contiguous and marked static for the compiler (its size is a bucket)."""
    table = table.contiguous()
    torch._dynamo.mark_static(table)
    return table


def lookup(table: torch.Tensor, *index: torch.Tensor) -> torch.Tensor:
    """``table[index]`` inside the fused kernel; the caller clamps every index into the table.

    Inductor's C++ reads a table through a vector of indices one lane at a
    time; its bounds check then stores the indices lane by lane and reloads
    them as a vector, a stalled load that made a lookup cost as much as
    ``log1p`` with AVX2 vectors.  ``aten._unsafe_index`` has no check; the
    clamp keeps every index in range.
    """
    out: torch.Tensor = torch.ops.aten._unsafe_index(table, list(index))
    return out


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

    Notes
    -----
    Queries must have ``num_heads`` heads; keys may have fewer (grouped-query
    attention).  :meth:`score_mod` is the whole scheme: FlexAttention
    (``backend="flex"``, or ``"auto"`` on long inputs) adds the bias score by
    score and builds no O(q_len * k_len) tensor (on a CPU it may read the bias
    from a table of one entry per head and distance of the call); the eager path
    evaluates the formula into a dense ``(1, num_heads, q_len, k_len)`` bias
    (``(batch, ...)`` for per-sample positions).  Both compute in float32, or
    float64 for float64 inputs.

    Examples
    --------
    >>> import torch, posenc
    >>> kerple = posenc.Kerple(2, "log", r1=[1.0, 2.0], r2=0.5, dtype=torch.float64)
    >>> [round(x, 6) for x in kerple.r1.tolist()], [round(x, 6) for x in kerple.r2.tolist()]
    ([1.0, 2.0], [0.5, 0.5])
    >>> z = torch.zeros(1, 2, 3, 8, dtype=torch.float64)   # (batch, heads, len, d)
    >>> kerple.bias(z, z, posenc.CallContext.of(z, z))[0, 0].round(decimals=4).tolist()
    [[0.0, -0.4055, -0.6931], [-0.4055, 0.0, -0.4055], [-0.6931, -0.4055, 0.0]]
    >>> power = posenc.Kerple(2, "power", r1=0.5, r2=1.0, dtype=torch.float64)  # ALiBi-like
    >>> power.bias(z, z, posenc.CallContext.of(z, z))[0, 1].round(decimals=4).tolist()
    [[0.0, -0.5, -1.0], [-0.5, 0.0, -0.5], [-1.0, -0.5, 0.0]]
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 5, 8, generator=g, dtype=torch.float64)
    >>> posenc.attention(q, k, v, encoding=kerple, causal=True).shape
    torch.Size([1, 2, 5, 8])
    """

    quadratic_memory = True  # the eager path's dense bias; the fused path has none
    reference = "chi2022kerple"

    def __init__(
        self,
        num_heads: int,
        kind: str = "log",
        *,
        r1: Initial = None,
        r2: Initial = None,
        device: Device = None,
        dtype: torch.dtype | None = None,
    ) -> None:
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
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """Both forms, one value per head spread over each parameter's range."""

        def spread(lo: float, hi: float) -> torch.Tensor:
            return torch.linspace(lo, hi, num_heads, dtype=torch.float64)

        return {
            "": cls(num_heads, "log", r1=spread(0.3, 2.0), r2=spread(0.2, 1.5)),
            "power": cls(num_heads, "power", r1=spread(0.2, 1.0), r2=spread(0.5, 1.9)),
        }

    def _initial(
        self, name: str, value: object, high: float, *, upper: float | None
    ) -> torch.Tensor:
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

    def _check_stored(
        self, name: str, wanted: torch.Tensor, stored: torch.Tensor, *, upper: float | None
    ) -> None:
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

    def _kernel(self, distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        """``b`` from a float ``distance >= 0`` and broadcastable ``r1``, ``r2``."""
        if self.kind == "log":
            return -r1 * torch.log1p(r2 * distance)
        return -r1 * distance.pow(r2)

    def _table_pays(self) -> bool:
        """Whether the fused CPU kernel reads this form's bias from a table (see the module doc)."""
        return self.kind == "power" or _compile._cpu_vector_width() <= LOG_TABLE_MAX_VECTOR_BITS

    def score_mod(self, ctx: CallContext) -> ScoreMod:
        """``score + b_h(q_pos, k_pos)``: FlexAttention's form, and the eager bias by default.

        Inside the fused kernel on a CPU the returned function reads
        ``b_h`` from a table over the call's distances (computed here, by the
        formula, with a static power-of-two size), while the largest distance
        is below ``q_len + k_len``: always for the power form, for the log form
        where vectors have at most ``LOG_TABLE_MAX_VECTOR_BITS`` bits.  On
        index grids (the dense bias) and otherwise it evaluates the formula.
        """
        if ctx.heads != self.num_heads:
            raise ValueError(
                f"{type(self).__name__}({self.num_heads}) needs q of shape (..., "
                f"num_heads={self.num_heads}, q_len, d), got {ctx.heads} heads"
            )
        work = torch.promote_types(ctx.dtype, torch.float32)
        r1 = self.r1.to(device=ctx.device, dtype=work)
        r2 = self.r2.to(device=ctx.device, dtype=work)
        table, last = None, 0
        plan = kernel_tables(ctx, self.raw_r1, self.raw_r2)
        if plan is not None and plan.distances is not None and self._table_pays():
            # the bias of every head at distances 0 .. size - 1, by the formula's own operations
            distance = torch.arange(plan.distances, device=ctx.device).to(work)
            table = static_table(self._kernel(distance, r1[:, None], r2[:, None]))
            last = plan.distances - 1

        def mod(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
        ) -> torch.Tensor:
            if table is not None and q_pos.dim() == 0:  # one score, inside the fused kernel
                return score + lookup(table, h, (q_pos - k_pos).abs().clamp(max=last))
            distance = (q_pos - k_pos).abs().to(work)
            return score + self._kernel(distance, r1[h], r2[h])

        return mod

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kind={self.kind!r}"
