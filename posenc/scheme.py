"""Scaled dot-product attention with a pluggable positional scheme.

One entry point, :func:`attention`, runs every scheme in this package.  A scheme
is a :class:`PositionalScheme`; it enters attention through one of three hooks:

* ``rotate``: transform queries and keys before the dot product (RoPE);
* ``bias``: add a term to the scaled scores (ALiBi, T5, Shaw's key term,
  Transformer-XL's position terms);
* ``attend``: replace the whole computation, when the scheme changes more than
  the scores (Shaw's value term, DA-Transformer's rescaled ReLU attention).

Which scheme uses which hook, and whether its path builds an O(q_len * k_len)
tensor beside the scores (``materializes_bias``):

=============================  ==========================  ============================
scheme                         hook                        O(n^2) bias materialised
=============================  ==========================  ============================
none (``encoding=None``)       none                        no
``RotaryEmbedding``            ``rotate``                  no
``ALiBi``                      ``bias``                    yes
``T5RelativeBias``             ``bias``                    yes
``ShawRelativeAttention``      ``bias`` and ``attend``     yes (content-dependent)
``TransformerXLScheme``        ``attend`` (shifts q by u,  yes (content-dependent)
                               adds the position terms)
``DAAttention``                ``attend`` (ReLU, rescale,  yes (coefficients, weights)
                               row-sum normalisation)
=============================  ==========================  ============================

Without a bias, the causal mask is not materialised either when SDPA can do
without it: ``is_causal`` covers ``q_offset == 0``, and no mask is needed when
every query sees every key (``q_offset >= k_len - 1``, e.g. one decoding step).

Conventions, shared by every scheme:

* ``q`` has shape ``(..., q_len, d)``, ``k`` has ``(..., k_len, d)`` and ``v``
  has ``(..., k_len, d_v)``; the leading dimensions (batch, heads) broadcast.
* Keys sit at positions ``0 .. k_len-1``.  Queries sit at
  ``q_offset .. q_offset+q_len-1``; the default ``q_offset = k_len - q_len``
  aligns them with the *last* keys, which is what decoding with a KV cache
  needs (one new query at the end of a long cache).
* ``causal=True`` lets query ``i`` see key ``j`` iff ``j <= q_offset + i``.
* The relative position is ``key - query`` wherever a scheme needs a sign.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ._checks import check_float, check_floating, check_int

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
    enough, :meth:`attend` (and then :meth:`weights` if the output is not
    ``weights @ v``).  The class attribute ``materializes_bias`` records
    whether the scheme builds an O(q_len * k_len) bias tensor; schemes that do
    not need one (no encoding, RoPE) must keep it ``False`` so that
    :func:`attention` can take PyTorch's fused kernels.
    """

    materializes_bias: bool = False

    def rotate(self, q, k, q_positions, k_positions):
        """Return ``(q, k)`` after position-dependent transforms (identity by default)."""
        return q, k

    def bias(self, q, k, q_positions, k_positions, scale):
        """Return an additive score bias broadcastable to ``(..., q_len, k_len)``, or ``None``.

        The bias is added to the already scaled scores ``scale * q @ k.T``.
        ``q`` and ``k`` are passed after :meth:`rotate`, so content-dependent
        biases (Shaw, Transformer-XL) can use them.
        """
        return None

    def attend(self, q, k, v, *, bias, causal, q_offset, scale):
        """Run attention; the default composes :meth:`rotate`, :meth:`bias` and SDPA."""
        q_positions, k_positions = query_key_positions(q, k, q_offset)
        q, k = self.rotate(q, k, q_positions, k_positions)
        extra = self.bias(q, k, q_positions, k_positions, scale)
        if extra is not None:
            bias = extra if bias is None else bias + extra
        return scaled_dot_product(q, k, v, bias=bias, causal=causal, q_offset=q_offset, scale=scale)

    def weights(self, q, k, *, bias, causal, q_offset, scale):
        """The ``(..., q_len, k_len)`` matrix this scheme applies to the values.

        The default runs :meth:`attend` on identity values, which is exact
        whenever the output is ``weights @ v``.  A scheme whose output has
        other terms (Shaw's value embeddings) overrides this.
        """
        eye = torch.eye(k.shape[-2], dtype=q.dtype, device=q.device)
        return self.attend(q, k, eye, bias=bias, causal=causal, q_offset=q_offset, scale=scale)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    encoding: PositionalScheme | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """Scaled dot-product attention, optionally with a positional scheme.

    Parameters
    ----------
    q, k, v
        Queries ``(..., q_len, d)``, keys ``(..., k_len, d)``, values
        ``(..., k_len, d_v)``; floating point, on any device.
    encoding
        A :class:`PositionalScheme` (RoPE, ALiBi, T5, Shaw, Transformer-XL,
        DA-Transformer), or ``None`` for no positional information at all.
    bias
        Optional additive bias broadcastable to ``(..., q_len, k_len)``,
        added to the scaled scores.  ``-inf`` entries mask keys out.
    causal
        If true, query ``i`` attends to key ``j`` only when ``j <= q_offset + i``.
    q_offset
        Position of the first query among the keys.  Defaults to
        ``k_len - q_len`` (queries are the newest tokens, as with a KV cache).
    scale
        Multiplier of ``q @ k.T``; defaults to ``1 / sqrt(d)``.

    Returns
    -------
    Tensor of shape ``(..., q_len, d_v)`` and the dtype of ``q``.
    """
    q, k, v, q_offset, scale = _validate(q, k, v, bias, causal, q_offset, scale)
    return _scheme(encoding).attend(
        q, k, v, bias=bias, causal=causal, q_offset=q_offset, scale=scale
    )


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    encoding: PositionalScheme | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The attention matrix ``(..., q_len, k_len)`` that :func:`attention` applies to ``v``.

    Same arguments and conventions as :func:`attention`.  Each scheme computes
    its weights on the same code path as its attention (see
    :meth:`PositionalScheme.weights`).  Meant for analysis and plots; it costs
    O(q_len * k_len) memory by construction.
    """
    v = k[..., :1]  # stands in for the values during validation only
    q, k, _, q_offset, scale = _validate(q, k, v, bias, causal, q_offset, scale)
    return _scheme(encoding).weights(q, k, bias=bias, causal=causal, q_offset=q_offset, scale=scale)


def causal_mask(
    q_len: int, k_len: int, q_offset: int | None = None, *, device=None
) -> torch.Tensor:
    """Boolean ``(q_len, k_len)`` mask, ``True`` where query ``i`` may see key ``j``.

    ``j <= q_offset + i``, with ``q_offset`` defaulting to ``k_len - q_len``.
    """
    q_len = check_int("q_len", q_len, minimum=1)
    k_len = check_int("k_len", k_len, minimum=1)
    q_offset = _check_offset(q_len, k_len, q_offset, causal=True)
    i = torch.arange(q_len, device=device).unsqueeze(-1)
    j = torch.arange(k_len, device=device)
    return j <= i + q_offset


def query_key_positions(q: torch.Tensor, k: torch.Tensor, q_offset: int):
    """Integer positions ``(q_len,)`` and ``(k_len,)`` of queries and keys, on ``q``'s device."""
    q_positions = torch.arange(q.shape[-2], device=q.device) + q_offset
    k_positions = torch.arange(k.shape[-2], device=q.device)
    return q_positions, k_positions


def scaled_dot_product(q, k, v, *, bias, causal, q_offset, scale):
    """SDPA core shared by every scheme: masks are built only when they are needed.

    * causal with ``q_offset == 0``: SDPA's own ``is_causal`` (top-left aligned,
      no mask tensor);
    * causal where every query sees every key (e.g. one decoding step): no mask;
    * otherwise a boolean ``(q_len, k_len)`` mask, folded into ``bias`` if any.
    """
    q_len, k_len = q.shape[-2], k.shape[-2]
    is_causal = False
    if causal and q_offset >= k_len - 1:
        causal = False  # the first query already sees every key, so all of them do
    if causal:
        if bias is None and q_offset == 0:
            is_causal = True
        else:
            keep = causal_mask(q_len, k_len, q_offset, device=q.device)
            if bias is None:
                bias = keep
            elif bias.dtype == torch.bool:  # a boolean bias is a keep-mask: combine, not fill
                bias = bias & keep
            else:
                bias = bias.masked_fill(~keep, float("-inf"))
    if bias is not None and bias.dtype != torch.bool and bias.dtype != q.dtype:
        bias = bias.to(q.dtype)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=bias, is_causal=is_causal, scale=scale)


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


def _check_offset(q_len: int, k_len: int, q_offset, *, causal: bool) -> int:
    if q_offset is None:
        q_offset = k_len - q_len
        if causal and q_offset < 0:
            raise ValueError(
                f"a causal mask needs q_len <= k_len when q_offset is not given "
                f"(queries align with the last keys), got q_len={q_len}, k_len={k_len}"
            )
        return q_offset
    q_offset = check_int("q_offset", q_offset)
    if causal and q_offset < 0:
        raise ValueError(f"q_offset must be >= 0 with causal=True, got {q_offset}")
    return q_offset


def _validate(q, k, v, bias, causal, q_offset, scale):
    q = check_floating("q", q, min_dim=2)
    k = check_floating("k", k, min_dim=2)
    v = check_floating("v", v, min_dim=2)
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(
            f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must share their last dimension, got {q.shape[-1]} and {k.shape[-1]}"
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same length, got {k.shape[-2]} and {v.shape[-2]}")
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    q_len, k_len = q.shape[-2], k.shape[-2]
    if q_len == 0 or k_len == 0:
        raise ValueError(f"q_len and k_len must be positive, got {q_len} and {k_len}")
    if bias is not None:
        bias = check_tensor_broadcast("bias", bias, (q_len, k_len))
    q_offset = _check_offset(q_len, k_len, q_offset, causal=causal)
    scale = (
        1.0 / math.sqrt(q.shape[-1])
        if scale is None
        else check_float("scale", scale, positive=True)
    )
    return q, k, v, q_offset, scale


def check_tensor_broadcast(name: str, t, trailing: tuple[int, int]) -> torch.Tensor:
    """Reject a bias whose last two dimensions cannot broadcast to ``trailing``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    shape = tuple(t.shape[-2:])
    if t.dim() < 2 or any(s not in (1, want) for s, want in zip(shape, trailing, strict=True)):
        raise ValueError(
            f"{name} must broadcast to (..., q_len, k_len) = (..., {trailing[0]}, {trailing[1]}), "
            f"got shape {tuple(t.shape)}"
        )
    return t
