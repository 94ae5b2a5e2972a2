"""The one entry point, :func:`posenc.attention`, and the weights of the same path.

Shapes and conventions, shared by every scheme
----------------------------------------------
* ``q`` is ``(batch, heads, q_len, d)``, ``k`` is ``(batch, kv_heads, k_len, d)``
  and ``v`` is ``(batch, kv_heads, k_len, d_v)``.  ``kv_heads`` divides
  ``heads`` (grouped-query attention; 1 is multi-query attention): query head
  ``h`` uses key/value head ``h // (heads // kv_heads)``, as with
  ``repeat_interleave``.  Fewer dimensions are accepted, ``(heads, len, d)`` and
  ``(len, d)``, and so are several batch dimensions; q, k and v must have the
  same number of dimensions and the same batch dimensions.  Schemes always
  receive 4-D tensors and a :class:`~posenc.CallContext`.
* Keys sit at positions ``0 .. k_len-1``.  Queries sit at
  ``q_offset .. q_offset+q_len-1``; the default ``q_offset = k_len - q_len``
  aligns them with the *last* keys, which is what decoding with a KV cache
  needs (one new query at the end of a long cache).
* ``causal=True`` lets query ``i`` see key ``j`` iff ``j <= q_offset + i``: by
  index, whatever the positions.
* Explicit positions (``q_positions``, ``k_positions``) replace those defaults
  for the schemes, e.g. for a left-padded batch; they are integers of shape
  ``(len,)`` or ``(batch, len)``, the latter only with 4-D ``q``.  Every
  position lies strictly within ``2**31`` of 0.
* The relative position is ``key - query`` wherever a scheme needs a sign, except
  in Transformer-XL and FIRE, which follow their papers' ``query - key``.

Masks
-----
``mask`` and ``bias`` have shape ``(q_len, k_len)`` or as many dimensions as
``q`` (``(batch|1, heads|1, q_len|1, k_len|1)`` for 4-D ``q``); a 3-D mask with
4-D ``q`` is refused, since it could mean ``(batch, q_len, k_len)`` or
``(heads, q_len, k_len)``.  A boolean tensor is a keep-mask (``True`` = attend);
a floating one is added to the scaled scores (``-inf`` removes a key).  Any
other dtype, such as the integer 0/1 ``attention_mask`` of transformers, is
refused: convert it with ``.bool()``.  :func:`posenc.merge_masks` combines the
caller's mask and bias, the causal mask and a scheme's bias for every path.

A query that sees no key at all (its whole row masked) attends to nothing: its
weights are all zero and its output is the zero vector, in every scheme, with
finite gradients.  (Softmax over an empty row has no value; zero is what a
padded query should contribute.)

Without any mask or bias, the causal mask is not materialised when SDPA can do
without it: ``is_causal`` covers ``q_offset == 0``, and no mask is needed when
every query sees every key (``q_offset >= k_len - 1``, e.g. one decoding step).
Which schemes build an O(n^2) tensor and which take the fused FlexAttention
path is registry metadata: see :func:`posenc.scheme_table`.
"""

from __future__ import annotations

import torch

from . import flex
from . import scheme as _scheme
from ._types import Positions
from .context import CallContext, prepare
from .scheme import PositionalScheme, as_scheme

__all__ = ["attention", "attention_weights"]


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
    q_positions: Positions | None = None,
    k_positions: Positions | None = None,
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
        A :class:`~posenc.PositionalScheme` (any entry of :data:`posenc.SCHEMES`
        that acts on attention, or your own subclass), or ``None`` for no
        positional information at all.
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
        ``"eager"``: the scheme's own path (its ``attend``: PyTorch's SDPA with
        a dense bias for ALiBi and T5), the reference.  ``"flex"``: compiled
        FlexAttention with the scheme's ``score_mod`` (:mod:`posenc.flex`), no
        O(q_len * k_len) bias, with dynamic sequence lengths (a new length
        costs no compile); raises ``ValueError`` for a scheme it cannot
        express exactly and ``RuntimeError``, quoting that scheme's failure,
        where it cannot compile.  It never runs FlexAttention uncompiled.
        ``"auto"`` (default): FlexAttention for schemes with a ``score_mod``
        when ``q_len * k_len >= 2**20``, compiling is available, nothing needs
        gradients and no tracing or transform is active; the eager path
        otherwise, and, with a one-time warning saying why, for a scheme and
        signature whose compile failed.

    Returns
    -------
    Tensor of shape ``(*q.shape[:-1], d_v)`` and the dtype of ``q``.  A query
    whose every key is masked gets the zero vector.

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(2, 8, 6, 16, generator=g)          # (batch, heads, q_len, d)
    >>> k, v = torch.randn(2, 2, 2, 6, 16, generator=g)    # 2 key/value heads (GQA)
    >>> posenc.attention(q, k, v, encoding=posenc.RotaryEmbedding(16), causal=True).shape
    torch.Size([2, 8, 6, 16])

    Without a scheme it is PyTorch's SDPA (each key head serving a group of four):

    >>> sdpa = torch.nn.functional.scaled_dot_product_attention(
    ...     q, k.repeat_interleave(4, dim=1), v.repeat_interleave(4, dim=1), is_causal=True)
    >>> torch.allclose(posenc.attention(q, k, v, causal=True), sdpa, atol=1e-6)
    True

    A left-padded batch: positions count each sequence's own tokens, and the
    padding is masked out, so the first sequence gets what it would get alone.

    >>> keep = torch.tensor([[False, False, True, True, True, True],
    ...                      [True, True, True, True, True, True]])
    >>> pos = (keep.long().cumsum(-1) - 1).clamp(min=0)  # transformers' position_ids
    >>> pos.tolist()
    [[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]]
    >>> alibi = posenc.ALiBi(8)
    >>> out = posenc.attention(q, k, v, encoding=alibi, causal=True,
    ...                        mask=keep[:, None, None, :], k_positions=pos)
    >>> alone = posenc.attention(q[:1, :, 2:], k[:1, :, 2:], v[:1, :, 2:],
    ...                          encoding=alibi, causal=True)
    >>> torch.allclose(out[:1, :, 2:], alone, atol=1e-6)
    True
    """
    q4, k4, v4, ctx = prepare(
        q, k, v, mask=mask, bias=bias, causal=causal, q_offset=q_offset,
        q_positions=q_positions, k_positions=k_positions, scale=scale,
    )  # fmt: skip
    assert v4 is not None  # prepare returns v as 4-D when it is given
    scheme = as_scheme(encoding)
    out = run(scheme, q4, k4, v4, ctx, backend=backend)
    return out.reshape(*q.shape[:-1], v.shape[-1])


def run(
    scheme: PositionalScheme, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    ctx: CallContext, *, backend: str = "auto",
    rotated: bool = False,
) -> torch.Tensor:  # fmt: skip
    """Attention for validated 4-D tensors and their context: ``rotate``, then flex or ``attend``.

    ``rotated=True`` skips ``rotate``: ``q`` and ``k`` are already
    transformed (a :class:`posenc.KVCache` stores its keys that way).
    """
    if not rotated:
        q, k = scheme.rotate(q, k, ctx)
    if backend != "eager":
        needs_grad = torch.is_grad_enabled() and any(
            t.requires_grad for t in (q, k, v, *scheme.parameters())
        )
        if flex.choose(backend, scheme, q, k, ctx, needs_grad=needs_grad):
            out: torch.Tensor | None = flex.run(scheme, q, k, v, ctx, explicit=backend == "flex")
            if out is not None:
                return out
    return scheme.attend(q, k, v, ctx)


def attention_weights(
    q: torch.Tensor,
    k: torch.Tensor,
    *,
    encoding: PositionalScheme | None = None,
    mask: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    causal: bool = False,
    q_offset: int | None = None,
    q_positions: Positions | None = None,
    k_positions: Positions | None = None,
    scale: float | None = None,
) -> torch.Tensor:
    """The attention matrix ``(*q.shape[:-2], q_len, k_len)`` that :func:`attention` applies.

    Same arguments and conventions as :func:`attention`.  Each scheme computes
    its weights from the same logits and the same masks as its attention (see
    :meth:`PositionalScheme.weights`).  Meant for analysis and plots; it costs
    O(q_len * k_len) memory by construction.  Rows of queries that see no key
    are zero.

    Parameters
    ----------
    q, k
        Queries and keys, as in :func:`attention` (no values are needed).
    encoding, mask, bias, causal, q_offset, q_positions, k_positions, scale
        As in :func:`attention`.

    Returns
    -------
    Tensor
        ``(*q.shape[:-2], q_len, k_len)`` in the dtype of ``q``: each row sums
        to 1, or is zero for a query that sees no key.

    Examples
    --------
    >>> import torch, posenc
    >>> x = torch.zeros(1, 1, 3, 4, dtype=torch.float64)   # equal scores everywhere
    >>> posenc.attention_weights(x, x, causal=True)[0, 0].tolist()
    [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.3333333333333333, 0.3333333333333333, 0.3333333333333333]]
    >>> alibi = posenc.attention_weights(x, x, encoding=posenc.ALiBi(1), causal=True)
    >>> alibi[0, 0].round(decimals=4).tolist()              # nearer keys weigh more
    [[1.0, 0.0, 0.0], [0.499, 0.501, 0.0], [0.332, 0.3333, 0.3346]]
    """
    q4, k4, _, ctx = prepare(
        q, k, None, mask=mask, bias=bias, causal=causal, q_offset=q_offset,
        q_positions=q_positions, k_positions=k_positions, scale=scale,
    )  # fmt: skip
    scheme = as_scheme(encoding)
    q4, k4 = scheme.rotate(q4, k4, ctx)
    w = scheme.weights(q4, k4, ctx)
    return w.reshape(*q.shape[:-2], q.shape[-2], k.shape[-2])


# the deprecated posenc.scheme.attention and .attention_weights (until 0.2.0): served from
# here, so that posenc.scheme need not import this module, which imports it
_scheme._SERVED.update(attention=attention, attention_weights=attention_weights)
