"""The contract every positional scheme follows: :class:`PositionalScheme`.

A scheme is an ``nn.Module`` (its tensors are parameters or buffers) that
enters attention through hooks, each receiving the 4-D tensors and one
:class:`~posenc.CallContext` (positions, offset, scale, masks, sizes):

=================================  ==========================================================
hook                               what it does
=================================  ==========================================================
``rotate(q, k, ctx) -> (q, k)``    transform queries and keys, each token by its own
                                   position only (RoPE, xPos); a KV cache applies it once per
                                   token and stores the keys transformed
``score_mod(ctx) -> f | None``     the scheme's change to the scaled scores as a
                                   FlexAttention ``f(score, b, h, q_pos, k_pos)``, returning
                                   ``score + term``: the fused path (ALiBi, T5)
``bias(q, k, ctx) -> Tensor``      the same term as a dense additive bias, for the eager
                                   path; by default evaluated from ``score_mod``, so a scheme
                                   that writes ``score_mod`` gets both paths
``attend(q, k, v, ctx) -> out``    replace the whole computation when the scheme changes
                                   more than the scores (Shaw's value term, Transformer-XL,
                                   DA-Transformer); ``weights(q, k, ctx)`` then returns its
                                   attention matrix
=================================  ==========================================================

:func:`posenc.attention` validates the call, builds the context, runs
``rotate`` and then either FlexAttention with ``score_mod`` (``backend="flex"``
or ``"auto"``) or the scheme's ``attend`` (the eager path, whose default adds
``bias`` and calls PyTorch's SDPA).  Calling a scheme,
``scheme(q, k, v, **kwargs)``, is ``posenc.attention(q, k, v, encoding=scheme,
backend="eager", **kwargs)``: the scheme's own path, for every class.

A subclass inherits its parent's paths: ``class Steeper(ALiBi)`` with other
slopes keeps the fused path, since ALiBi's ``score_mod`` and ``bias`` both
read ``self.slopes``.  A subclass that overrides ``bias`` but not
``score_mod`` loses the fused path (FlexAttention would compute its parent's
term): ``backend="flex"`` refuses it and ``"auto"`` takes the eager path.

Shapes and conventions, shared by every scheme
----------------------------------------------
* Hooks receive ``q`` ``(batch, heads, q_len, d)`` and ``k`` ``(batch,
  kv_heads, k_len, d)``, ``kv_heads`` dividing ``heads`` (grouped-query
  attention: query head ``h`` uses key head ``h // (heads // kv_heads)``), and
  ``v`` ``(batch, kv_heads, k_len, d_v)``.
* Positions (``ctx.q_positions``, ``ctx.k_positions``) are int64, ``(len,)``
  or ``(batch, len)``.  The relative position is ``key - query``, except in
  Transformer-XL and FIRE, which follow their papers' ``query - key``.
* Hooks must not read tensor values on the host (no ``.item()``, ``int()``),
  so that they trace under ``torch.compile`` and ``torch.export``, run under
  ``vmap`` and on meta tensors.
* Masks are applied by the shared helpers, never by a scheme: pass
  ``ctx.mask``, ``ctx.causal`` and ``ctx.q_offset`` on to
  :func:`posenc.scaled_dot_product` or :func:`posenc.softmax_weights`.

Registry metadata (read by :data:`posenc.SCHEMES`, the lab, the conformance
tests and the book's tables) is declared as class attributes, see
:class:`PositionalScheme`.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from . import masks as _masks
from . import sdpa as _sdpa
from ._checks import check_build_args, warn_caller
from ._types import Positions, ScoreMod

if TYPE_CHECKING:
    from typing_extensions import Self
from .context import CallContext, prepare

__all__ = ["NoPE", "PositionalScheme"]


class PositionalScheme(nn.Module):
    """Base class of every positional scheme used by :func:`posenc.attention`.

    Override the hooks the scheme needs (see the module docstring): ``rotate``,
    ``score_mod`` (and ``bias`` where the dense form should be computed
    differently), or ``attend`` and ``weights``.  Every hook takes the 4-D
    tensors and a :class:`~posenc.CallContext` ``ctx``.

    Calling a scheme, ``scheme(q, k, v, **kwargs)``, runs attention on the
    scheme's own (eager) path: ``posenc.attention(q, k, v, encoding=scheme,
    backend="eager", **kwargs)``, same arguments, shapes and result.

    Registry metadata, class attributes a subclass sets when they differ:

    * ``acts_on``: ``"attention"`` (through the hooks) or ``"input"`` (a table
      added to the embeddings; not a PositionalScheme);
    * ``quadratic_memory``: the eager path builds an O(q_len * k_len) tensor
      beside the scores (a dense bias, explicit scores);
    * ``reference``: the bibliography key of the paper (``references.bib``);
    * ``shared_across_layers``: a model holds one instance for all layers (T5)
      rather than one per layer;
    * ``weights_sum_to_one``, ``output_is_weights_times_v``: what the
      conformance tests may assume about :meth:`weights` (instance-level when
      an option changes them);
    * ``float64_buffers``: buffer names that ``module.to(dtype)`` leaves in
      float64 (moved between devices only), so casting a model never rounds
      them (ALiBi's slopes).
    * ``reads_input``: the scheme needs the attention layer's input (FoX's
      data-dependent forget gate): it implements ``bind(x) -> PositionalScheme``,
      ``x`` the layer input ``(batch, length, model_dim)``, returning a scheme
      that shares its parameters and serves one call; an unbound one refuses
      to attend.  Instance-level when an option changes it.

    Construction for the registry: :meth:`build` and :meth:`examples`.
    """

    acts_on = "attention"
    quadratic_memory = False
    reference: str | None = None
    shared_across_layers = False
    weights_sum_to_one = True
    output_is_weights_times_v = True
    float64_buffers: tuple[str, ...] = ()
    reads_input = False

    # --- hooks ---------------------------------------------------------------------------

    def rotate(
        self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return ``(q, k)`` transformed at ``ctx.q_positions`` and ``ctx.k_positions``.

        Identity by default.  Each token must be transformed by its own position
        only (no dependence on the other tokens or on the length), so that a
        KV cache can transform each key once, when it arrives.
        """
        return q, k

    def score_mod(self, ctx: CallContext) -> ScoreMod | None:
        """FlexAttention form of the scheme's score change, or ``None``.

        Returns ``f(score, b, h, q_pos, k_pos) -> score + term``: ``score`` is
        the scaled score (float32, float64 for float64 inputs), ``b`` and ``h``
        the batch and query-head indices, ``q_pos`` and ``k_pos`` the integer
        positions of the query and the key.  In the fused kernel they are 0-d
        tensors; for the dense :meth:`bias` they are broadcastable index
        tensors, so write ``f`` with elementwise tensor operations and
        indexing (``slopes[h]``), never Python control flow on values.  Build
        any tables ``f`` reads here, on ``ctx.device``; bounds and constants
        that vary between calls should be tensors (a Python number captured
        in ``f`` recompiles the kernel for every new value).
        """
        return None

    def bias(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor | None:
        """Additive score bias for the eager path, or ``None``.

        Added to the scaled scores ``ctx.scale * q @ k.T``; it must broadcast
        to ``(batch, heads, q_len, k_len)``, e.g. ``(heads, q_len, k_len)`` or
        ``(batch, heads, q_len, k_len)``, and be finite (masking is
        ``ctx.mask``'s job).  ``q`` and ``k`` come after :meth:`rotate`, so a
        content-dependent bias (Shaw) can use them.  The default evaluates
        :meth:`score_mod` on the whole grid of positions, in float32 (float64 for
        float64 inputs), as the fused kernel does.
        """
        if _owner(type(self), "score_mod") is PositionalScheme:
            return None
        mod = self.score_mod(ctx)
        return None if mod is None else score_mod_bias(mod, ctx)

    def attend(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, ctx: CallContext
    ) -> torch.Tensor:
        """Attention output ``(batch, heads, q_len, d_v)``, from ``q``, ``k`` after :meth:`rotate`.

        The default adds :meth:`bias` to the scores through
        :func:`posenc.scaled_dot_product` (PyTorch's SDPA with the shared masks).
        """
        return _sdpa.scaled_dot_product(
            q, k, v, mask=ctx.mask, bias=self.bias(q, k, ctx), causal=ctx.causal,
            q_offset=ctx.q_offset, scale=ctx.scale,
        )  # fmt: skip

    def weights(self, q: torch.Tensor, k: torch.Tensor, ctx: CallContext) -> torch.Tensor:
        """The ``(batch, heads, q_len, k_len)`` matrix :meth:`attend` applies to the values.

        The default computes the same logits explicitly (``ctx.scale * q @ k.T``
        plus :meth:`bias`) and normalises them with :func:`posenc.softmax_weights`.
        """
        logits = _sdpa.dot_scores(q, k, ctx.scale)
        w = _sdpa.softmax_weights(
            logits, mask=ctx.mask, bias=self.bias(q, k, ctx), causal=ctx.causal,
            q_offset=ctx.q_offset,
        )  # fmt: skip
        return w.to(q.dtype)

    # --- calling a scheme ----------------------------------------------------------------

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
        mask: torch.Tensor | None = None, bias: torch.Tensor | None = None,
        causal: bool = False, q_offset: int | None = None,
        q_positions: Positions | None = None, k_positions: Positions | None = None,
        scale: float | None = None,
    ) -> torch.Tensor:  # fmt: skip
        """``posenc.attention(q, k, v, encoding=self, backend="eager", ...)``: its own path."""
        q4, k4, v4, ctx = prepare(
            q, k, v, mask=mask, bias=bias, causal=causal, q_offset=q_offset,
            q_positions=q_positions, k_positions=k_positions, scale=scale,
        )  # fmt: skip
        assert v4 is not None  # prepare returns v as 4-D when it is given
        q4, k4 = self.rotate(q4, k4, ctx)
        return self.attend(q4, k4, v4, ctx).reshape(*q.shape[:-1], v.shape[-1])

    # --- the registry's uniform construction and metadata ----------------------------------

    @classmethod
    def build(cls, num_heads: int, head_dim: int, *, max_len: int | None = None,
              causal: bool = True, **options: Any) -> Self:  # fmt: skip
        """An instance for ``num_heads`` query heads of size ``head_dim``.

        What the lab and the tests call.  ``max_len`` is the training length
        (a hint for tables and distances), ``causal`` whether the model is a
        decoder; ``options`` go to the constructor.  The default passes
        ``num_heads``, ``head_dim`` (or ``dim``) and ``max_positions=max_len``
        to the constructor by name where it takes them; override it when the
        constructor needs more, and start the override with
        ``posenc._checks.check_build_args``, so that bad values are named as the caller
        wrote them (``max_len``, not the constructor's ``max_positions``).
        """
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        params = inspect.signature(cls.__init__).parameters
        known = {"num_heads": num_heads, "head_dim": head_dim, "dim": head_dim}
        if max_len is not None:
            known["max_positions"] = max_len
        kwargs = {n: x for n, x in known.items() if n in params and n not in options}
        return cls(**kwargs, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """Instances the conformance battery runs, by label (``""`` for the default one).

        Override to add variants (an option that changes the path) or to draw
        parameters far from their initialisation, so that every term matters.
        """
        return {"": cls.build(num_heads, head_dim)}

    @classmethod
    def hooks(cls) -> tuple[str, ...]:
        """The hooks this class overrides (its own or inherited), in contract order."""
        names = ("rotate", "score_mod", "bias", "attend")
        return tuple(n for n in names if _owner(cls, n) is not PositionalScheme)

    @classmethod
    def fused(cls) -> bool:
        """Whether FlexAttention computes exactly this class's eager result.

        True when the class keeps the default ``attend`` and either changes no
        score or defines its ``score_mod`` at least as deep in the class
        hierarchy as its ``bias``.
        """
        if _owner(cls, "attend") is not PositionalScheme:
            return False
        return issubclass(_owner(cls, "score_mod"), _owner(cls, "bias"))

    @classmethod
    def changes_scores(cls) -> bool:
        """Whether the class adds anything to the scores (``score_mod`` or ``bias``)."""
        return any(_owner(cls, n) is not PositionalScheme for n in ("score_mod", "bias"))

    def _apply(self, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True) -> Self:
        exact = {n: t for n in self.float64_buffers if (t := self._buffers.get(n)) is not None}
        out: Self = super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        for name, t in exact.items():  # device moves only: a cast would round them
            moved = self._buffers[name]
            assert moved is not None
            self._buffers[name] = t.to(device=moved.device)
        return out


class NoPE(PositionalScheme):
    """No positional information: attention is permutation-equivariant (``encoding=None``).

    :func:`posenc.attention` with ``encoding=None`` uses it; it has no parameters and
    adds nothing to the scores.

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> x = torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64)
    >>> perm = torch.tensor([4, 0, 3, 1, 2])
    >>> out = posenc.attention(x, x, x, encoding=posenc.NoPE())
    >>> shuffled = posenc.attention(x[:, :, perm], x[:, :, perm], x[:, :, perm],
    ...                             encoding=posenc.NoPE())
    >>> torch.allclose(shuffled, out[:, :, perm])  # reordering the tokens reorders the output
    True
    >>> torch.equal(out, posenc.attention(x, x, x, encoding=None))
    True
    """

    reference = "kazemnejad2023nope"

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
        check_build_args(num_heads, head_dim, max_len, causal)
        return cls(**options)


def score_mod_bias(mod: ScoreMod, ctx: CallContext) -> torch.Tensor:
    """A ``score_mod``'s term as a dense bias, ``(batch|1, heads|1, q_len, k_len)``.

    Evaluates ``mod(0, b, h, q_pos, k_pos)`` on broadcast index tensors, in
    float32 (float64 for float64 inputs), as the fused kernel does.
    """
    work = torch.promote_types(ctx.dtype, torch.float32)
    qp, kp = ctx.q_positions, ctx.k_positions
    qp = qp[:, None, :, None] if qp.dim() == 2 else qp[None, None, :, None]
    kp = kp[:, None, None, :] if kp.dim() == 2 else kp[None, None, None, :]
    b = torch.arange(ctx.batch, device=ctx.device)[:, None, None, None]
    h = torch.arange(ctx.heads, device=ctx.device)[None, :, None, None]
    zero = torch.zeros((), dtype=work, device=ctx.device)
    return mod(zero, b, h, qp, kp)


def as_scheme(encoding: object) -> PositionalScheme:
    """``encoding`` if it is a :class:`PositionalScheme`, :class:`NoPE` for ``None``."""
    if encoding is None:
        return _NOPE
    if not isinstance(encoding, PositionalScheme):
        raise TypeError(
            f"encoding must be a posenc PositionalScheme or None, got {type(encoding).__name__}"
        )
    return encoding


# Names that lived here before issue 20 split this module (contract / attend / sdpa /
# masks): still reachable as ``posenc.scheme.attention`` for one release, with a warning.
# masks and sdpa are imported above; attend imports this module, so it hands its two
# functions over when it is imported (_SERVED) instead of this module importing it,
# which would close a circle.
_SERVED: dict[str, object] = {}
_MOVED = {
    "attention": "attend",
    "attention_weights": "attend",
    "causal_mask": "masks",
    "merge_masks": "masks",
    "scaled_dot_product": "sdpa",
    "softmax_weights": "sdpa",
    "dot_scores": "sdpa",
    "repeat_kv": "sdpa",
}


def __getattr__(name: str) -> object:
    home = _MOVED.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    warn_caller(
        f"posenc.scheme.{name} is deprecated and will be removed in posenc 0.2.0: use "
        f"posenc.{name} (defined in posenc.{home})",
        DeprecationWarning,
    )
    if home == "attend":
        return _SERVED[name]  # filled by posenc.attend, which ``import posenc`` runs first
    return getattr({"masks": _masks, "sdpa": _sdpa}[home], name)


def _owner(cls: type, name: str) -> type:
    """The class in ``cls``'s hierarchy that defines method ``name``."""
    owner: type = next(c for c in cls.__mro__ if name in c.__dict__)
    return owner


_NOPE = NoPE()
