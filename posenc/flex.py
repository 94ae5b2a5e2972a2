"""Fused, low-memory attention through PyTorch's FlexAttention.

A scheme whose change to the scores is a function of ``(batch, head, query
position, key position)`` and its parameters can be written as a FlexAttention
``score_mod(score, b, h, q_idx, kv_idx)``.  Compiled, FlexAttention fuses it
into the attention kernel: no ``(heads, q_len, k_len)`` bias is built, and the
causal and padding masks become a block mask whose empty blocks are skipped.
The same code runs as a C++ kernel on a CPU and as Triton kernels on a GPU.

Each scheme writes its own ``score_mod`` (:meth:`posenc.PositionalScheme.score_mod`);
this module never names a scheme.  It runs a scheme exactly when
:meth:`~posenc.PositionalScheme.fused` says so: the scheme keeps the default
``attend`` and defines its ``score_mod`` at least as deep in its class
hierarchy as its ``bias`` (so a subclass of ALiBi with other slopes stays
fused, and a subclass that overrides only ``bias`` is refused rather than
computed with its parent's term).  Schemes that only rotate (RoPE, xPos) or do
nothing run too (``rotate`` first, as in the eager path), though ``auto``
keeps SDPA for them, which is faster.  Schemes with their own ``attend``
(Shaw, Transformer-XL, DA-Transformer) run eager only.  ``tests/test_flex.py``
compares every registered fused scheme with the eager path and with a
float64 reference.

Positions are those :func:`posenc.attention` gives every scheme (``q_offset``,
per-sample positions of a left-padded batch, KV-cache decoding); the causal
mask is by index, ``k_idx <= q_offset + q_idx``, as in the eager path.  The
caller's boolean mask becomes part of the block mask; a floating mask is split
into its ``-inf`` entries (the block mask) and its finite part (added in the
score_mod).  A query that sees no key gets the zero vector, as everywhere in
posenc.

Compiling, per device.  Each scheme class and call signature (dtype, device,
batch, head counts, head dimension, mask form) gets its own compiled region
(:mod:`posenc._compile`: ``dynamic=False`` with only the sequence lengths
marked dynamic, a fresh code object per region, the CPU's vector ISA in the
cache key; posenc changes no global compiler setting).  So one scheme's graphs
and failures never touch another's, and no call depends on what ran before.

* CPU: Inductor writes a C++ kernel and builds it with the system's C++
  compiler.  One graph with symbolic lengths serves every length of a
  signature, so a new length costs a guard check, not a compile.  Tables the
  kernel reads by position (per-sample positions, a padding mask, a finite
  bias) have static sizes, padded to power-of-two buckets of at least 256: a
  new bucket compiles once.  A length of 1 (decoding) gets its own graph.
  PyTorch's CPU kernel needs AVX2 (x86-64, not with
  ``ATEN_CPU_CAPABILITY=default``); :func:`flex_available` says so.
* CUDA: Inductor writes Triton kernels, with the same dynamic lengths and
  buckets (not measured here: no GPU on the benchmark machine).

Upstream faults routed around (each has a standalone check in ``.ci/upstream/``
that prints "present" or "absent", and the README says when a workaround can go):

* On the CPU, PyTorch 2.13's kernel computes ``q @ k^T`` wrongly for some
  lengths when the head dimension is below 24 and a multiple of the vector
  width (head_dim 8 or 16 with AVX2): it reads keys past a block's tail and
  writes scores past its row (``flex_cpu_tail_rows.py``).  posenc pads ``q``
  and ``k`` with zeros to head_dim 32 there (the scores are unchanged) and says
  so once with a :class:`PaddedHeadDim` warning.
* A symbolic table size breaks the CPU kernel's build
  (``flex_cpu_symbolic_table.py``), and Inductor's graph cache ignores the
  vector ISA (``inductor_cache_isa.py``): the regions above avoid both.

Compiling needs a C++ compiler and AVX2 on a CPU and Triton on a GPU;
:func:`flex_available` says whether they are there.  Compiled with
``fullgraph=True``, FlexAttention never runs uncompiled (dense and slow): if a
scheme's graph fails to compile, ``backend="auto"`` warns once and takes the
eager path for that scheme class and signature, and ``backend="flex"`` raises
``RuntimeError`` quoting that scheme's failure; ``posenc.flex.failures()`` lists
them.  Block masks of the causal mask alone are cached by shape.  Under
``torch.compile``/``torch.export`` tracing, functorch transforms and on meta
tensors ``backend="auto"`` takes the eager path (traceable) and
``backend="flex"`` raises.  On a CPU the kernel takes float32, bfloat16 and
float16 only, and PyTorch has no FlexAttention backward there: for float64 or
when gradients are needed ``auto`` takes the eager path and ``flex`` raises.

Precision: scores are float32 for float32, bfloat16 and float16 inputs
(float64 for float64), so the bias term is added in float32 at least; the eager
path rounds its dense bias to the input dtype instead.
"""

from __future__ import annotations

import functools
import os
import types
from collections.abc import Callable, Hashable
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch

from . import _compile
from ._checks import check_choice, warn_caller
from ._runtime import has_values
from ._types import ScoreMod
from .context import CallContext
from .scheme import PositionalScheme, as_scheme

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["PaddedHeadDim", "flex_available", "supports_flex"]

BACKENDS = ("auto", "flex", "eager")

# What PyTorch's FlexAttention kernel takes on a CPU (float64 runs the eager path).
CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Block size of the block mask: FlexAttention's default on every device.
BLOCK = 128
# ``backend="auto"`` takes FlexAttention from this many scores per (batch, head) on:
# below it the dense bias is small and the eager path costs no compile.
AUTO_MIN_SCORES = 1 << 20

# FlexAttention's mask_mod(b, h, q_idx, kv_idx) -> keep, and the tensors of a block mask
# (kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices).
_MaskMod: TypeAlias = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
_Blocks: TypeAlias = tuple[torch.Tensor, ...]
# What a compiled graph depends on: the scheme class, then the signature (see _signature).
_Key: TypeAlias = "tuple[type[PositionalScheme], Unpack[tuple[Hashable, ...]]]"


def _flex_module() -> types.ModuleType | None:
    try:
        from torch.nn.attention import flex_attention as fa
    except ImportError:  # torch < 2.5
        return None
    return fa


@functools.cache
def _compiler_missing(device_type: str) -> str | None:
    """Why FlexAttention cannot be compiled for ``device_type``, or ``None`` if it can."""
    if _flex_module() is None:
        return f"torch {torch.__version__} has no torch.nn.attention.flex_attention (needs 2.5+)"
    if device_type not in ("cpu", "cuda"):
        return f"FlexAttention is compiled for 'cpu' and 'cuda' tensors only, got {device_type!r}"
    why = _compile.missing_compiler(device_type)
    if why is None and device_type == "cpu":
        why = _cpu_kernel_missing()
    return why


def _cpu_kernel_missing() -> str | None:
    """Why PyTorch has no FlexAttention CPU kernel here, or ``None`` (its own test, mirrored)."""
    capability = os.environ.get("ATEN_CPU_CAPABILITY")
    if capability == "default":
        return "ATEN_CPU_CAPABILITY=default: PyTorch's FlexAttention CPU kernel needs AVX2"
    if not torch.cpu._is_avx2_supported():
        return "PyTorch's FlexAttention CPU kernel needs an x86-64 CPU with AVX2"
    return None


def flex_available(device: torch.device | str = "cpu") -> bool:
    """Whether FlexAttention can compile and run on ``device`` (a device or its type).

    This says whether the tools are there (PyTorch 2.5+, a C++ compiler and
    AVX2 on a CPU, Triton on a GPU).  A compile failure of one scheme is remembered for
    that scheme and that signature only (see ``posenc.flex.failures()``), so it never
    makes this false.

    Parameters
    ----------
    device
        A :class:`torch.device` or a device string (``"cpu"``, ``"cuda"``,
        ``"cuda:1"``, ...); only its type matters.

    Returns
    -------
    bool
        True when FlexAttention compiles on this type of device; the answer is
        cached per device type.
    """
    return _compiler_missing(torch.device(device).type) is None


# On a CPU, PyTorch 2.13's kernel is wrong below this head dimension on some ISAs
# (.ci/upstream/flex_cpu_tail_rows.py); q and k are zero-padded to CPU_PADDED_HEAD_DIM.
CPU_MIN_HEAD_DIM = 24
CPU_PADDED_HEAD_DIM = 32


class PaddedHeadDim(UserWarning):
    """Said once: on a CPU, FlexAttention pads a head dimension below 24 (exact, slower)."""


def _flex_call(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    blocks: _Blocks | None,
    mask_mod: _MaskMod | None,
    **kwargs: Any,
) -> torch.Tensor:
    """FlexAttention itself; each region compiles a copy of this function (its own code object).

    The block mask is built here, from its tensors ``blocks`` (or none), so that
    its sequence lengths are those of ``q`` and ``k``: symbolic, where a
    BlockMask made outside would carry them as constants and recompile per length.
    """
    fa = _flex_module()
    assert fa is not None  # run() is only reached where _compiler_missing found it
    block_mask = None
    if blocks is not None:
        block_mask = fa.BlockMask.from_kv_blocks(
            *blocks, BLOCK_SIZE=BLOCK, mask_mod=mask_mod, seq_lengths=(q.shape[-2], k.shape[-2]),
            compute_q_blocks=q.device.type != "cpu",  # for the backward, which CPUs lack
        )  # fmt: skip
    out: torch.Tensor = fa.flex_attention(q, k, v, block_mask=block_mask, **kwargs)
    return out


# (scheme class, signature) -> why compiling failed there: only that scheme and
# that signature take the eager path afterwards; every other keeps the fused one.
_failed: dict[_Key, str] = {}
_warned: set[tuple[type[PositionalScheme], str]] = set()


def failures() -> dict[tuple[Hashable, ...], str]:
    """What failed to compile so far: ``{(scheme class name, signature): reason}`` (a copy)."""
    return {(cls.__name__, *sig): why for (cls, *sig), why in _failed.items()}


def _signature(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
) -> tuple[Hashable, ...]:
    """What a compiled graph depends on besides the lengths (which are dynamic).

    A length of 1 is kept apart (Dynamo specialises sizes 0 and 1).
    """
    mask = None if ctx.mask is None else (ctx.mask.dtype, tuple(ctx.mask.shape[:2]))
    return (
        q.dtype, str(q.device), q.shape[0], q.shape[1], k.shape[1], q.shape[-1], v.shape[-1],
        min(q.shape[-2], 2), min(k.shape[-2], 2), ctx.causal, mask,
    )  # fmt: skip


def _warn_once(cls: type[PositionalScheme], why: str) -> None:
    key = (cls, why.split(":")[0])
    if key not in _warned:
        _warned.add(key)
        warn_caller(
            f"posenc.attention(backend='auto'): {cls.__name__} takes the eager path "
            f"(SDPA with a dense bias) from here on for this signature: {why}",
            RuntimeWarning,
        )


# --- which schemes FlexAttention expresses ---------------------------------------------------


def supports_flex(encoding: PositionalScheme | None) -> bool:
    """Whether ``encoding`` runs exactly through FlexAttention (``backend="flex"``).

    True for ``None``, schemes that only rotate (RoPE) and schemes whose
    ``score_mod`` is defined at least as deep in their class hierarchy as
    their ``bias`` (ALiBi, T5 and their subclasses, any scheme that writes a
    ``score_mod``); false for schemes that replace ``attend`` or add a bias
    with no matching ``score_mod``.  See :meth:`posenc.PositionalScheme.fused`.

    Parameters
    ----------
    encoding
        A :class:`posenc.PositionalScheme`, or ``None`` (no positional encoding).

    Returns
    -------
    bool
        Whether ``posenc.attention(..., backend="flex")`` accepts this
        encoding.  It says nothing of the device: see :func:`flex_available`.

    Raises
    ------
    TypeError
        If ``encoding`` is neither a scheme nor ``None``.
    """
    return type(as_scheme(encoding)).fused()


def _why_not(scheme: PositionalScheme) -> str:
    cls = type(scheme)
    name = cls.__name__
    if "attend" in cls.hooks():
        return f"{name} replaces attention (its own attend), which FlexAttention cannot express"
    return (
        f"{name} defines bias in a subclass of the class that defines its score_mod, so "
        f"FlexAttention would compute a different term; define score_mod in {name} too"
    )


# --- the path itself ---------------------------------------------------------------------------


def choose(
    backend: str,
    scheme: PositionalScheme,
    q: torch.Tensor,
    k: torch.Tensor,
    ctx: CallContext,
    *,
    needs_grad: bool,
) -> bool:
    """Whether :func:`posenc.attention` runs this call through FlexAttention.

    ``"eager"``: never.  ``"flex"``: always, or a clear error.  ``"auto"``: only
    where it is exact (the scheme changes the scores with a score_mod), outside
    tracing and transforms, without autograd, on a device where compiling
    works, and where the scores are large enough for the saved bias to pay for
    the kernel.
    """
    backend = check_choice("backend", backend, BACKENDS)
    if backend == "eager":
        return False
    cls = type(scheme)
    if backend == "flex":
        if not cls.fused():
            raise ValueError(
                f"backend='flex' cannot express encoding {cls.__name__}: {_why_not(scheme)}; "
                f"use backend='eager' or 'auto'"
            )
        if not has_values(q):
            raise ValueError(
                "backend='flex' compiles its own kernel and is not available under "
                "torch.compile/torch.export tracing, inside vmap/grad/jvp or on meta/fake "
                "tensors; use backend='auto' (the eager path there) or 'eager'"
            )
        if q.device.type == "cpu" and q.dtype not in CPU_DTYPES:
            raise ValueError(
                f"backend='flex' takes float32, bfloat16 and float16 on a CPU (PyTorch's "
                f"FlexAttention kernel), got {q.dtype}; use backend='eager' or 'auto'"
            )
        if needs_grad and q.device.type == "cpu":
            raise ValueError(
                "backend='flex' has no backward on a CPU (PyTorch's FlexAttention computes "
                "gradients on a GPU only); use backend='eager' or 'auto', or torch.no_grad()"
            )
        why = _compiler_missing(q.device.type)
        if why is not None:
            raise RuntimeError(f"backend='flex' cannot run here: {why}")
        return True
    return (
        not needs_grad
        and has_values(q)
        and type(q) is torch.Tensor
        and (q.device.type != "cpu" or q.dtype in CPU_DTYPES)
        and cls.changes_scores()
        and cls.fused()
        and q.shape[-2] * k.shape[-2] >= AUTO_MIN_SCORES
        and flex_available(q.device)
    )


def run(
    scheme: PositionalScheme,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: CallContext,
    *,
    explicit: bool,
) -> torch.Tensor | None:
    """FlexAttention for validated 4-D tensors, ``q`` and ``k`` already rotated.

    Returns ``None`` when this scheme cannot be compiled for this signature
    and ``explicit`` is false: ``auto`` then takes the eager path, with a
    one-time warning saying why, and remembers the failure for this scheme
    class and signature only.  With ``explicit`` (``backend="flex"``) the
    failure raises ``RuntimeError`` quoting it.  FlexAttention never runs
    uncompiled.
    """
    cls = type(scheme)
    key: _Key = (cls, *_signature(q, k, v, ctx))
    why = _failed.get(key)
    if why is None:
        args, kwargs = _prepare(scheme, q, k, v, ctx)
        name = f"flex_attention_{cls.__name__}"
        try:
            return _compile.call(_flex_call, key, name, q.device.type, *args, **kwargs)
        except Exception as exc:  # compiling failed
            why = f"compiling FlexAttention failed ({type(exc).__name__}: {_first_line(exc)})"
            _failed[key] = why
            if explicit:
                raise RuntimeError(
                    f"backend='flex' cannot run {cls.__name__} here: {why}; "
                    f"use backend='auto' or 'eager'"
                ) from exc
    if explicit:
        raise RuntimeError(f"backend='flex' cannot run {cls.__name__} here: {why}")
    _warn_once(cls, why)
    return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else ""


def _prepare(
    scheme: PositionalScheme,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    ctx: CallContext,
) -> tuple[
    tuple[torch.Tensor, torch.Tensor, torch.Tensor, _Blocks | None, _MaskMod | None],
    dict[str, Any],
]:
    """FlexAttention's arguments for this call: ``(q, k, v)`` and its keywords."""
    mod = scheme.score_mod(ctx)
    if mod is None and type(scheme).changes_scores():
        raise ValueError(
            f"{type(scheme).__name__}.score_mod returned None but the scheme has a bias"
        )
    batch, heads, q_len = q.shape[:3]
    k_len = k.shape[-2]
    keep, extra = _split_mask(ctx.mask, batch, heads, q_len, k_len)
    offset = _default_offset(ctx.q_positions, ctx.k_positions, ctx.q_offset)
    score_mod = _score_mod(mod, ctx.q_positions, ctx.k_positions, extra, batch, offset)
    blocks, mask_mod = _block_mask(keep, ctx.causal, ctx.q_offset, q_len, k_len, q.device)
    kwargs: dict[str, Any] = dict(
        score_mod=score_mod, scale=ctx.scale, enable_gqa=k.shape[1] != heads
    )
    q, k = _pad_head_dim(q, k)
    qd, kd, vd = _compile.dynamic_views(q, k, v, dims=(2,))
    return (qd, kd, vd, blocks, mask_mod), kwargs


_said: set[type[Warning]] = set()


def _pad_head_dim(q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``q`` and ``k`` zero-padded to a head dimension the CPU kernel computes right.

    The padded features add exact zeros to every score, and the scale was fixed
    from the real head dimension, so the output is unchanged.
    """
    d = q.shape[-1]
    if q.device.type != "cpu" or d >= CPU_MIN_HEAD_DIM:
        return q, k
    if PaddedHeadDim not in _said:
        _said.add(PaddedHeadDim)
        warn_caller(
            f"posenc FlexAttention on a CPU pads head_dim {d} (< {CPU_MIN_HEAD_DIM}) with zeros "
            f"to {CPU_PADDED_HEAD_DIM}: PyTorch's CPU kernel returns wrong rows for some lengths "
            f"at such head dimensions on AVX2 (see the README, 'Upstream workarounds'). The "
            f"result is exact; this is said once.",
            PaddedHeadDim,
        )
    pad = (0, CPU_PADDED_HEAD_DIM - d)
    return torch.nn.functional.pad(q, pad), torch.nn.functional.pad(k, pad)


def _split_mask(
    mask: torch.Tensor | None, batch: int, heads: int, q_len: int, k_len: int
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The caller's merged mask as a boolean keep-mask and a finite additive part (or None)."""
    if mask is None:
        return None, None
    if mask.dtype == torch.bool:
        return mask, None
    keep = mask != float("-inf")
    return keep, mask.masked_fill(~keep, 0.0)


def _default_offset(
    q_positions: torch.Tensor, k_positions: torch.Tensor, q_offset: int
) -> torch.Tensor | None:
    """``q_offset`` as a 0-d tensor when the positions are the default ones, else ``None``.

    Keys at ``0 .. k_len-1`` and queries at ``q_offset + i`` need no lookup in
    the kernel: ``k_pos = kv_idx`` and ``q_pos = q_idx + q_offset``.
    """
    if q_positions.dim() != 1 or k_positions.dim() != 1:
        return None
    k_len, q_len = k_positions.shape[0], q_positions.shape[0]
    ar = torch.arange(max(k_len, q_len), device=k_positions.device)
    if not torch.equal(k_positions, ar[:k_len]) or not torch.equal(
        q_positions, ar[:q_len] + q_offset
    ):
        return None
    return torch.tensor(q_offset, device=k_positions.device)


def _score_mod(
    mod: ScoreMod | None,
    q_positions: torch.Tensor,
    k_positions: torch.Tensor,
    extra: torch.Tensor | None,
    batch: int,
    offset: torch.Tensor | None = None,
) -> ScoreMod | None:
    """One score_mod: the scheme's term at the positions, then the caller's finite bias."""
    if mod is None and extra is None:
        return None
    # extra is None here, so mod is set (both None returned above)
    if offset is not None and extra is None and mod is not None:

        def by_index(  # default positions: no lookup
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            q_idx: torch.Tensor,
            kv_idx: torch.Tensor,
        ) -> torch.Tensor:
            return mod(score, b, h, q_idx + offset, kv_idx)

        return by_index
    qp = q_positions if q_positions.dim() == 2 else q_positions.unsqueeze(0)
    kp = k_positions if k_positions.dim() == 2 else k_positions.unsqueeze(0)
    qp, kp = qp.expand(batch, -1), kp.expand(batch, -1)
    # which dimensions of the caller's bias are not broadcast (all cells set: traceable)
    eb, eh, eq, ek = (1, 1, 1, 1) if extra is None else (int(s != 1) for s in extra.shape)
    qp, kp = _bucketed(qp, (1,)), _bucketed(kp, (1,))
    if extra is not None:
        extra = _bucketed(extra, (2, 3))

    def score_mod(
        score: torch.Tensor,
        b: torch.Tensor,
        h: torch.Tensor,
        q_idx: torch.Tensor,
        kv_idx: torch.Tensor,
    ) -> torch.Tensor:
        if mod is not None:
            score = mod(score, b, h, qp[b, q_idx], kp[b, kv_idx])
        if extra is not None:
            score = score + extra[b * eb, h * eh, q_idx * eq, kv_idx * ek].to(score.dtype)
        return score

    return score_mod


def _capacity(n: int) -> int:
    """The length bucket of ``n``: the next power of two, at least two blocks."""
    return max(2 * BLOCK, 1 << (n - 1).bit_length())


def _bucketed(t: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """``t`` padded along ``dims`` (those not broadcast) to their bucket, with static sizes.

    A table the kernel reads by position (per-sample positions, a padding
    mask, a finite bias) must not have symbolic sizes: PyTorch 2.13's CPU
    kernel fails to build then.  Padded to a power of two (never read past
    the real length), a new length recompiles only when it enters a new
    bucket, so a thousand lengths cost about log2(1000) compiles, not a thousand.
    """
    pad = [0, 0] * t.dim()
    for d in dims:
        n = t.shape[d]
        if n > 1:
            pad[2 * (t.dim() - 1 - d) + 1] = _capacity(n) - n
    # contiguous: a static stride must not carry the caller's length (pos[:, -1:])
    t = torch.nn.functional.pad(t, pad) if any(pad) else t.contiguous().view(t.shape)
    torch._dynamo.mark_static(t)
    return t


_causal_cache: dict[tuple[bool, int, int, int, str], tuple[_Blocks, _MaskMod]] = {}


def _block_mask(
    keep: torch.Tensor | None,
    causal: bool,
    q_offset: int,
    q_len: int,
    k_len: int,
    device: torch.device,
) -> tuple[_Blocks | None, _MaskMod | None]:
    """The block mask of the causal mask and the caller's keep-mask: ``(blocks, mask_mod)``.

    ``blocks`` is ``(kv_num_blocks, kv_indices, full_kv_num_blocks,
    full_kv_indices)`` with their block counts marked dynamic (``_flex_call``
    builds the BlockMask from them), or ``None`` when nothing is masked.  Built
    from block-level occupancy, O(batch * heads * (q_len / 128) * (k_len /
    128)) plus one pass over the caller's mask, never a dense (q_len, k_len) tensor.
    """
    if causal and q_offset >= k_len - 1:
        causal = False  # every query sees every key
    if not causal and keep is None:
        return None, None
    key = (causal, q_offset, q_len, k_len, str(device))
    if keep is None and key in _causal_cache:
        return _causal_cache[key]
    # at least two blocks each way, the extra ones empty: Dynamo specialises a size of 1,
    # so a single block would get a graph of its own
    qb, kb = max(2, -(-q_len // BLOCK)), max(2, -(-k_len // BLOCK))
    q_lo = torch.arange(qb, device=device) * BLOCK  # first query of each block
    q_hi = (q_lo + BLOCK).clamp(max=q_len) - 1
    k_lo = torch.arange(kb, device=device) * BLOCK
    k_hi = (k_lo + BLOCK).clamp(max=k_len) - 1
    real = (q_lo < q_len)[:, None] & (k_lo < k_len)[None, :]
    if causal:
        some = real & (k_lo[None, :] <= q_hi[:, None] + q_offset)  # (qb, kb): a key visible
        every = real & (k_hi[None, :] <= q_lo[:, None] + q_offset)  # every key visible
    else:
        some = every = real
    some, every = some[None, None], every[None, None]
    if keep is not None:
        some = some & _blocks(keep, qb, kb, fill=False, op=torch.any)
        every = every & _blocks(keep, qb, kb, fill=True, op=torch.all)
    partial = some & ~every
    b_, h_ = some.shape[:2]
    partial = partial.expand(b_, h_, qb, kb)
    every = every.expand(b_, h_, qb, kb)

    def ordered(dense: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        num = dense.sum(-1, dtype=torch.int32)
        idx = torch.argsort(~dense, dim=-1, stable=True).to(torch.int32)
        return num.contiguous(), idx.contiguous()

    # the block counts follow the lengths, so they are symbolic too
    blocks = tuple(_compile.dynamic_views(*ordered(partial), *ordered(every), dims=(2, 3)))
    result = blocks, _mask_mod(keep, causal, q_offset, device)
    if keep is None:
        if len(_causal_cache) >= 64:
            _causal_cache.clear()
        _causal_cache[key] = result
    return result


class _Reduce(Protocol):
    """A reduction over one dimension, as ``torch.any`` and ``torch.all``."""

    def __call__(self, input: torch.Tensor, dim: int) -> torch.Tensor: ...


def _blocks(keep: torch.Tensor, qb: int, kb: int, *, fill: bool, op: _Reduce) -> torch.Tensor:
    """Reduce a keep-mask ``(B|1, H|1, Q|1, K|1)`` over blocks: ``(B|1, H|1, qb|1, kb|1)``.

    Size-1 dimensions stay size 1 (a padding mask is never expanded to the
    scores); the rows and columns past the end of the last block take ``fill``.
    """
    for dim, blocks in ((2, qb), (3, kb)):
        n = keep.shape[dim]
        if n == 1:
            continue
        pad = [0, 0] * (3 - dim) + [0, blocks * BLOCK - n]
        keep = torch.nn.functional.pad(keep, pad, value=fill)
        keep = op(keep.unflatten(dim, (blocks, BLOCK)), dim=dim + 1)
    return keep


def _mask_mod(
    keep: torch.Tensor | None, causal: bool, q_offset: int, device: torch.device
) -> _MaskMod:
    offset = torch.tensor(q_offset, device=device)
    kb, kh, kq, kk = (1, 1, 1, 1) if keep is None else (int(s != 1) for s in keep.shape)
    if keep is not None:
        keep = _bucketed(keep, (2, 3))

    def mask_mod(
        b: torch.Tensor, h: torch.Tensor, q_idx: torch.Tensor, kv_idx: torch.Tensor
    ) -> torch.Tensor:
        # q_offset as a tensor: a new offset (chunked prefill) needs no recompile
        ok = kv_idx <= q_idx + offset if causal else kv_idx >= 0
        if keep is not None:
            ok = ok & keep[b * kb, h * kh, q_idx * kq, kv_idx * kk]
        return ok

    return mask_mod
