"""Rotary position embedding, RoPE (Su et al., 2021).

RoPE rotates each pair of query/key features by an angle proportional to the
token's position, ``p * omega_i`` with ``omega_i = base**(-2i/r)`` for pair
``i`` of the ``r`` rotated features.  A rotation by ``m * omega`` of the query
and ``n * omega`` of the key leaves ``<R_m q, R_n k> = <q, R_{n-m} k>``: the
score sees only the relative position ``n - m`` (key minus query).

Conventions
-----------
* ``x`` has shape ``(..., seq, dim)``, usually ``(batch, heads, seq, dim)``.
  Positions are integers, by default ``0 .. seq-1``, in one of three forms:
  ``(seq,)``, shared by every row of ``x``; ``(batch, seq)`` with
  ``batch = x.shape[0]`` (or 1), one row per batch item and shared by its
  heads (the ``position_ids`` of transformers, e.g. a left-padded batch); or
  one position per row of ``x``, shape ``x.shape[:-1]`` (size-1 dimensions
  broadcast).  Anything else is refused, so a ``(batch, seq)`` tensor is never
  read as ``(heads, seq)``.
* Rotation direction: the pair ``(a, b)`` at angle ``t`` becomes
  ``(a cos t - b sin t, a sin t + b cos t)``, i.e. ``a + ib`` times ``e^{it}``
  (counter-clockwise, as in RoFormer's equation 14).
* Layouts: ``"interleaved"`` pairs features ``(2i, 2i+1)`` (RoFormer, GPT-J,
  Meta's LLaMA); ``"half"`` pairs ``(i, i + r/2)`` (GPT-NeoX, LLaMA in Hugging
  Face transformers).  Both give the same scores once the projection weights
  are permuted, see :mod:`posenc.convert`.
* ``rotary_dim=r`` rotates only the first ``r`` features, with frequencies
  computed from ``r`` (GPT-NeoX's partial rotary); the rest pass through.
* Precision: angles and cos/sin tables are computed in float64 or by exact
  angle addition (:mod:`posenc._angles`), never in bf16/fp16.  The rotation of
  a bf16/fp16 tensor runs in float32 and is rounded once, so the output is
  within 2x the bf16 rounding floor of the exact result at any position.
  Positions must lie strictly within ``2**31`` of 0 (beyond, the float64 angle
  ``p * omega`` errs by more than float32 roundoff); others raise
  ``ValueError``, or, where values cannot be read (``torch.compile``), give
  NaN instead of a silently wrong rotation.
* A :class:`posenc.RopeScaling` changes the frequencies; its
  ``attention_factor`` (YaRN's temperature) is folded into the cos/sin tables,
  so the rotated tensor is ``attention_factor * R_p x``.
* Length-dependent scalings (dynamic NTK, longrope) take the context length
  to be ``max(positions) + 1`` over the whole call (all batch items, queries
  and keys together), as transformers does with ``max(position_ids) + 1``.

Compile and transforms
----------------------
Every function here traces under ``torch.compile(fullgraph=True)`` and
``torch.export``, runs under ``vmap``, ``grad`` and forward-mode AD
(``torch.func.jvp``, ``torch.autograd.forward_ad``) and on meta tensors.  The
eager fast paths (one-pass complex multiply, cache-sized chunks, Triton,
huge-page outputs, the cached table) read tensor values or write in place, so
they step aside there and the plain differentiable form runs instead.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeGuard, overload

import torch

from . import _fused_rope
from ._angles import compute_dtype, cos_sin
from ._checks import (
    MAX_POSITION,
    as_positions,
    check_build_args,
    check_choice,
    check_even,
    check_float,
    check_float_dtype,
    check_floating,
    check_int,
    check_position_values,
)
from ._rope_kernels import compiled_ok as _compiled_ok
from ._rope_kernels import rotate as _rotate
from ._runtime import eager_ok as _fast_ok
from ._runtime import has_values
from ._types import Device, Positions
from .context import CallContext, as_context
from .scaling import RopeScaling
from .scheme import PositionalScheme
from .sinusoidal import sinusoidal_inv_freq

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["rope_frequencies", "rope_cos_sin", "apply_rope", "RotaryEmbedding"]

LAYOUTS = ("interleaved", "half")


def rope_frequencies(
    dim: int,
    *,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
    seq_len: int | None = None,
) -> torch.Tensor:
    """RoPE frequencies ``omega_i = base**(-2i/dim)``, then the scaling, as float64 ``(dim // 2,)``.

    Parameters
    ----------
    dim
        Number of rotated features (even).
    base
        Frequency base (10000 in RoFormer; 500000 in Llama 3).
    scaling
        Optional :class:`posenc.RopeScaling`.
    seq_len
        Current context length; used by length-dependent scalings only
        (dynamic NTK, longrope).

    Returns
    -------
    Tensor of shape ``(dim // 2,)``, float64, on the CPU, in radians per position.
    """
    dim = check_even("dim", dim)
    base = check_float("base", base, positive=True)
    scaling = _check_scaling(scaling)
    if seq_len is not None:
        seq_len = check_int("seq_len", seq_len, minimum=0)
    if scaling is None:
        return sinusoidal_inv_freq(dim, base=base)
    return scaling.frequencies(dim, base, seq_len)


def rope_cos_sin(
    positions: Positions,
    dim: int,
    *,
    base: float = 10000.0,
    scaling: RopeScaling | None = None,
    dtype: torch.dtype = torch.float32,
    device: Device = None,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Tables ``cos(p * omega_i)`` and ``sin(p * omega_i)``, each ``(*positions.shape, dim // 2)``.

    Parameters
    ----------
    positions
        Integer positions of any shape: a tensor, a ``range`` or a sequence of
        ints, each strictly within ``2**31`` of 0.  A contiguous run (a
        ``range`` with step 1, or a 1-D CPU tensor that is one) takes the fast
        exact angle-addition path; anything else is evaluated in float64, at a
        cost that does not depend on how large the positions are.
    dim
        Number of rotated features (even).
    base, scaling
        As in :func:`rope_frequencies`.  The scaling's ``attention_factor``
        multiplies both tables (1 except for YaRN).
    dtype
        Floating dtype of the tables; values are correctly rounded from
        float32 or better whatever ``dtype`` is.
    device
        Device of the tables; defaults to the positions' device (CPU for
        ranges and lists).
    seq_len
        Context length seen by length-dependent scalings; defaults to
        ``max(positions) + 1``.

    Returns
    -------
    tuple of Tensor
        ``(cos, sin)``, each ``(*positions.shape, dim // 2)`` in ``dtype``.

    Examples
    --------
    >>> import torch, posenc
    >>> cos, sin = posenc.rope_cos_sin(torch.tensor([0, 1]), 4, dtype=torch.float64)
    >>> cos.round(decimals=4).tolist(), sin.round(decimals=4).tolist()
    ([[1.0, 1.0], [0.5403, 1.0]], [[0.0, 0.0], [0.8415, 0.01]])
    """
    dim = check_even("dim", dim)
    base = check_float("base", base, positive=True)
    scaling = _check_scaling(scaling)
    dtype = check_float_dtype("dtype", dtype)
    if seq_len is not None:
        seq_len = check_int("seq_len", seq_len, minimum=0)
    start, count, pos = _split_positions(positions, device)
    if device is None:
        device = pos.device if pos is not None else torch.device("cpu")
    return _tables(start, count, pos, dim, base, scaling, dtype, device, seq_len)


def apply_rope(
    x: torch.Tensor,
    positions: Positions | None = None,
    *,
    base: float = 10000.0,
    layout: str = "interleaved",
    rotary_dim: int | None = None,
    scaling: RopeScaling | None = None,
    out: torch.Tensor | None = None,
    compiled: bool = False,
) -> torch.Tensor:
    """Rotate ``x`` by its positions: RoPE applied to queries or keys.

    Parameters
    ----------
    x
        Queries or keys ``(..., seq, dim)``, usually ``(batch, heads, seq, dim)``;
        any floating dtype and device.
    positions
        Integer positions (default ``0 .. seq-1``): ``(seq,)`` shared by all
        rows; ``(batch, seq)`` with ``batch`` equal to ``x.shape[0]`` or 1, one
        row per batch item (shared by its heads); or ``x.shape[:-1]`` with
        size-1 dimensions broadcasting.  Other shapes raise ``ValueError``,
        float positions ``TypeError``.
    base
        Frequency base.
    layout
        ``"interleaved"`` pairs features ``(2i, 2i+1)``; ``"half"`` pairs
        ``(i, i + r/2)``.  See the module docstring.  On CPU "interleaved" is
        the faster (one complex multiply); a half-layout checkpoint can use
        it after :func:`posenc.half_to_interleaved` on its q/k projections.
    rotary_dim
        Rotate only the first ``r`` features (even, ``<= dim``); frequencies
        use ``r``.  Defaults to ``dim``.
    scaling
        Optional :class:`posenc.RopeScaling`; its ``attention_factor`` scales
        the rotated features (YaRN).  A length-dependent scaling (dynamic NTK)
        uses the length ``max(positions) + 1``: every row is rotated with the
        frequencies of the full pass (see :class:`RotaryEmbedding` for
        decoding with a cache).
    out
        Optional preallocated contiguous output with the shape, dtype and
        device of ``x`` (may be ``x`` itself).  Not allowed when ``x`` needs
        gradients or inside ``vmap``/``grad``/``jvp``.
    compiled
        Half layout: rotate in one pass with a kernel generated by
        ``torch.compile`` (``posenc._fused_rope``; a C++ loop on a CPU, Triton
        on a GPU), same tables, same float32 arithmetic.  Sequence lengths
        are dynamic: the first call compiles (3-25 s measured on a shared
        2-core CPU at load 8-12), a new length then costs no compile.  Interleaved
        layout: the eager kernel runs (one complex multiply in float32 and
        float64), which measured faster than Inductor's code for it.  Applies
        with ``rotary_dim = dim``, no ``out``, no autograd, outside tracing and
        transforms and where compiling works; the eager path runs otherwise,
        and, with a one-time warning, if compiling fails.  Measured in
        ``benchmarks/bench_rope.py`` (``benchmarks/results/rope_many_shapes.json``).

    Returns
    -------
    Tensor shaped and typed like ``x``.  Pair ``(a, b)`` at angle ``t`` becomes
    ``(a cos t - b sin t, a sin t + b cos t)``.
    """
    x, rotary_dim = _check_x(x, layout, rotary_dim)
    seq = x.shape[-2]
    work = compute_dtype(x.dtype)
    if positions is None:
        cos, sin = rope_cos_sin(
            range(seq), rotary_dim, base=base, scaling=scaling, dtype=work, device=x.device
        )
    else:
        pos = _batched_positions("positions", positions, x)
        cos, sin = rope_cos_sin(
            pos, rotary_dim, base=base, scaling=scaling, dtype=work, device=x.device
        )
    if not isinstance(compiled, bool):
        raise TypeError(f"compiled must be a bool, got {type(compiled).__name__}")
    if compiled and _compiled_ok(out, rotary_dim, x, cos, sin):
        y = _fused_rope.rotate(x, cos, sin, layout)
        if y is not None:
            return y
    return _rotate(x, cos, sin, layout, rotary_dim, out)


class RotaryEmbedding(PositionalScheme):
    """RoPE with a cached cos/sin table, as a :class:`posenc.PositionalScheme`.

    Used as ``posenc.attention(q, k, v, encoding=module)`` it rotates queries
    and keys at their positions (:meth:`rotate`) and never builds an
    O(q_len * k_len) bias.  For decoding, :class:`posenc.KVCache` rotates each
    key once, when it is added, and caches it rotated.
    :meth:`rotate_one` ``(x, positions=None)`` equals :func:`apply_rope` with
    the module's settings.  Calling the module is attention, as for every
    scheme (``module(q, k, v, causal=True)``); ``module(x)`` and
    ``module(x, positions)`` (one tensor, integer positions) still mean
    :meth:`rotate_one`.

    The cache
    ---------
    * A table of cos/sin over positions ``0 .. L-1``, kept as a plain
      attribute, not a buffer: ``module.to(torch.bfloat16)`` cannot round it,
      and the frequencies stay float64 (RoPE has no parameters).
    * It holds float32 tables (float64 for float64 inputs) on the device of
      the last input; a new device or precision rebuilds it.
    * It grows (doubling) to cover a call whose largest position is less than
      twice the table, the initial ``max_positions`` or the number of
      positions in the call; so step-by-step decoding and a long prefill grow
      it, in amortised O(1) per position.  Positions beyond that (one step at
      position 3,000,000, a chunk at a large offset), negative positions and
      every call where the frequencies depend on the length are computed
      directly in float64: the cost of a call never depends on how large its
      positions are, and the table never spans positions nobody asked for.
    * Under ``torch.compile``/``torch.export``, functorch transforms and on
      meta tensors the table is neither read nor written (that would need
      tensor values on the host); tables are computed directly.

    Dynamic NTK (and longrope)
    --------------------------
    Their frequencies depend on the context length ``L = max(positions) + 1``
    of the call, taken over queries and keys and over every batch item (as
    transformers does with ``max(position_ids) + 1``):

    * a full pass (``module(x)``, ``attention(..., encoding=module)``) rotates
      every position with the frequencies of ``L``;
    * cached decoding through :class:`posenc.KVCache` rotates the new keys and
      queries of each step with the frequencies of that step's ``L`` and keeps
      the keys as rotated then.  This is what transformers' ``generate`` does
      (``dynamic_rope_update`` recomputes ``inv_freq`` from
      ``max(position_ids) + 1`` and the cache holds rotated keys), so past
      ``original_max_positions`` a decoded sequence differs from a full pass
      over the same tokens.  posenc keeps no state between calls: where
      transformers keeps the largest length seen until the length drops
      below ``original_max_positions``, posenc uses the current one; the two
      agree whenever lengths do not decrease, as within one ``generate``.

    Parameters
    ----------
    dim
        Feature size of queries/keys (even).
    base, layout, rotary_dim, scaling
        As in :func:`apply_rope`.
    max_positions
        Initial table length (a hint; the table grows as needed).
    compiled
        Half layout: rotate with kernels generated by ``torch.compile``, one
        pass per tensor, and queries and keys in one graph in :meth:`rotate`;
        interleaved: the eager kernel (see ``compiled`` in :func:`apply_rope`
        for when it applies and what it costs).

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 8, 10, 64, generator=g, dtype=torch.float64)
    >>> k, v = torch.randn(2, 1, 2, 10, 64, generator=g, dtype=torch.float64)  # 2 KV heads
    >>> rope = posenc.RotaryEmbedding(64)
    >>> posenc.attention(q, k, v, encoding=rope, causal=True).shape
    torch.Size([1, 8, 10, 64])

    Scores depend only on the distance between positions:

    >>> near = posenc.CallContext.of(q, k)
    >>> far = posenc.CallContext.of(q, k, q_positions=torch.arange(10) + 5000,
    ...                             k_positions=torch.arange(10) + 5000)
    >>> qa, ka = rope.rotate(q, k, near)
    >>> qb, kb = rope.rotate(q, k, far)
    >>> torch.allclose(qa[:, :2] @ ka.mT, qb[:, :2] @ kb.mT)
    True
    """

    reference = "su2024roformer"

    def __init__(
        self,
        dim: int,
        *,
        base: float = 10000.0,
        layout: str = "interleaved",
        rotary_dim: int | None = None,
        scaling: RopeScaling | None = None,
        max_positions: int = 2048,
        compiled: bool = False,
    ) -> None:
        super().__init__()
        self.dim = check_even("dim", dim)
        self.rotary_dim = _check_rotary_dim(rotary_dim, self.dim)
        self.base = check_float("base", base, positive=True)
        self.layout = check_choice("layout", layout, LAYOUTS)
        self.scaling = _check_scaling(scaling)
        self.max_positions = check_int("max_positions", max_positions, minimum=1)
        if not isinstance(compiled, bool):
            raise TypeError(f"compiled must be a bool, got {type(compiled).__name__}")
        self.compiled = compiled
        # float64 frequencies as a plain attribute: immune to module.to(dtype)
        self.inv_freq = rope_frequencies(self.rotary_dim, base=self.base, scaling=self.scaling)
        # (cos, sin), each (length, rotary_dim // 2)
        self._cache: tuple[torch.Tensor, torch.Tensor] | None = None

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
        """RoPE over the whole head (``dim = head_dim``); the table grows as needed."""
        check_build_args(num_heads, head_dim, max_len, causal)
        return cls(check_even("head_dim", head_dim), **options)

    @overload
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, /, *,
        mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
        causal: bool = False, q_offset: int | None = None,
        q_positions: Positions | None = None, k_positions: Positions | None = None,
        scale: float | None = None,
    ) -> torch.Tensor: ...  # fmt: skip

    @overload
    def forward(
        self,
        x: torch.Tensor,
        positions: Positions | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor: ...

    def forward(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        """Attention, ``module(q, k, v, ...)``; or, with one tensor, :meth:`rotate_one`.

        ``module(x)``, ``module(x, positions)`` and ``module(x, out=y)`` (no
        second floating tensor) keep their old meaning, the rotation of ``x``.
        """
        second = args[0] if args else None
        if isinstance(second, torch.Tensor) and second.is_floating_point():
            out: torch.Tensor = super().forward(x, *args, **kwargs)
            return out
        return self.rotate_one(x, *args, **kwargs)

    def rotate_one(
        self,
        x: torch.Tensor,
        positions: Positions | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Rotate ``x`` ``(..., seq, dim)`` at ``positions`` (forms as in :func:`apply_rope`)."""
        x, _ = _check_x(x, self.layout, self.rotary_dim)
        if x.shape[-1] != self.dim:
            raise ValueError(f"x must have last dimension dim={self.dim}, got {x.shape[-1]}")
        if positions is not None:
            positions = _batched_positions("positions", positions, x)
        cos, sin = self.cos_sin(x.shape[-2] if positions is None else positions, x)
        if self.compiled and _compiled_ok(out, self.rotary_dim, x, cos, sin):
            y = _fused_rope.rotate(x, cos, sin, self.layout)
            if y is not None:
                return y
        return _rotate(x, cos, sin, self.layout, self.rotary_dim, out)

    def rotate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        ctx: CallContext | Positions,
        *legacy: Positions | float | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """:class:`posenc.PositionalScheme` hook: rotate ``q`` and ``k`` at their positions.

        ``q`` is ``(batch, heads, q_len, dim)`` and ``k`` is ``(batch, kv_heads,
        k_len, dim)`` (any ``kv_heads``, e.g. a divisor of ``heads``); the
        context's positions are integer tensors ``(len,)`` or ``(batch, len)``,
        or of shape ``q.shape[:-1]``/``k.shape[:-1]``.  The old form
        ``rotate(q, k, q_positions, k_positions)`` is accepted too.  Returns the
        rotated ``(q, k)``.  Reads no tensor value on the host when traced.
        """
        q = check_floating("q", q, min_dim=2)
        k = check_floating("k", k, min_dim=2)
        ctx = as_context(q, k, ctx, *legacy, hook=f"{type(self).__name__}.rotate")
        q_positions, k_positions = ctx.q_positions, ctx.k_positions
        for name, t in (("q", q), ("k", k)):
            if t.shape[-1] != self.dim:
                raise ValueError(
                    f"{name} must have last dimension dim={self.dim}, got {t.shape[-1]}"
                )
        qp = _batched_positions("q_positions", q_positions, q)
        kp = _batched_positions("k_positions", k_positions, k)
        length: int | torch.Tensor | None = None
        if _depends_on_length(self.scaling):
            # one length for both, so that q and k share the frequencies
            length = _context_length(torch.cat((qp.flatten(), kp.flatten())))
        cq, sq = self.cos_sin(qp, q, length=length)
        ck, sk = self.cos_sin(kp, k, length=length)
        if self.compiled and _compiled_ok(None, self.rotary_dim, q, k, cq, sq, ck, sk):
            pair = _fused_rope.rotate_pair(q, k, cq, sq, ck, sk, self.layout)
            if pair is not None:
                return pair
        return (
            _rotate(q, cq, sq, self.layout, self.rotary_dim, None),
            _rotate(k, ck, sk, self.layout, self.rotary_dim, None),
        )

    def cos_sin(
        self,
        positions: torch.Tensor | int,
        like: torch.Tensor,
        *,
        length: int | torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Tables ``(*positions.shape, rotary_dim // 2)`` for ``like``'s device, float32 or float64.

        ``positions`` is an integer tensor, or a count ``seq`` meaning
        ``0 .. seq-1``.  ``length`` is the context length seen by a
        length-dependent scaling (an int, or a 0-d tensor when traced);
        default ``max(positions) + 1``.
        """
        work = compute_dtype(like.dtype)
        device = like.device
        count: int | None = None  # positions given as a count: 0 .. count-1
        pos: torch.Tensor | None = None
        if isinstance(positions, int):
            count = positions
        else:
            pos = as_positions("positions", positions, device=device)
        eager = _fast_ok(like) and (pos is None or has_values(pos))
        if length is None and _depends_on_length(self.scaling):
            length = count if pos is None else _context_length(pos)
        if isinstance(length, torch.Tensor) and eager:
            length = int(length)
        if not eager:  # no host reads, no cache mutation: compute directly
            if pos is None:
                assert count is not None
                pos = torch.arange(count, device=device)
            return _tables(
                0, None, pos, self.rotary_dim, self.base, self.scaling, work, device, length
            )
        if pos is None:
            assert count is not None
            lo, hi, n = 0, count - 1, count
        elif pos.numel() == 0:
            lo, hi, n = 0, -1, 0
        else:
            lo_t, hi_t = torch.aminmax(pos)
            lo, hi, n = int(lo_t), int(hi_t), pos.shape[-1]
        if lo <= -MAX_POSITION or hi >= MAX_POSITION:
            raise ValueError(
                f"positions must lie strictly within 2**31 = {MAX_POSITION} of 0 (beyond, the "
                f"float64 angle p * omega errs by more than float32 roundoff); got values from "
                f"{lo} to {hi}"
            )
        scaled_by_length = (
            _depends_on_length(self.scaling)
            and length is not None
            and length > _original_length(self.scaling)
        )
        table = None
        if not scaled_by_length and 0 <= lo <= hi:
            table = self._table_for(hi, n, device, work)
        if table is None:  # direct float64 evaluation, independent of the positions' size
            if pos is None:
                assert count is not None
                pos = torch.arange(count, device=device)
            return _tables(
                0, None, pos, self.rotary_dim, self.base, self.scaling, work, device, length
            )
        cos, sin = table
        if pos is None:
            return cos[:count], sin[:count]
        return cos[pos], sin[pos]

    def _table_for(
        self, hi: int, n: int, device: torch.device, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The cached table if it covers ``0 .. hi`` (growing it if that is cheap), else None."""
        c = self._cache
        have = 0 if c is None or c[0].device != device or c[0].dtype != dtype else c[0].shape[0]
        if hi < have:
            return c
        if hi >= 2 * max(have, self.max_positions, n):
            return None  # far beyond anything asked for so far: do not tabulate the gap
        length = max(hi + 1, 2 * have, self.max_positions)
        # a length-dependent scaling is cached only below its original length,
        # where its frequencies are fixed
        seq_len = _original_length(self.scaling) if _depends_on_length(self.scaling) else None
        self._cache = _tables(
            0, length, None, self.rotary_dim, self.base, self.scaling, dtype, device, seq_len
        )
        return self._cache

    def extra_repr(self) -> str:
        s = f"dim={self.dim}, base={self.base}, layout={self.layout!r}"
        if self.rotary_dim != self.dim:
            s += f", rotary_dim={self.rotary_dim}"
        if self.scaling is not None:
            s += f", scaling={self.scaling!r}"
        if self.compiled:
            s += ", compiled=True"
        return s


# ---------------------------------------------------------------------- tables


def _tables(
    start: int,
    count: int | None,
    pos: torch.Tensor | None,
    dim: int,
    base: float,
    scaling: RopeScaling | None,
    dtype: torch.dtype,
    device: Device,
    seq_len: int | torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for ``start .. start+count-1`` (``pos`` None) or for the tensor ``pos``.

    ``seq_len`` is an int, a 0-d tensor (traced) or None (``max(positions) + 1``).
    """
    readable = pos is None or has_values(pos)
    if pos is None:
        assert count is not None, "a run of positions needs its count"
        if start <= -MAX_POSITION or start + count > MAX_POSITION:
            raise ValueError(
                f"positions must lie strictly within 2**31 = {MAX_POSITION} of 0, got the run "
                f"{start} .. {start + count - 1}"
            )
    else:
        check_position_values("positions", pos)
    if seq_len is None and _depends_on_length(scaling):
        if pos is None:
            assert count is not None
            seq_len = start + count
        else:
            seq_len = _context_length(pos)
        if isinstance(seq_len, torch.Tensor) and readable:
            seq_len = int(seq_len)
    omega = _frequencies(dim, base, scaling, seq_len, device)
    work = compute_dtype(dtype)
    cos, sin = cos_sin(pos, omega, num_positions=count, start=start, dtype=work)
    if not readable and pos is not None and pos.numel():  # (readable when pos is None)
        # values could not be checked on the host: poison, never silently wrong
        bad = ((pos <= -MAX_POSITION) | (pos >= MAX_POSITION))[..., None]
        cos = cos.masked_fill(bad, float("nan"))
        sin = sin.masked_fill(bad, float("nan"))
    attention = None if scaling is None else scaling.attention_factor  # set once built
    if attention is not None and attention != 1.0:
        cos, sin = cos * attention, sin * attention
    return cos.to(dtype), sin.to(dtype)


def _frequencies(
    dim: int,
    base: float,
    scaling: RopeScaling | None,
    seq_len: int | torch.Tensor | None,
    device: Device,
) -> torch.Tensor:
    """Float64 ``(dim // 2,)`` frequencies on ``device``; ``seq_len`` may be a 0-d tensor."""
    if scaling is None:
        return sinusoidal_inv_freq(dim, base=base, device=device)
    if isinstance(seq_len, torch.Tensor) and not _depends_on_length(scaling):
        seq_len = None
    return scaling.frequencies(dim, base, seq_len).to(device)


def _context_length(pos: torch.Tensor) -> int | torch.Tensor:
    """``max(pos) + 1`` as a 0-d tensor (float64, so int64 max cannot overflow), 0 if empty."""
    if pos.numel() == 0:
        return 0
    return pos.max().to(torch.float64) + 1


def _depends_on_length(scaling: RopeScaling | None) -> TypeGuard[RopeScaling]:
    return scaling is not None and scaling.depends_on_length


def _original_length(scaling: RopeScaling) -> int:
    """``original_max_positions`` of a length-dependent scaling (its kinds require it)."""
    orig = scaling.original_max_positions
    assert orig is not None, "a length-dependent scaling has original_max_positions"
    return orig


# ---------------------------------------------------------------------- checks


def _check_x(x: object, layout: str, rotary_dim: int | None) -> tuple[torch.Tensor, int]:
    x = check_floating("x", x, min_dim=2)
    dim = x.shape[-1]
    if dim % 2 or dim == 0:
        raise ValueError(
            f"dim (the last dimension of x) must be a positive even integer, got {dim}"
        )
    check_choice("layout", layout, LAYOUTS)
    return x, _check_rotary_dim(rotary_dim, dim)


def _check_rotary_dim(rotary_dim: int | None, dim: int) -> int:
    if rotary_dim is None:
        return dim
    rotary_dim = check_even("rotary_dim", rotary_dim)
    if rotary_dim > dim:
        raise ValueError(f"rotary_dim must be <= dim={dim}, got {rotary_dim}")
    return rotary_dim


def _batched_positions(name: str, positions: Positions, x: torch.Tensor) -> torch.Tensor:
    """``positions`` as int64 on ``x``'s device, shaped to broadcast against ``x.shape[:-1]``.

    Accepted: ``(seq,)``; ``(batch, seq)`` with ``batch`` in ``(x.shape[0], 1)``
    (one row per batch item, whatever ``x.dim()``); a tensor with as many
    dimensions as ``x.shape[:-1]`` that broadcasts to it.
    """
    pos = as_positions(name, positions, device=x.device)
    seq, lead = x.shape[-2], tuple(x.shape[:-2])
    if pos.dim() == 1 and pos.shape[0] == seq:
        return pos
    if pos.dim() == 2 and lead and pos.shape[1] == seq and pos.shape[0] in (1, lead[0]):
        return pos.view(pos.shape[0], *([1] * (len(lead) - 1)), seq)
    full = lead + (seq,)
    if pos.dim() == len(full) and all(p in (1, s) for p, s in zip(pos.shape, full, strict=True)):
        if pos.shape[-1] == seq:
            return pos
    if lead:
        forms = (
            f"(seq,) = ({seq},); (batch, seq) with batch = x.shape[0] = {lead[0]} or 1 (one row "
            f"per batch item, shared by its heads); or x.shape[:-1] = {full} (size-1 "
            "dimensions broadcast)"
        )
    else:
        forms = f"(seq,) = ({seq},), since x {tuple(x.shape)} has no batch dimension"
    raise ValueError(f"{name} must have shape {forms}; got {tuple(pos.shape)}")


def _check_scaling(scaling: RopeScaling | None) -> RopeScaling | None:
    if scaling is not None and not isinstance(scaling, RopeScaling):
        raise TypeError(
            f"scaling must be a posenc.RopeScaling or None, got {type(scaling).__name__}"
        )
    return scaling


def _split_positions(
    positions: Positions, device: Device
) -> tuple[int, int | None, torch.Tensor | None]:
    """``(start, count, None)`` for a contiguous run, else ``(0, None, int64 tensor)``.

    Detecting a run in a tensor reads its values, so only eager CPU tensors are
    inspected; under tracing every tensor takes the direct path.
    """
    if isinstance(positions, range) and positions.step == 1:
        return positions.start, max(len(positions), 0), None
    pos = as_positions("positions", positions, device=device)
    if pos.dim() == 1 and pos.device.type == "cpu" and pos.numel() > 0 and has_values(pos):
        start = int(pos[0])
        if torch.equal(pos, torch.arange(start, start + pos.numel())):
            return start, pos.numel(), None
    return 0, None, pos
