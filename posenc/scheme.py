"""Scaled dot-product attention with a pluggable positional scheme.

One entry point, :func:`attention`, runs every scheme in this package.  A scheme
is a :class:`PositionalScheme`; it enters attention through one of three hooks:

* ``rotate``: transform queries and keys before the dot product (RoPE);
* ``bias``: add a term to the scaled scores (ALiBi, T5, Shaw's key term);
* ``attend``: replace the whole computation, when the scheme changes more than
  the scores (Shaw's value term, Transformer-XL's two query shifts,
  DA-Transformer's rescaled ReLU scores).

Which scheme uses which hook, and whether its path builds an O(q_len * k_len)
tensor beside the scores (``materializes_bias``):

=========================  ===========================  =======================  ============
scheme                     hook                         O(n^2) bias              per-sample
                                                        materialised             positions
=========================  ===========================  =======================  ============
none (``encoding=None``)   none                         no                       (unused)
``RotaryEmbedding``        ``rotate``                   no                       yes
``ALiBi``                  ``bias``                     yes                      yes
``T5RelativeBias``         ``bias``                     yes                      yes
``ShawRelativeAttention``  ``bias``; ``attend`` with    yes (content-dependent)  yes
                           ``values=True``
``TransformerXLScheme``    ``attend`` (``q + u`` for    yes (content-dependent)  yes
                           content, ``q + v`` against
                           the sinusoid)
``DAAttention``            ``attend`` (ReLU scores      yes (coefficients,       yes
                           times distance coefficients  weights)
                           then softmax)
=========================  ===========================  =======================  ============

Every scheme takes grouped-query keys and values, masks in every accepted form,
decodes step by step with a KV cache exactly like the full causal pass, and
runs under ``torch.compile(fullgraph=True)``, ``torch.export``, autograd and on
meta tensors; ``tests/test_conformance.py`` checks each of these for each
scheme.  Adding a scheme: one module with a ``PositionalScheme`` subclass, and
one line in that test's table.

Without any mask or bias, the causal mask is not materialised when SDPA can do
without it: ``is_causal`` covers ``q_offset == 0``, and no mask is needed when
every query sees every key (``q_offset >= k_len - 1``, e.g. one decoding step).

Shapes and conventions, shared by every scheme
----------------------------------------------
* ``q`` is ``(batch, heads, q_len, d)``, ``k`` is ``(batch, kv_heads, k_len, d)``
  and ``v`` is ``(batch, kv_heads, k_len, d_v)``.  ``kv_heads`` divides
  ``heads`` (grouped-query attention; 1 is multi-query attention): query head
  ``h`` uses key/value head ``h // (heads // kv_heads)``, as with
  ``repeat_interleave``.  Fewer dimensions are accepted, ``(heads, len, d)`` and
  ``(len, d)``, and so are several batch dimensions; q, k and v must have the
  same number of dimensions and the same batch dimensions.  Schemes always
  receive 4-D tensors.
* Keys sit at positions ``0 .. k_len-1``.  Queries sit at
  ``q_offset .. q_offset+q_len-1``; the default ``q_offset = k_len - q_len``
  aligns them with the *last* keys, which is what decoding with a KV cache
  needs (one new query at the end of a long cache).
* ``causal=True`` lets query ``i`` see key ``j`` iff ``j <= q_offset + i``: by
  index, whatever the positions.
* Explicit positions (``q_positions``, ``k_positions``) replace those defaults
  for the schemes, e.g. for a left-padded batch; they are integers of shape
  ``(len,)`` or ``(batch, len)``, the latter only with 4-D ``q``.  The hooks
  receive int64 tensors of those shapes.  Every position lies strictly within
  ``2**31`` of 0.
* The relative position is ``key - query`` wherever a scheme needs a sign.

Masks
-----
``mask`` and ``bias`` have shape ``(q_len, k_len)`` or as many dimensions as
``q`` (``(batch|1, heads|1, q_len|1, k_len|1)`` for 4-D ``q``); a 3-D mask with
4-D ``q`` is refused, since it could mean ``(batch, q_len, k_len)`` or
``(heads, q_len, k_len)``.  A boolean tensor is a keep-mask (``True`` = attend);
a floating one is added to the scaled scores (``-inf`` removes a key).  Any
other dtype, such as the integer 0/1 ``attention_mask`` of transformers, is
refused: convert it with ``.bool()``.  One helper, :func:`merge_masks`,
combines the caller's mask and bias, the causal mask and a scheme's bias for
every path (SDPA, Shaw, Transformer-XL, DA-Transformer, the weights).

A query that sees no key at all (its whole row masked) attends to nothing: its
weights are all zero and its output is the zero vector, in every scheme, with
finite gradients.  (Softmax over an empty row has no value; zero is what a
padded query should contribute.)
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._checks import (
    as_positions,
    check_float,
    check_floating,
    check_int,
    check_mask,
    check_offset,
    check_position_values,
)

__all__ = [
    "attention",
    "attention_weights",
    "causal_mask",
    "query_key_positions",
    "scaled_dot_product",
    "PositionalScheme",
]


class PositionalScheme:
    """Base class for a positional scheme used by :func:`attention`.

    Subclasses override :meth:`rotate`, :meth:`bias` or, when neither is
    enough, :meth:`attend` (and then :meth:`weights`).  The hooks receive
    ``q`` of shape ``(batch, heads, q_len, d)``, ``k`` of shape
    ``(batch, kv_heads, k_len, d)`` (``kv_heads`` divides ``heads``) and int64
    positions of shape ``(len,)`` or ``(batch, len)``; they must not read
    tensor values on the host (no ``.item()``/``int()``), so that they trace
    under ``torch.compile`` and ``torch.export``.

    A custom :meth:`attend` builds its output from the shared helpers, which
    treat masks, grouped-query heads and empty rows the same way for every
    scheme: :func:`scaled_dot_product` (PyTorch's SDPA), :func:`softmax_weights`
    (explicit scores), :func:`merge_masks` and :func:`repeat_kv`.

    The class attribute ``materializes_bias`` records whether the scheme builds
    an O(q_len * k_len) bias tensor; schemes that do not need one (no
    encoding, RoPE) keep it ``False`` so that :func:`attention` can take
    PyTorch's fused kernels.
    """

    materializes_bias: bool = False

    def rotate(self, q, k, q_positions, k_positions):
        """Return ``(q, k)`` after position-dependent transforms (identity by default)."""
        return q, k

    def bias(self, q, k, q_positions, k_positions, scale):
        """Return an additive score bias, or ``None``.

        The bias is added to the already scaled scores ``scale * q @ k.T``; it
        must broadcast to ``(batch, heads, q_len, k_len)``, e.g.
        ``(heads, q_len, k_len)`` for positions ``(len,)`` and
        ``(batch, heads, q_len, k_len)`` for positions ``(batch, len)``, and be
        finite (masking is the caller's ``mask``).  ``q`` and ``k`` are passed
        after :meth:`rotate`, so content-dependent biases (Shaw) can use them.
        """
        return None

    def score_mod(self, q, k):
        """FlexAttention form of :meth:`bias`: ``f(score, b, h, q_pos, k_pos)``, or ``None``.

        ``None`` (the default) when the scheme's score change is not written as
        one.  The function receives the scaled score, the batch and query-head
        indices and the integer positions of the query and the key (0-d
        tensors), and must return ``score`` plus this scheme's bias, exactly as
        :meth:`bias` would; :mod:`posenc.flex` then fuses it into the attention
        kernel.  ``q`` and ``k`` (4-D, after :meth:`rotate`) give the device and
        dtype.  ALiBi and T5 are expressed by :mod:`posenc.flex` itself.
        """
        return None

    def attend(self, q, k, v, *, mask, causal, q_offset, q_positions, k_positions, scale):
        """Run attention; the default composes :meth:`rotate`, :meth:`bias` and SDPA.

        ``mask`` is the caller's mask and bias merged (``None``, a boolean
        keep-mask or an additive float tensor, 4-D); pass it on to the helpers.
        """
        q, k = self.rotate(q, k, q_positions, k_positions)
        extra = self.bias(q, k, q_positions, k_positions, scale)
        return scaled_dot_product(
            q, k, v, mask=mask, bias=extra, causal=causal, q_offset=q_offset, scale=scale
        )

    def weights(self, q, k, *, mask, causal, q_offset, q_positions, k_positions, scale):
        """The ``(batch, heads, q_len, k_len)`` matrix this scheme applies to the values.

        The default computes the same logits as :meth:`attend` explicitly
        (``scale * q @ k.T`` after :meth:`rotate`, plus :meth:`bias`) and
        normalises them with :func:`softmax_weights`.
        """
        q, k = self.rotate(q, k, q_positions, k_positions)
        extra = self.bias(q, k, q_positions, k_positions, scale)
        logits = dot_scores(q, k, scale)
        w = softmax_weights(logits, mask=mask, bias=extra, causal=causal, q_offset=q_offset)
        return w.to(q.dtype)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    encoding: PositionalScheme | None = None,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    q_positions=None,
    k_positions=None,
    scale: float | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Scaled dot-product attention, optionally with a positional scheme.

    Parameters
    ----------
    q, k, v
        Queries ``(batch, heads, q_len, d)``, keys ``(batch, kv_heads, k_len,
        d)``, values ``(batch, kv_heads, k_len, d_v)``, with ``kv_heads``
        dividing ``heads`` (grouped-query attention).  ``(heads, len, d)``,
        ``(len, d)`` and extra batch dimensions are accepted too (see the module
        docstring).  One floating dtype, one device.
    encoding
        A :class:`PositionalScheme` (RoPE, ALiBi, T5, Shaw, Transformer-XL,
        DA-Transformer), or ``None`` for no positional information at all.
    mask
        Optional boolean keep-mask (``True`` = attend) or floating additive
        mask, of shape ``(q_len, k_len)`` or ``(batch|1, heads|1, q_len|1,
        k_len|1)`` (as many dimensions as ``q``).  For a padded batch, pass the
        keep-mask ``attention_mask.bool()[:, None, None, :]``.  Integer masks
        are refused.
    bias
        Optional floating additive bias, same shapes as ``mask``, added to the
        scaled scores (``-inf`` masks a key out).  A boolean ``bias`` is a
        keep-mask, as for ``mask``.
    causal
        If true, query ``i`` attends to key ``j`` only when ``j <= q_offset + i``.
    q_offset
        Index of the first query among the keys.  Defaults to
        ``k_len - q_len`` (queries are the newest tokens, as with a KV cache).
    q_positions, k_positions
        Integer positions of the queries and keys, ``(len,)`` or ``(batch,
        len)``, for left-padded batches or any other layout; the schemes use
        them, the causal mask does not.  Given ``k_positions`` alone, the
        queries take the positions of the keys they align with,
        ``k_positions[..., q_offset : q_offset + q_len]`` (self-attention and
        KV-cache decoding); given ``q_positions`` alone, keys sit at
        ``0 .. k_len-1``.  Default: keys at ``0 .. k_len-1``, queries at
        ``q_offset .. q_offset+q_len-1``.
    scale
        Multiplier of ``q @ k.T``; defaults to ``1 / sqrt(d)``.
    backend
        ``"eager"``: the scheme's own path (PyTorch's SDPA with a dense bias
        for ALiBi and T5), the reference.  ``"flex"``: compiled FlexAttention
        (:mod:`posenc.flex`), no O(q_len * k_len) bias; raises ``ValueError``
        for a scheme it cannot express exactly and ``RuntimeError`` where it
        cannot compile.  ``"auto"`` (default): FlexAttention for ALiBi, T5 and
        other score_mod schemes when ``q_len * k_len >= 2**20``, compiling is
        available, nothing needs gradients and no tracing or transform is
        active; the eager path otherwise (also if compiling fails).

    Returns
    -------
    Tensor of shape ``(*q.shape[:-1], d_v)`` and the dtype of ``q``.  A query
    whose every key is masked gets the zero vector.

    Examples
    --------
    A left-padded batch of two sequences with RoPE and grouped-query heads::

        keep = attention_mask.bool()                       # (2, seq), False = padding
        pos = (keep.long().cumsum(-1) - 1).clamp(min=0)    # position_ids of transformers
        out = attention(q, k, v, encoding=rope, causal=True,
                        mask=keep[:, None, None, :], k_positions=pos)
    """
    call = _prepare(q, k, v, mask, bias, causal, q_offset, q_positions, k_positions, scale)
    scheme = _scheme(encoding)
    out = None
    if backend != "eager":
        from . import flex

        needs_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v, *getattr(scheme, "parameters", tuple)())
        )
        if flex.choose(backend, scheme, call, needs_grad=needs_grad):
            out = flex.run(scheme, call, causal, explicit=backend == "flex")
    if out is None:
        out = scheme.attend(
            call.q,
            call.k,
            call.v,
            mask=call.mask,
            causal=causal,
            q_offset=call.q_offset,
            q_positions=call.q_positions,
            k_positions=call.k_positions,
            scale=call.scale,
        )
    return out.reshape(*q.shape[:-1], v.shape[-1])


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    encoding: PositionalScheme | None = None,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    q_positions=None,
    k_positions=None,
    scale: float | None = None,
) -> torch.Tensor:
    """The attention matrix ``(*q.shape[:-2], q_len, k_len)`` that :func:`attention` applies.

    Same arguments and conventions as :func:`attention`.  Each scheme computes
    its weights from the same logits and the same masks as its attention (see
    :meth:`PositionalScheme.weights`).  Meant for analysis and plots; it costs
    O(q_len * k_len) memory by construction.  Rows of queries that see no key
    are zero.
    """
    call = _prepare(q, k, None, mask, bias, causal, q_offset, q_positions, k_positions, scale)
    w = _scheme(encoding).weights(
        call.q,
        call.k,
        mask=call.mask,
        causal=causal,
        q_offset=call.q_offset,
        q_positions=call.q_positions,
        k_positions=call.k_positions,
        scale=call.scale,
    )
    return w.reshape(*q.shape[:-2], q.shape[-2], k.shape[-2])


def causal_mask(
    q_len: int, k_len: int, q_offset: int | None = None, *, device=None
) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` mask, ``True`` where query ``i`` may see key ``j``.

    ``j <= q_offset + i``, with ``q_offset`` defaulting to ``k_len - q_len``.
    """
    q_len = check_int("q_len", q_len, minimum=1)
    k_len = check_int("k_len", k_len, minimum=1)
    q_offset = check_offset(q_len, k_len, q_offset, causal=True)
    i = torch.arange(q_len, device=device).unsqueeze(-1)
    j = torch.arange(k_len, device=device)
    return j <= i + q_offset


def query_key_positions(q: torch.Tensor, k: torch.Tensor, q_offset: int):
    """Default positions ``(q_len,)`` and ``(k_len,)`` of queries and keys, on ``q``'s device."""
    q_positions = torch.arange(q.shape[-2], device=q.device) + q_offset
    k_positions = torch.arange(k.shape[-2], device=q.device)
    return q_positions, k_positions


# --- the helpers every path shares ---------------------------------------------------------


def repeat_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Repeat the heads of ``t`` ``(..., kv_heads, len, d)`` to ``num_heads`` (grouped-query).

    Query head ``h`` uses head ``h // (num_heads // kv_heads)``, as SDPA's
    ``enable_gqa``.  A no-op when the counts already agree.
    """
    if t.dim() < 3 or t.shape[-3] == num_heads:
        return t
    return t.repeat_interleave(num_heads // t.shape[-3], dim=-3)


def dot_scores(q: torch.Tensor, k: torch.Tensor, scale: float) -> torch.Tensor:
    """``scale * q @ k.T`` ``(batch, heads, q_len, k_len)`` in float32 at least (float64 stays)."""
    work = torch.promote_types(q.dtype, torch.float32)
    k = repeat_kv(k, q.shape[-3]).to(work)
    return scale * (q.to(work) @ k.transpose(-1, -2))


class Masks(NamedTuple):
    """What :func:`merge_masks` returns.

    ``mask``: ``None``, a boolean keep-mask or an additive float tensor, 4-D
    ``(batch|1, heads|1, q_len, k_len)`` and contiguous, where no row is fully
    masked.  ``is_causal``: let SDPA apply the causal mask itself.  ``seen``:
    ``None`` or a boolean ``(batch|1, heads|1, q_len, 1)``, false for the
    queries that see no key; their rows of ``mask`` are cleared so that the
    softmax stays finite, and the caller zeroes their output.
    """

    mask: torch.Tensor | None
    is_causal: bool
    seen: torch.Tensor | None


def merge_masks(
    mask,
    bias,
    *,
    causal: bool,
    q_offset: int,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device,
    allow_is_causal: bool = False,
) -> Masks:
    """Combine the caller's mask, the causal mask and a scheme's bias into one.

    Parameters
    ----------
    mask
        The caller's mask and bias, merged by :func:`attention` (``None``, a
        boolean keep-mask or an additive float tensor); it may mask whole rows.
    bias
        A scheme's finite additive bias, or ``None``.
    causal, q_offset, q_len, k_len
        The causal mask ``j <= q_offset + i``; it is skipped when every query
        sees every key.
    dtype, device
        Dtype of a floating result (the query's for SDPA, the softmax's
        otherwise) and device of the causal mask.
    allow_is_causal
        Return ``is_causal=True`` instead of a mask when the causal mask is all
        there is and ``q_offset == 0`` (SDPA's top-left alignment).

    Returns
    -------
    :class:`Masks`.  The mask stays boolean when every term is boolean; any
    float term makes it an additive float tensor with ``-inf`` where a boolean
    term is false.
    """
    if causal and q_offset >= k_len - 1:
        causal = False  # the first query already sees every key, so all of them do
    if causal and allow_is_causal and mask is None and bias is None and q_offset == 0:
        return Masks(None, True, None)
    merged = None if mask is None else _cast(mask, dtype)
    if causal:
        merged = _combine(merged, causal_mask(q_len, k_len, q_offset, device=device))
    if bias is not None:
        merged = _combine(merged, bias.to(dtype))
    if merged is None:
        return Masks(None, False, None)
    seen = None
    if mask is not None:  # only the caller's mask can empty a row (legal offsets never do)
        if merged.dtype == torch.bool:
            seen = merged.any(-1, keepdim=True)
            merged = merged | ~seen
        else:
            seen = (merged != float("-inf")).any(-1, keepdim=True)
            merged = merged.masked_fill(~seen, 0.0)
        seen = _as_4d(seen)
    # SDPA takes its fused kernels only with a 2-D or 4-D mask; 4-D contiguous is safe
    return Masks(_as_4d(merged).contiguous(), False, seen)


def scaled_dot_product(
    q, k, v, *, mask=None, bias=None, causal: bool = False, q_offset=None, scale=None
):
    """PyTorch's SDPA with the shared mask handling: the path of every ``rotate``/``bias`` scheme.

    ``q`` ``(batch, heads, q_len, d)``; ``k``, ``v`` with ``kv_heads``
    dividing ``heads`` (SDPA's ``enable_gqa``).  ``mask`` is the caller's
    merged mask, ``bias`` a scheme's additive bias; both go through
    :func:`merge_masks`, which hands SDPA a 4-D contiguous mask in ``q``'s
    dtype (or a boolean one), ``is_causal`` or nothing.  ``q_offset`` defaults
    to ``k_len - q_len`` and ``scale`` to ``1 / sqrt(d)``.  Queries that see no
    key get zeros.  Float64 inputs that need gradients take the explicit math
    (:func:`softmax_weights`) instead, since the fused CPU kernel's backward
    cannot be differentiated again (Hessians, ``gradgradcheck``); in float32 or
    bf16, use ``torch.nn.attention.sdpa_kernel(SDPBackend.MATH)`` for that.
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    q_offset = k_len - q_len if q_offset is None else q_offset
    if q.dtype == torch.float64 and _needs_grad(q, k, v, mask, bias):
        # SDPA's fused CPU kernel has no double backward; float64 autograd is where
        # Hessians and gradgradcheck are taken, so it runs the explicit math instead
        scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
        w = softmax_weights(
            dot_scores(q, k, scale), mask=mask, bias=bias, causal=causal, q_offset=q_offset
        )
        return w @ repeat_kv(v, q.shape[-3])
    m = merge_masks(
        mask,
        bias,
        causal=causal,
        q_offset=q_offset,
        q_len=q_len,
        k_len=k_len,
        dtype=q.dtype,
        device=q.device,
        allow_is_causal=True,
    )
    out = F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=m.mask,
        is_causal=m.is_causal,
        scale=scale,
        enable_gqa=q.dim() >= 3 and k.shape[-3] != q.shape[-3],
    )
    return out if m.seen is None else torch.where(m.seen, out, 0.0)


def softmax_weights(logits, *, mask=None, bias=None, causal: bool = False, q_offset=None):
    """Softmax of explicit ``logits`` ``(batch, heads, q_len, k_len)`` with the shared masks.

    The path of every scheme that computes its scores itself.  ``mask``,
    ``bias``, ``causal`` and ``q_offset`` as in :func:`scaled_dot_product`;
    masks are merged in ``logits``' dtype.  Rows that see no key are zero.
    """
    q_len, k_len = logits.shape[-2], logits.shape[-1]
    q_offset = k_len - q_len if q_offset is None else q_offset
    m = merge_masks(
        mask,
        bias,
        causal=causal,
        q_offset=q_offset,
        q_len=q_len,
        k_len=k_len,
        dtype=logits.dtype,
        device=logits.device,
    )
    if m.mask is not None:
        if m.mask.dtype == torch.bool:
            logits = logits.masked_fill(~m.mask, float("-inf"))
        else:
            logits = logits + m.mask
    w = torch.softmax(logits, dim=-1)
    return w if m.seen is None else torch.where(m.seen, w, 0.0)


def _needs_grad(*tensors) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _cast(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return t if t.dtype == torch.bool else t.to(dtype)


def _combine(a, b):
    """One mask from two: ``&`` of keep-masks, ``+`` of additive ones, ``-inf`` where mixed."""
    if a is None:
        return b
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return a & b
    if a.dtype == torch.bool:
        return torch.where(a, b, float("-inf"))
    if b.dtype == torch.bool:
        return torch.where(b, a, float("-inf"))
    return a + b


def _as_4d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape((1,) * (4 - t.dim()) + tuple(t.shape)) if t.dim() < 4 else t


# --- validation ------------------------------------------------------------------------------


class _NoEncoding(PositionalScheme):
    """No positional information: attention is permutation-equivariant."""


_NO_ENCODING = _NoEncoding()


def _scheme(encoding) -> PositionalScheme:
    if encoding is None:
        return _NO_ENCODING
    if not isinstance(encoding, PositionalScheme):
        raise TypeError(
            f"encoding must be a posenc PositionalScheme or None, got {type(encoding).__name__}"
        )
    return encoding


class _Call(NamedTuple):
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor | None
    mask: torch.Tensor | None
    q_offset: int
    q_positions: torch.Tensor
    k_positions: torch.Tensor
    scale: float


def _prepare(q, k, v, mask, bias, causal, q_offset, q_positions, k_positions, scale) -> _Call:
    """Validate the arguments of :func:`attention` and bring q, k, v to 4-D."""
    q = check_floating("q", q, min_dim=2)
    k = check_floating("k", k, min_dim=2)
    named = [("q", q), ("k", k)]
    if v is not None:
        named.append(("v", check_floating("v", v, min_dim=2)))
    names = ", ".join(n for n, _ in named[:-1]) + " and " + named[-1][0]
    if len({t.dtype for _, t in named}) > 1:
        got = ", ".join(str(t.dtype) for _, t in named)
        raise TypeError(f"{names} must share a dtype, got {got}")
    if len({t.device for _, t in named}) > 1:
        got = ", ".join(str(t.device) for _, t in named)
        raise ValueError(f"{names} must be on one device, got {got}")
    if len({t.dim() for _, t in named}) > 1:
        got = ", ".join(str(tuple(t.shape)) for _, t in named)
        raise ValueError(f"{names} must have the same number of dimensions, got shapes {got}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if v is not None and k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q_len == 0 or k_len == 0:
        raise ValueError(f"q_len and k_len must be positive, got {q_len} and {k_len}")
    _check_heads(q, k, v)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    q_offset = check_offset(q_len, k_len, q_offset, causal=causal)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    else:
        scale = check_float("scale", scale, positive=True)
    caller = None
    for name, t in (("mask", mask), ("bias", bias)):
        if t is not None:
            caller = _combine(caller, _as_4d(check_mask(name, t, q, k_len)))
    q_positions, k_positions = _positions(q, k_len, q_offset, q_positions, k_positions)
    return _Call(
        _to_4d(q), _to_4d(k), None if v is None else _to_4d(v), caller, q_offset,
        q_positions, k_positions, scale,
    )  # fmt: skip


def _check_heads(q, k, v):
    if q.dim() < 3:
        return
    if q.shape[:-3] != k.shape[:-3] or (v is not None and v.shape[:-3] != k.shape[:-3]):
        shapes = [tuple(q.shape), tuple(k.shape)] + ([] if v is None else [tuple(v.shape)])
        raise ValueError(
            "q, k and v must have the same batch dimensions (all but the last three: heads, "
            f"len, d), got shapes {', '.join(map(str, shapes))}"
        )
    heads, kv_heads = q.shape[-3], k.shape[-3]
    if v is not None and v.shape[-3] != kv_heads:
        raise ValueError(
            f"k and v must have the same number of heads, got {kv_heads} and {v.shape[-3]}"
        )
    if heads % kv_heads:
        raise ValueError(
            f"k and v must have a number of heads that divides q's (grouped-query attention), "
            f"got {kv_heads} heads for k and v and {heads} for q"
        )


def _to_4d(t: torch.Tensor) -> torch.Tensor:
    """``(len, d)`` -> ``(1, 1, len, d)``, ``(h, len, d)`` -> ``(1, h, len, d)``, batch merged."""
    if t.dim() <= 4:
        return _as_4d(t)
    return t.reshape(-1, *t.shape[-3:])


def _positions(q, k_len, q_offset, q_positions, k_positions):
    """Integer positions ``(len,)`` or ``(batch, len)`` for the scheme hooks, on q's device."""
    q_len, device = q.shape[-2], q.device
    if q_positions is None and k_positions is None:
        return torch.arange(q_len, device=device) + q_offset, torch.arange(k_len, device=device)
    if q_positions is not None:
        q_positions = _check_positions("q_positions", q_positions, q, q_len, "q_len")
    if k_positions is not None:
        k_positions = _check_positions("k_positions", k_positions, q, k_len, "k_len")
    if k_positions is None:
        k_positions = torch.arange(k_len, device=device)
    if q_positions is None:
        if q_offset < 0 or q_offset + q_len > k_len:
            raise ValueError(
                f"q_positions must be given when the queries are not among the keys "
                f"(q_offset={q_offset}, q_len={q_len}, k_len={k_len}): with k_positions alone, "
                f"query i takes the position of key q_offset + i"
            )
        q_positions = k_positions[..., q_offset : q_offset + q_len]
    if q_positions.dim() != k_positions.dim():  # one per sample: both per sample
        batch = (q_positions if q_positions.dim() == 2 else k_positions).shape[0]
        q_positions = q_positions.expand(batch, q_len) if q_positions.dim() == 1 else q_positions
        k_positions = k_positions.expand(batch, k_len) if k_positions.dim() == 1 else k_positions
    return q_positions, k_positions


def _check_positions(name, value, q, length, length_name):
    t = as_positions(name, value, device=q.device)
    if t.dim() not in (1, 2) or t.shape[-1] != length:
        raise ValueError(
            f"{name} must have shape ({length_name},) = ({length},) or (batch, {length_name}), "
            f"got shape {tuple(t.shape)}"
        )
    if t.dim() == 2:
        if q.dim() != 4:
            raise ValueError(
                f"{name} of shape (batch, {length_name}) needs q, k and v of shape (batch, "
                f"heads, len, d), got q of shape {tuple(q.shape)}"
            )
        if t.shape[0] not in (1, q.shape[0]):
            raise ValueError(
                f"{name} has {t.shape[0]} rows but q has batch size {q.shape[0]}: one row of "
                f"positions per batch item"
            )
    check_position_values(name, t)
    return t
