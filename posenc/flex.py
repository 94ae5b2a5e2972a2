"""Fused, low-memory attention through PyTorch's FlexAttention.

A scheme whose change to the scores is a function of ``(batch, head, query
position, key position)`` and its parameters can be written as a FlexAttention
``score_mod(score, b, h, q_idx, kv_idx)``.  Compiled, FlexAttention fuses it
into the attention kernel: no ``(heads, q_len, k_len)`` bias is built, and the
causal and padding masks become a block mask whose empty blocks are skipped.
The same code runs as a C++ kernel on a CPU and as Triton kernels on a GPU.

Which schemes it expresses, exactly (``tests/test_flex.py`` compares each one
with the eager path and with a float64 reference):

=========================  ================================================  ======
scheme                     score_mod                                         exact
=========================  ================================================  ======
none, ``RotaryEmbedding``  none (``rotate`` runs first, as in the eager       yes
                           path); ``auto`` keeps SDPA, which is faster
``ALiBi``                  ``score - slope[h] * |q_pos - k_pos|``            yes
``T5RelativeBias``         ``score + table[h, clamp(k_pos - q_pos, ±M)]``,   yes
                           the bucket of every distance up to
                           ``M = max_distance`` (beyond, the bucket is
                           constant) computed in float64 beforehand
Shaw, Transformer-XL, DA   content-dependent or not a softmax of scores:     n/a
                           eager only
=========================  ================================================  ======

A custom :class:`~posenc.scheme.PositionalScheme` joins by overriding
:meth:`~posenc.scheme.PositionalScheme.score_mod`.

Positions are those :func:`posenc.attention` gives every scheme (``q_offset``,
per-sample positions of a left-padded batch, KV-cache decoding); the causal
mask is by index, ``k_idx <= q_offset + q_idx``, as in the eager path.  The
caller's boolean mask becomes part of the block mask; a floating mask is split
into its ``-inf`` entries (the block mask) and its finite part (added in the
score_mod).  A query that sees no key gets the zero vector, as everywhere in
posenc.

The compiled kernel is built once per input signature and cached by
``torch.compile`` (module level); block masks of the causal mask alone are
cached by shape.  Compiling needs a C++ compiler on a CPU and Triton on a GPU;
:func:`flex_available` says whether the path can run.  Under
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
import shutil

import torch

from ._checks import check_choice
from .alibi import ALiBi
from .scheme import PositionalScheme, _scheme
from .t5 import T5RelativeBias

__all__ = ["flex_attention", "flex_available", "supports_flex"]

BACKENDS = ("auto", "flex", "eager")

# What PyTorch's FlexAttention kernel takes on a CPU (float64 runs the eager path).
CPU_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

# Block size of the block mask: FlexAttention's default on every device.
BLOCK = 128
# ``backend="auto"`` takes FlexAttention from this many scores per (batch, head) on:
# below it the dense bias is small and the eager path costs no compile.
AUTO_MIN_SCORES = 1 << 20


def _flex_module():
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
    if device_type == "cpu":
        cxx = os.environ.get("CXX", "g++")
        if shutil.which(cxx) is None and shutil.which("c++") is None:
            return f"no C++ compiler found ({cxx!r} or 'c++'), which torch.compile needs on a CPU"
        return None
    if device_type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "Triton is not installed, which torch.compile needs on a GPU"
        return None
    return f"FlexAttention is compiled for 'cpu' and 'cuda' tensors only, got {device_type!r}"


_failed: dict[str, str] = {}  # device type -> why compiling failed there (auto stops trying)


def flex_available(device="cpu") -> bool:
    """Whether :func:`flex_attention` can compile and run on ``device`` (a device or its type)."""
    device_type = torch.device(device).type
    return _compiler_missing(device_type) is None and device_type not in _failed


@functools.cache
def _compiled():
    """``torch.compile(flex_attention)``, built once for the whole process.

    Static shapes: PyTorch 2.13's CPU kernel fails to build (C++ compile
    error) when the sequence lengths are symbolic and a mask reads a tensor, so
    each new shape compiles once.  ``auto`` stops taking new shapes after
    :data:`AUTO_MAX_SHAPES` (Dynamo's recompile limit).
    """
    return torch.compile(_flex_module().flex_attention, dynamic=False)


# Signatures ``auto`` has compiled; beyond the recompile limit Dynamo would run
# FlexAttention uncompiled (dense and slow), so ``auto`` takes the eager path instead.
AUTO_MAX_SHAPES = 8
_auto_shapes: set = set()


def _auto_shape_ok(call) -> bool:
    key = (tuple(call.q.shape), tuple(call.k.shape), call.q.dtype, call.q.device.type)
    if key in _auto_shapes:
        return True
    if len(_auto_shapes) >= AUTO_MAX_SHAPES:
        return False
    _auto_shapes.add(key)
    return True


# --- which schemes FlexAttention expresses ---------------------------------------------------


def _alibi_mod(scheme, q, k):
    work = torch.promote_types(q.dtype, torch.float32)
    slopes = scheme.slopes.to(device=q.device, dtype=work)

    def mod(score, b, h, q_pos, k_pos):
        return score - slopes[h] * (q_pos - k_pos).abs().to(work)

    return mod


def _t5_mod(scheme, q, k):
    m = scheme.max_distance
    rel = torch.arange(-m, m + 1, device=scheme.weight.device)
    # (heads, 2M + 1): the bias of every relative position; beyond +-M the bucket is constant
    table = scheme.weight[scheme.buckets(torch.zeros(1, dtype=torch.long), rel)[0]].t()
    work = torch.promote_types(q.dtype, torch.float32)
    table = table.to(device=q.device, dtype=work)

    # bounds as tensors: a Python int captured here would be traced as a symbol
    lo, hi = torch.tensor([-m, m], device=q.device)

    def mod(score, b, h, q_pos, k_pos):
        return score + table[h, torch.clamp(k_pos - q_pos, lo, hi) - lo]

    return mod


_BUILTIN = {ALiBi: _alibi_mod, T5RelativeBias: _t5_mod}


def _scheme_score_mod(scheme, q, k):
    """The scheme's ``f(score, b, h, q_pos, k_pos)``, ``None`` for no change, or ``False``."""
    mod = scheme.score_mod(q, k)
    if mod is not None:
        return mod
    factory = _BUILTIN.get(type(scheme))
    if factory is not None:
        return factory(scheme, q, k)
    if type(scheme).bias is PositionalScheme.bias:
        return None  # no bias: the scores are unchanged
    return False


def supports_flex(encoding) -> bool:
    """Whether ``encoding`` runs exactly through :func:`flex_attention`.

    True for ``None``, RoPE, ALiBi, T5 and any scheme whose
    :meth:`~posenc.scheme.PositionalScheme.score_mod` returns a function;
    false for schemes that replace ``attend`` or add a bias with no score_mod.
    """
    scheme = _scheme(encoding)
    if type(scheme).attend is not PositionalScheme.attend:
        return False
    if type(scheme).bias is PositionalScheme.bias or type(scheme) in _BUILTIN:
        return True
    return type(scheme).score_mod is not PositionalScheme.score_mod


def _changes_scores(scheme) -> bool:
    return (
        type(scheme) in _BUILTIN
        or type(scheme).score_mod is not PositionalScheme.score_mod
        or type(scheme).bias is not PositionalScheme.bias
    )


# --- the path itself ---------------------------------------------------------------------------


def flex_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    encoding=None,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    q_positions=None,
    k_positions=None,
    scale: float | None = None,
) -> torch.Tensor:
    """:func:`posenc.attention` through compiled FlexAttention: no O(q_len * k_len) bias.

    Same arguments, shapes, conventions and result as :func:`posenc.attention`
    (it is ``attention(..., backend="flex")``).  Raises ``ValueError`` when
    ``encoding`` cannot be written as a score_mod (see :func:`supports_flex`)
    and ``RuntimeError`` when FlexAttention cannot be compiled here (see
    :func:`flex_available`).
    """
    from .scheme import attention

    return attention(
        q, k, v, encoding=encoding, mask=mask, bias=bias, causal=causal, q_offset=q_offset,
        q_positions=q_positions, k_positions=k_positions, scale=scale, backend="flex",
    )  # fmt: skip


def _traced(t: torch.Tensor) -> bool:  # noqa: ARG001  (same signature as _transformed)
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _transformed(t: torch.Tensor) -> bool:
    if _traced(t):
        return False
    return (
        torch._C._functorch.is_functorch_wrapped_tensor(t)
        or t.device.type == "meta"
        or isinstance(t, torch._subclasses.FakeTensor)
    )


def choose(backend: str, scheme, call, *, needs_grad: bool) -> bool:
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
    q = call.q
    if backend == "flex":
        if not supports_flex(scheme):
            raise ValueError(
                f"backend='flex' cannot express encoding {scheme!r}: it replaces attention or "
                f"adds a content-dependent bias; use backend='eager' or 'auto' (FlexAttention "
                f"takes None, RotaryEmbedding, ALiBi, T5RelativeBias and schemes with a "
                f"score_mod)"
            )
        if _traced(q) or _transformed(q):
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
        why = _compiler_missing(q.device.type) or _failed.get(q.device.type)
        if why is not None:
            raise RuntimeError(f"backend='flex' cannot run here: {why}")
        return True
    return (
        not needs_grad
        and not _traced(q)
        and not _transformed(q)
        and type(q) is torch.Tensor
        and (q.device.type != "cpu" or q.dtype in CPU_DTYPES)
        and _changes_scores(scheme)
        and supports_flex(scheme)
        and q.shape[-2] * call.k.shape[-2] >= AUTO_MIN_SCORES
        and flex_available(q.device)
        and _auto_shape_ok(call)
    )


def run(scheme, call, causal: bool, *, explicit: bool):
    """FlexAttention for a validated call of :func:`posenc.attention` (4-D tensors)."""
    q, k, v = call.q, call.k, call.v
    q, k = scheme.rotate(q, k, call.q_positions, call.k_positions)
    mod = _scheme_score_mod(scheme, q, k)
    if mod is False:  # supports_flex said yes, so a custom score_mod returned None
        raise ValueError(f"{scheme!r}.score_mod returned None but the scheme has a bias")
    batch, heads, q_len = q.shape[:3]
    k_len = k.shape[-2]
    keep, extra = _split_mask(call.mask, batch, heads, q_len, k_len)
    offset = _default_offset(call.q_positions, call.k_positions, call.q_offset)
    score_mod = _score_mod(mod, call.q_positions, call.k_positions, extra, batch, offset)
    block_mask = _block_mask(keep, causal, call.q_offset, batch, heads, q_len, k_len, q.device)
    fn = _compiled()
    kwargs = dict(
        score_mod=score_mod,
        block_mask=block_mask,
        scale=call.scale,
        enable_gqa=k.shape[1] != heads,
    )
    if explicit:
        return fn(q, k, v, **kwargs)
    try:
        return fn(q, k, v, **kwargs)
    except Exception as exc:  # compiling failed: auto stops trying on this device type
        _failed[q.device.type] = f"compiling FlexAttention failed ({type(exc).__name__}: {exc})"
        return None


def _split_mask(mask, batch, heads, q_len, k_len):
    """The caller's merged mask as a boolean keep-mask and a finite additive part (or None)."""
    if mask is None:
        return None, None
    if mask.dtype == torch.bool:
        return mask, None
    keep = mask != float("-inf")
    return keep, mask.masked_fill(~keep, 0.0)


def _default_offset(q_positions, k_positions, q_offset):
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


def _score_mod(mod, q_positions, k_positions, extra, batch, offset=None):
    """One score_mod: the scheme's term at the positions, then the caller's finite bias."""
    if mod is None and extra is None:
        return None
    if offset is not None and extra is None:

        def by_index(score, b, h, q_idx, kv_idx):  # default positions: no lookup
            return mod(score, b, h, q_idx + offset, kv_idx)

        return by_index
    qp = q_positions if q_positions.dim() == 2 else q_positions.unsqueeze(0)
    kp = k_positions if k_positions.dim() == 2 else k_positions.unsqueeze(0)
    qp, kp = qp.expand(batch, -1), kp.expand(batch, -1)
    # which dimensions of the caller's bias are not broadcast (all cells set: traceable)
    eb, eh, eq, ek = (1, 1, 1, 1) if extra is None else (int(s != 1) for s in extra.shape)

    def score_mod(score, b, h, q_idx, kv_idx):
        if mod is not None:
            score = mod(score, b, h, qp[b, q_idx], kp[b, kv_idx])
        if extra is not None:
            score = score + extra[b * eb, h * eh, q_idx * eq, kv_idx * ek].to(score.dtype)
        return score

    return score_mod


_causal_cache: dict = {}


def _block_mask(keep, causal, q_offset, batch, heads, q_len, k_len, device):
    """The block mask of the causal mask and the caller's keep-mask, or ``None`` for neither.

    Built from block-level occupancy, O(batch * heads * (q_len / 128) * (k_len /
    128)) plus one pass over the caller's mask, never a dense (q_len, k_len) tensor.
    """
    if causal and q_offset >= k_len - 1:
        causal = False  # every query sees every key
    if not causal and keep is None:
        return None
    fa = _flex_module()
    key = (causal, q_offset, q_len, k_len, str(device))
    if keep is None and key in _causal_cache:
        return _causal_cache[key]
    qb, kb = -(-q_len // BLOCK), -(-k_len // BLOCK)
    q_lo = torch.arange(qb, device=device) * BLOCK  # first query of each block
    q_hi = (q_lo + BLOCK).clamp(max=q_len) - 1
    k_lo = torch.arange(kb, device=device) * BLOCK
    k_hi = (k_lo + BLOCK).clamp(max=k_len) - 1
    if causal:
        some = k_lo[None, :] <= q_hi[:, None] + q_offset  # (qb, kb): a key visible
        every = k_hi[None, :] <= q_lo[:, None] + q_offset  # every key visible
    else:
        some = torch.ones(qb, kb, dtype=torch.bool, device=device)
        every = some
    some, every = some[None, None], every[None, None]
    if keep is not None:
        some = some & _blocks(keep, qb, kb, fill=False, op=torch.any)
        every = every & _blocks(keep, qb, kb, fill=True, op=torch.all)
    partial = some & ~every
    b_, h_ = some.shape[:2]
    partial = partial.expand(b_, h_, qb, kb)
    every = every.expand(b_, h_, qb, kb)

    def ordered(dense):
        num = dense.sum(-1, dtype=torch.int32)
        idx = torch.argsort(~dense, dim=-1, stable=True).to(torch.int32)
        return num.contiguous(), idx.contiguous()

    kv_num, kv_idx = ordered(partial)
    full_num, full_idx = ordered(every)
    mask_mod = _mask_mod(keep, causal, q_offset, device)
    bm = fa.BlockMask.from_kv_blocks(
        kv_num, kv_idx, full_num, full_idx, BLOCK_SIZE=BLOCK, mask_mod=mask_mod,
        seq_lengths=(q_len, k_len),
    )  # fmt: skip
    if keep is None:
        if len(_causal_cache) >= 64:
            _causal_cache.clear()
        _causal_cache[key] = bm
    return bm


def _blocks(keep, qb, kb, *, fill, op):
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


def _mask_mod(keep, causal, q_offset, device):
    offset = torch.tensor(q_offset, device=device)
    kb, kh, kq, kk = (1, 1, 1, 1) if keep is None else (int(s != 1) for s in keep.shape)

    def mask_mod(b, h, q_idx, kv_idx):
        # q_offset as a tensor: a new offset (chunked prefill) needs no recompile
        ok = kv_idx <= q_idx + offset if causal else kv_idx >= 0
        if keep is not None:
            ok = ok & keep[b * kb, h * kh, q_idx * kq, kv_idx * kk]
        return ok

    return mask_mod
