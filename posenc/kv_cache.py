"""A key/value cache for decoding with any scheme: keys transformed once, positions kept.

Decoding one token at a time, a model attends from the new queries to every
key so far.  :class:`KVCache` holds those keys and values and their positions:

* :meth:`KVCache.update` transforms the new queries and keys once, through the
  scheme's own ``rotate`` hook (RoPE rotates, xPos rotates and scales, bias
  schemes leave them alone), and appends keys, values and positions: O(new
  tokens) work per step, whatever the cache length, as transformers'
  ``DynamicCache`` and torchtune's ``KVCache`` do for RoPE;
* :meth:`KVCache.attention` attends from those queries to every cached key
  with the scheme's ``score_mod``/``bias``/``attend`` at the cached positions,
  and gives the rows of the full causal pass (``tests/test_conformance.py``
  checks this for every registered scheme).

A scheme whose term depends on more than the positions (FoX's forget gates,
:class:`posenc.ForgettingAttention`) keeps a state per cached key through two
methods the cache calls when the scheme has them: ``cache_state(state,
positions, length)`` in :meth:`KVCache.update` returns the state of every cached
key, ``(batch, heads, length)``, after the new tokens (``None``: the scheme needs
none), and ``cached_scheme(state)`` gives the scheme :meth:`KVCache.attention`
runs, which reads that state by cache index (so it is called with the default
positions, the cache indices).

RoPE's scores agree with a full pass since ``<R_m q, R_n k>`` depends only on
``n - m``.  For a length-dependent scaling (dynamic NTK) the two differ past the
original length: see :class:`posenc.RotaryEmbedding`.  With RoPE or no scheme,
``posenc.attention(q_rot, keys, values, causal=True)`` on what :meth:`update`
returns is the same as :meth:`KVCache.attention`; with a bias scheme it is not
(the scheme needs the cached positions), so use :meth:`KVCache.attention`.
"""

from __future__ import annotations

import torch

from ._checks import as_positions, check_floating, check_int, warn_caller
from ._types import Positions
from .attend import run
from .context import CallContext, prepare
from .scheme import PositionalScheme, as_scheme

__all__ = ["KVCache"]


class KVCache:
    """Keys (transformed once, at their positions), values and positions of the tokens so far.

    Shapes: ``batch`` items, ``heads`` query heads, ``kv_heads`` key/value
    heads (``kv_heads`` divides ``heads``: grouped-query attention, 1 for
    multi-query), head size ``d`` and value size ``d_v``.  ``n`` is the number
    of new tokens in one :meth:`update` and ``length`` the number cached.

    Parameters
    ----------
    encoding
        Any :class:`posenc.PositionalScheme` (its ``rotate`` hook transforms new
        queries and keys; :meth:`attention` applies the rest of it), or ``None``
        for no positional information.  Passed as the first argument, as
        ``KVCache(rope)`` always was.
    capacity
        Initial number of token slots.  Storage grows by doubling when an
        update does not fit, so appending costs amortised O(1) copies per token.
        When the new keys or values need gradients, tokens are appended out of
        place instead (O(length) per step), so that backpropagating through
        every step of a decode works.
    rope
        Deprecated alias of ``encoding`` (warns; removed in 0.2.0).

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q = torch.randn(1, 4, 7, 8, generator=g, dtype=torch.float64)
    >>> k, v = torch.randn(2, 1, 2, 7, 8, generator=g, dtype=torch.float64)
    >>> alibi = posenc.ALiBi(4)              # or RotaryEmbedding, XPos, T5RelativeBias, ...
    >>> cache = posenc.KVCache(alibi)
    >>> q_new, keys, values = cache.update(q[:, :, :5], k[:, :, :5], v[:, :, :5])  # the prompt
    >>> prompt = cache.attention(q_new)      # (batch, heads, 5, d_v), causal
    >>> for t in (5, 6):                     # then one token at a time
    ...     q_new, keys, values = cache.update(q[:, :, t:t + 1], k[:, :, t:t + 1], v[:, :, t:t + 1])
    ...     step = cache.attention(q_new)
    >>> cache.length, keys.shape, step.shape
    (7, torch.Size([1, 2, 7, 8]), torch.Size([1, 4, 1, 8]))

    The rows of the full causal pass:

    >>> full = posenc.attention(q, k, v, encoding=alibi, causal=True)
    >>> torch.allclose(step, full[:, :, 6:]) and torch.allclose(prompt, full[:, :, :5])
    True
    """

    def __init__(
        self,
        encoding: PositionalScheme | None = None,
        *,
        capacity: int = 256,
        rope: PositionalScheme | None = None,
    ):
        if rope is not None:
            warn_caller(
                "KVCache(rope=...) is deprecated and will be removed in posenc 0.2.0: "
                "use KVCache(encoding=...), or pass the scheme first: KVCache(scheme)",
                DeprecationWarning,
            )
            if encoding is not None:
                raise ValueError("pass the scheme once: encoding or its alias rope, not both")
            encoding = rope
        if encoding is not None and not isinstance(encoding, PositionalScheme):
            raise TypeError(
                f"encoding must be a posenc.PositionalScheme or None, got {type(encoding).__name__}"
            )
        self.encoding = encoding
        self._initial = check_int("capacity", capacity, minimum=1)
        self.reset()

    @property
    def rope(self) -> PositionalScheme | None:
        """Deprecated alias of ``encoding`` (warns; removed in 0.2.0)."""
        warn_caller(
            "KVCache.rope is deprecated and will be removed in posenc 0.2.0: use KVCache.encoding",
            DeprecationWarning,
        )
        return self.encoding

    def reset(self) -> None:
        """Forget every cached token (the next update may have new shapes)."""
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        self._pos: torch.Tensor | None = None
        self._length = 0
        self._new: torch.Tensor | None = (
            None  # positions of the latest update's tokens, (n,) or (batch, n)
        )
        self._default = True  # every update so far had positions length .. length+n-1
        self._state: torch.Tensor | None = None  # a stateful scheme's per-key state

    @property
    def length(self) -> int:
        """Number of cached tokens."""
        return self._length

    @property
    def capacity(self) -> int:
        """Number of token slots currently allocated."""
        return 0 if self._k is None else self._k.shape[-2]

    @property
    def keys(self) -> torch.Tensor | None:
        """Cached keys ``(batch, kv_heads, length, d)``, rotated; ``None`` before any update."""
        return None if self._k is None else self._k[:, :, : self._length]

    @property
    def values(self) -> torch.Tensor | None:
        """Cached values ``(batch, kv_heads, length, d_v)``; ``None`` before any update."""
        return None if self._v is None else self._v[:, :, : self._length]

    @property
    def positions(self) -> torch.Tensor | None:
        """Positions of the cached keys, int64 ``(batch, length)``; ``None`` before any update."""
        return None if self._pos is None else self._pos[:, : self._length]

    def update(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        positions: Positions | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Transform the new queries and keys at ``positions``, append keys, values, positions.

        Parameters
        ----------
        q
            New queries ``(batch, heads, n, d)``.
        k
            New keys ``(batch, kv_heads, n, d)``, as projected (not rotated).
        v
            New values ``(batch, kv_heads, n, d_v)``.
        positions
            Integer positions of the new tokens: ``(n,)`` shared by the batch
            or ``(batch, n)`` per item (a left-padded batch, where each item's
            positions count its own tokens).  Default ``length .. length+n-1``.

        Returns
        -------
        tuple of Tensor
            ``(q_rot, keys, values)``: the transformed queries ``(batch, heads,
            n, d)`` (the scheme's ``rotate``) and every cached key and value,
            ``(batch, kv_heads, length, d)`` and ``(batch, kv_heads, length,
            d_v)`` with ``length`` including the new tokens (the last ``n``).
            ``keys`` and ``values`` are views of the cache's storage; later
            updates never change what they show.  Attend with
            :meth:`attention` ``(q_rot)``, adding a mask for padded keys where
            there are any.
        """
        q, k, v = self._check(q, k, v)
        batch, n = k.shape[0], k.shape[-2]
        if positions is None:
            pos = torch.arange(self._length, self._length + n, device=k.device)
        else:
            self._default = False
            pos = as_positions("positions", positions, device=k.device)
            if pos.shape not in ((n,), (1, n), (batch, n)):
                raise ValueError(
                    f"positions must have shape (n,) = ({n},) or (batch, n) = ({batch}, {n}) "
                    f"for n new tokens, got {tuple(pos.shape)}"
                )
        if self.encoding is not None:
            ctx = CallContext.of(q, k, q_positions=pos, k_positions=pos, q_offset=0)
            q, k = self.encoding.rotate(q, k, ctx)
            extend = getattr(self.encoding, "cache_state", None)
            if extend is not None:  # a scheme with a state per key (FoX's c)
                self._state = extend(self._state, pos, self._length)
        self._new = pos
        start, end = self._length, self._length + n
        tracked = [t for t in (k, v, self._k, self._v) if t is not None]
        if torch.is_grad_enabled() and any(t.requires_grad for t in tracked):
            # autograd: append out of place, so that the keys and values returned by
            # earlier steps (saved for their backward) are never overwritten
            pos = pos.expand(batch, n)
            if self._k is not None:
                keys, values = self._views()
                k = torch.cat((keys, k), dim=-2)
                v = torch.cat((values, v), dim=-2)
                assert self._pos is not None
                pos = torch.cat((self._pos[:, : self._length], pos), dim=-1)
            self._k, self._v, self._pos, self._length = k, v, pos, end
            return (q, *self._views())
        self._reserve(k, v, end)
        assert self._k is not None and self._v is not None and self._pos is not None
        self._k[:, :, start:end] = k
        self._v[:, :, start:end] = v
        self._pos[:, start:end] = pos
        self._length = end
        return (q, *self._views())

    def attention(
        self,
        q: torch.Tensor,
        *,
        mask: torch.Tensor | None = None,
        causal: bool = True,
        scale: float | None = None,
        backend: str = "auto",
    ) -> torch.Tensor:
        """Attention from the latest update's queries to every cached key, with the scheme.

        Parameters
        ----------
        q
            The transformed queries :meth:`update` returned, ``(batch, heads,
            n, d)``.
        mask
            Optional keep-mask or additive mask over the cached keys, ``(batch|1,
            heads|1, n|1, length)`` (e.g. ``keep[:, None, None, :]`` for padded
            keys), as in :func:`posenc.attention`.
        causal
            Query ``i`` of the update sees the keys up to its own token
            (``j <= length - n + i``); ``False`` lets it see every cached key.
        scale, backend
            As in :func:`posenc.attention`.

        Returns
        -------
        ``(batch, heads, n, d_v)``: the rows of the full pass for the new tokens.
        The scheme's ``score_mod``/``bias``/``attend`` see the cached positions.
        """
        if self._new is None:
            raise ValueError("call update() before attention(): the cache is empty")
        n = self._new.shape[-1]
        q = check_floating("q", q)
        if q.dim() != 4 or q.shape[-2] != n:
            raise ValueError(
                f"q must be the (batch, heads, n, d) queries of the latest update (n = {n}), "
                f"got shape {tuple(q.shape)}"
            )
        scheme = as_scheme(self.encoding)
        if self._state is not None:  # its state is read by cache index: default positions
            cached = getattr(scheme, "cached_scheme", None)
            assert cached is not None  # a scheme with cache_state has cached_scheme
            scheme = cached(self._state)
            k_pos, q_pos = None, None
        elif self._default:  # shared positions 0 .. length-1: no per-sample lookups
            k_pos, q_pos = None, None
        else:
            k_pos, q_pos = self.positions, self._new.expand(q.shape[0], n)
        keys, values = self._views()
        q4, k4, v4, ctx = prepare(
            q, keys, values, mask=mask, bias=None, causal=causal, q_offset=None,
            q_positions=q_pos, k_positions=k_pos, scale=scale,
        )  # fmt: skip
        assert v4 is not None  # prepare returns v as 4-D when it is given
        return run(scheme, q4, k4, v4, ctx, backend=backend, rotated=True)

    # ------------------------------------------------------------------ internals

    def _views(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The cached keys and values (after an update)."""
        assert self._k is not None and self._v is not None
        return self._k[:, :, : self._length], self._v[:, :, : self._length]

    def _check(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        q = check_floating("q", q)
        k = check_floating("k", k)
        v = check_floating("v", v)
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.dim() != 4:
                raise ValueError(
                    f"{name} must be 4-D (batch, heads, n, features), got shape {tuple(t.shape)}"
                )
        if not (q.dtype == k.dtype == v.dtype):
            raise TypeError(f"q, k and v must share a dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
        if not (q.device == k.device == v.device):
            raise ValueError(
                f"q, k and v must be on one device, got {q.device}, {k.device}, {v.device}"
            )
        if k.shape[:3] != v.shape[:3] or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
            raise ValueError(
                f"q (batch, heads, n, d), k (batch, kv_heads, n, d) and v (batch, kv_heads, "
                f"n, d_v) must agree in batch and n (and k, v in kv_heads), got "
                f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if q.shape[-1] != k.shape[-1]:
            raise ValueError(f"q and k must share d, got {q.shape[-1]} and {k.shape[-1]}")
        if k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise ValueError(
                f"kv_heads (k.shape[1] = {k.shape[1]}) must divide heads "
                f"(q.shape[1] = {q.shape[1]})"
            )
        if k.shape[2] == 0:
            raise ValueError("k must hold at least one new token (n >= 1)")
        if self._k is not None and self._v is not None:
            want = (self._k.shape[:2], self._k.shape[-1], self._v.shape[-1])
            got = (k.shape[:2], k.shape[-1], v.shape[-1])
            if got != want or k.dtype != self._k.dtype or k.device != self._k.device:
                raise ValueError(
                    f"k and v must match the cached (batch, kv_heads), d, d_v, dtype and device "
                    f"{want}, {self._k.dtype}, {self._k.device}; got {got}, {k.dtype}, "
                    f"{k.device} (call reset() to start a new sequence)"
                )
        return q, k, v

    def _reserve(self, k: torch.Tensor, v: torch.Tensor, needed: int) -> None:
        """Make room for ``needed`` tokens, doubling the storage when it is full."""
        if needed <= self.capacity:
            return
        size = max(needed, 2 * self.capacity, self._initial)
        batch, heads, _, d = k.shape
        new_k = k.new_empty(batch, heads, size, d)
        new_v = v.new_empty(batch, heads, size, v.shape[-1])
        new_pos = torch.zeros(batch, size, dtype=torch.int64, device=k.device)
        if self._k is not None and self._v is not None and self._pos is not None:
            n = self._length
            new_k[:, :, :n] = self._k[:, :, :n]
            new_v[:, :, :n] = self._v[:, :, :n]
            new_pos[:, :n] = self._pos[:, :n]
        self._k, self._v, self._pos = new_k, new_v, new_pos
