"""The Forgetting Transformer (FoX): a forget gate per head, added to the attention scores.

Lin, Nikishin, He and Courville (ICLR 2025) give each head a scalar forget
gate per token, ``f_t = sigmoid(w_h . x_t + b_h)`` in (0, 1), and multiply the
unnormalised attention weight of key ``j`` seen by query ``i`` by the gates of
the tokens after ``j`` up to ``i``.  In the log domain that is an additive
score term, with ``c = cumsum(log f)`` (the cumulative log-gate):

    D_ij = sum_{j < l <= i} log f_l = c_i - c_j          (<= 0 for j <= i)

so ``scores = scale * q_i . k_j + D_ij``: the gate term is added *after* the
softmax scale, as in the paper's Eq. 6 and in flash-linear-attention's
``naive_forgetting_attn`` (``fla/ops/forgetting_attn/naive.py``).  With a gate
that does not depend on the input, ``f_h = sigmoid(b_h)``, the term is
``log f_h * (i - j)``: ALiBi with slope ``-logsigmoid(b_h)``.  CABLE (Veisi et
al., 2025) learns per-token biases of the same cumulative form.

posenc offers both gates, in one registered scheme, :class:`ForgettingAttention`:

* ``gate="data"`` (the default of ``build()``, the paper's FoX): the scheme owns
  a :class:`ForgetGate` and reads the attention layer's input.  It sets
  ``reads_input = True``; ``scheme.bind(x)`` computes the gates from ``x``
  ``(batch, length, model_dim)`` and returns a bound scheme (sharing the gate's
  parameters) for one call.  Calling attention with the unbound scheme raises.
* ``gate="fixed"``: a learnable bias ``b_h`` per head and no input, the paper's
  "data-independent forget gate" ablation; exactly a learnable ALiBi.

Positions.  A bound scheme is a table over positions: the token ``t`` of ``x``
sits at position ``start + t`` (``start=0`` by default), and the term of a query
at position ``p`` and a key at position ``s`` is ``-|c_p - c_s|`` (equal to
``c_p - c_s`` for ``s <= p``, the causal case; symmetric otherwise, as ALiBi's
``-m|p - s|``).  With the default positions (keys at ``0 .. k_len-1``) the
position is the token index.  For a left-padded batch give FoX the default
positions and the padding mask (the padding gates then only ever multiply
masked scores), not the per-sample positions of position-based schemes, which
would read other tokens' gates.

Decoding with :class:`posenc.KVCache`: the cache keeps each cached key's
``c`` (see :meth:`ForgettingAttention.cache_state`).  Bind the prompt with
``bind(x)``, then each step's new tokens with ``bind(x_new, start=cache.length)``
and set it as ``cache.encoding`` before ``update``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from ._checks import check_build_args, check_choice, check_floating, check_int
from ._runtime import has_values
from ._types import ScoreMod
from .attend import attention
from .context import CallContext
from .scheme import PositionalScheme

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ForgetGate", "ForgettingAttention", "forgetting_attention"]

INITS = ("paper", "x-transformers")
GATES = ("data", "fixed")
# x-transformers' DataDependentAlibi: nn.init.constant_(linear.bias, bias_init=5.0)
# (lucidrains/x-transformers, x_transformers/x_transformers.py, class DataDependentAlibi,
# commit b8a9add6bb5eb6099e0755869d0caeeda4b1eb31): f = sigmoid(5) ~ 0.993 at the start.
XTRANSFORMERS_BIAS = 5.0
# The paper's code (zhixuan-lin/forgetting-transformer,
# src/forgetting_transformer/model/forgetting_transformer/modeling_forgetting_transformer.py,
# ForgettingAttentionLayer._initialize_weights, commit 3834821b5dc1d112659eebead6d1a0ff101ed3be):
# fgate_proj = nn.Linear(hidden, heads, bias=True), weight N(0, 0.02^2), bias 0, so f ~ 0.5.
PAPER_STD = 0.02


def _keys_never_after_queries(ctx: CallContext) -> bool:
    """Whether, in a causal call, every key a query sees (by index) sits at or before it.

    Read on the host (positions with values only): then ``c_q - c_k <= 0`` for every
    visible pair and ``-|c_q - c_k|`` is ``c_q - c_k``.
    """
    if not ctx.causal:
        return False
    reach = ctx.k_positions.cummax(dim=-1).values  # the latest key position up to index j
    index = (torch.arange(ctx.q_len, device=reach.device) + ctx.q_offset).clamp(0, ctx.k_len - 1)
    seen = reach[..., index]
    visible = torch.arange(ctx.q_len, device=reach.device) + ctx.q_offset >= 0
    return bool(((seen <= ctx.q_positions) | ~visible).all())


def _min_bucket(n: int) -> int:
    """The table size for ``n`` positions: a power of two >= 256, so few kernels compile."""
    return max(256, 1 << max(n - 1, 0).bit_length())


class ForgetGate(nn.Module):
    """FoX's forget gate: ``log_f = logsigmoid(x @ W.T + b)`` per head, ``(batch, heads, length)``.

    Parameters
    ----------
    model_dim
        Width of the layer input ``x``.
    num_heads
        Number of (query) heads, one gate each.
    init
        ``"paper"``: weight ``N(0, 0.02**2)`` and bias 0, as the paper's code
        initialises ``fgate_proj`` (gates near 0.5 at the start);
        ``"x-transformers"``: PyTorch's default ``nn.Linear`` weight and bias 5,
        as lucidrains' ``DataDependentAlibi`` (gates near ``sigmoid(5) ~ 0.993``,
        little forgetting at the start).

    Examples
    --------
    >>> import torch, posenc
    >>> gate = posenc.ForgetGate(16, 4, init="x-transformers")
    >>> log_f = gate(torch.zeros(2, 5, 16))       # (batch, length, model_dim)
    >>> log_f.shape, round(log_f.exp()[0, 0, 0].item(), 4)
    (torch.Size([2, 4, 5]), 0.9933)
    """

    def __init__(self, model_dim: int, num_heads: int, *, init: str = "paper") -> None:
        super().__init__()
        self.model_dim = check_int("model_dim", model_dim, minimum=1)
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.init = check_choice("init", init, INITS)
        self.proj = nn.Linear(self.model_dim, self.num_heads, bias=True)
        with torch.no_grad():
            if self.init == "paper":
                nn.init.normal_(self.proj.weight, mean=0.0, std=PAPER_STD)
                nn.init.zeros_(self.proj.bias)
            else:
                nn.init.constant_(self.proj.bias, XTRANSFORMERS_BIAS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``log_f`` ``(batch, heads, length)``, in float32 at least (float64 for float64 ``x``)."""
        x = check_floating("x", x)
        if x.dim() != 3 or x.shape[-1] != self.model_dim:
            raise ValueError(
                f"x must have shape (batch, length, model_dim={self.model_dim}), "
                f"got {tuple(x.shape)}"
            )
        logits: torch.Tensor = self.proj(x)
        work = torch.promote_types(x.dtype, torch.float32)  # as the paper: logsigmoid in fp32
        return nn.functional.logsigmoid(logits.to(work)).transpose(-1, -2)

    def extra_repr(self) -> str:
        return f"model_dim={self.model_dim}, num_heads={self.num_heads}, init={self.init!r}"


def _check_log_f(log_f: torch.Tensor) -> torch.Tensor:
    """Raise unless every entry of ``log_f`` is finite and <= 0 (when values can be read).

    Traced or symbolic, the entries that break the rule become NaN instead (so
    the output is poisoned, never silently wrong), as ``_checks.beyond_limit``.
    """
    bad = ~torch.isfinite(log_f) | (log_f > 0)
    if has_values(log_f):
        if bool(bad.any()):
            worst = log_f[bad][0].item()
            raise ValueError(
                f"log_f must be finite and <= 0 (the log of a forget gate in (0, 1]), got {worst}"
            )
        return log_f
    return log_f.masked_fill(bad, float("nan"))


class ForgettingAttention(PositionalScheme):
    """FoX's forget gate as a :class:`~posenc.PositionalScheme`: ``score - |c_q - c_k|``.

    ``c`` is the cumulative log forget gate at each position (see the module
    docstring); for ``key <= query`` the term is ``c_q - c_k``, the sum of the
    log-gates after the key up to the query.  Both paths read it:
    :meth:`score_mod` for FlexAttention (``c`` is a table the kernel indexes at
    the query's and the key's positions) and the default ``bias`` on the eager
    path.

    Parameters
    ----------
    num_heads
        Number of query heads.  Keys may have fewer (grouped-query attention);
        every query head has its own gate, as in FoX and fla.
    model_dim
        Width of the layer input that ``gate="data"`` reads (the ``build()``
        option defaults to ``num_heads * head_dim``).  Not used by ``"fixed"``.
    gate
        ``"data"``: ``f_t = sigmoid(w_h . x_t + b_h)`` from the layer input
        (FoX); the scheme must be bound, ``scheme.bind(x)``, before each call.
        ``"fixed"``: ``f_h = sigmoid(b_h)``, a learnable bias per head, no input
        (FoX's data-independent ablation; ALiBi with slope ``-logsigmoid(b_h)``).
    init
        Initialisation, see :class:`ForgetGate`: ``"paper"`` (weight
        ``N(0, 0.02**2)``, bias 0: ``f ~ 0.5``) or ``"x-transformers"`` (bias 5:
        ``f ~ 0.993``).  For ``"fixed"`` it sets ``b_h`` to 0 or 5.

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> fox = posenc.ForgettingAttention(4, model_dim=32)      # the paper's FoX
    >>> x = torch.randn(2, 6, 32, generator=g)                  # the layer input
    >>> q, k, v = torch.randn(3, 2, 4, 6, 8, generator=g)
    >>> out = posenc.attention(q, k, v, encoding=fox.bind(x), causal=True)
    >>> out.shape
    torch.Size([2, 4, 6, 8])
    >>> torch.allclose(out, posenc.forgetting_attention(q, k, v, fox.gate(x)), atol=1e-6)
    True

    A fixed gate is ALiBi with slopes ``-logsigmoid(b_h)``:

    >>> fixed = posenc.ForgettingAttention(4, gate="fixed")
    >>> with torch.no_grad():
    ...     _ = fixed.gate_logit.copy_(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    >>> alibi = posenc.ALiBi(4)
    >>> alibi.slopes = -torch.nn.functional.logsigmoid(fixed.gate_logit.double().detach())
    >>> torch.allclose(posenc.attention(q, k, v, encoding=fixed, causal=True),
    ...                posenc.attention(q, k, v, encoding=alibi, causal=True), atol=1e-6)
    True
    """

    quadratic_memory = True
    reference = "lin2025forgetting"
    reads_input = True

    c: torch.Tensor | None  # a buffer once bound: (batch | 1, heads, length)

    def __init__(
        self,
        num_heads: int,
        model_dim: int | None = None,
        *,
        gate: str = "data",
        init: str = "paper",
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, minimum=1)
        self.gate_kind = check_choice("gate", gate, GATES)
        self.init = check_choice("init", init, INITS)
        self.start = 0
        self.register_buffer("c", None, persistent=False)
        if self.gate_kind == "data":
            if model_dim is None:
                raise TypeError("model_dim must be given with gate='data' (the input width)")
            self.model_dim: int | None = check_int("model_dim", model_dim, minimum=1)
            self.gate = ForgetGate(self.model_dim, self.num_heads, init=self.init)
        else:
            self.model_dim = None if model_dim is None else check_int("model_dim", model_dim)
            self.reads_input = False
            start = 0.0 if self.init == "paper" else XTRANSFORMERS_BIAS
            self.gate_logit = nn.Parameter(torch.full((self.num_heads,), start))

    # --- construction for the registry ---------------------------------------------------

    @classmethod
    def build(cls, num_heads: int, head_dim: int, *, max_len: int | None = None,
              causal: bool = True, **options: Any) -> Self:  # fmt: skip
        """The paper's data-dependent FoX (``gate="data"``), reading ``num_heads * head_dim``.

        ``options`` go to the constructor (``gate="fixed"``, ``model_dim``, ``init``).
        """
        num_heads, head_dim, max_len = check_build_args(num_heads, head_dim, max_len, causal)
        if options.get("gate", "data") == "data":
            options.setdefault("model_dim", num_heads * head_dim)
        return cls(num_heads, **options)

    @classmethod
    def examples(cls, num_heads: int, head_dim: int) -> dict[str, PositionalScheme]:
        """A data gate bound to a fixed random input (batch 1, 512 positions), and a fixed gate.

        Both draw parameters far from their initialisation, so that heads and
        positions differ (gates between about 0.3 and 0.99).  The bound table
        has batch 1, so it serves any batch, and covers positions 0 .. 511.
        """
        g = torch.Generator().manual_seed(1234)
        data = cls.build(num_heads, head_dim)
        assert data.model_dim is not None
        with torch.no_grad():
            proj = data.gate.proj
            proj.weight.copy_(torch.randn(proj.weight.shape, generator=g) / data.model_dim**0.5)
            proj.bias.copy_(torch.linspace(-1.0, 4.0, num_heads))
            x = torch.randn(1, 512, data.model_dim, generator=g)
            bound = data.bind(x)
        fixed = cls.build(num_heads, head_dim, gate="fixed")
        with torch.no_grad():
            fixed.gate_logit.copy_(torch.linspace(-0.5, 4.0, num_heads))
        return {"": bound, "fixed": fixed}

    # --- binding the layer input -----------------------------------------------------------

    def bind(self, x: torch.Tensor, *, start: int = 0) -> ForgettingAttention:
        """This scheme with the gates of ``x``, for one attention call.

        Parameters
        ----------
        x
            The attention layer's input ``(batch, length, model_dim)``; token ``t``
            sits at position ``start + t``.
        start
            Position of ``x``'s first token: 0 for a whole sequence (or a
            prompt), ``cache.length`` for the new tokens of a decoding step
            (:class:`posenc.KVCache` then continues the cached ``c``).

        Returns
        -------
        ForgettingAttention
            A lightweight scheme that shares this one's parameters (gradients
            reach the gate) and holds ``c = cumsum(log f)``, ``(batch, heads,
            length)``, float32 at least.  A fixed gate returns itself.
        """
        if self.gate_kind == "fixed":
            return self
        start = check_int("start", start, minimum=0)
        return self._with_table(torch.cumsum(self.gate(x), dim=-1), start)

    @classmethod
    def from_log_f(cls, log_f: torch.Tensor, *, start: int = 0) -> ForgettingAttention:
        """A bound scheme from given log forget gates ``(batch | 1, heads, length)``, no module.

        ``log_f`` must be finite and ``<= 0`` (refused otherwise, or NaN where
        values cannot be read); ``c = cumsum(log_f)`` in float32 at least.  It
        has no parameters: the gates' gradient flows through ``log_f``.
        """
        log_f = check_floating("log_f", log_f)
        if log_f.dim() != 3:
            raise ValueError(
                f"log_f must have shape (batch, heads, length), got {tuple(log_f.shape)}"
            )
        log_f = _check_log_f(log_f)
        work = torch.promote_types(log_f.dtype, torch.float32)
        scheme = cls.__new__(cls)
        PositionalScheme.__init__(scheme)
        scheme.num_heads, scheme.gate_kind, scheme.init = log_f.shape[1], "data", "paper"
        scheme.model_dim = None
        scheme.register_buffer("c", torch.cumsum(log_f.to(work), dim=-1), persistent=False)
        scheme.start = check_int("start", start, minimum=0)
        scheme.reads_input = False
        return scheme

    def _with_table(self, c: torch.Tensor, start: int) -> ForgettingAttention:
        """A shallow copy (parameters shared, not copied) that holds the table ``c``."""
        bound = type(self).__new__(type(self))
        bound.__dict__.update(self.__dict__)
        bound._parameters = dict(self._parameters)
        bound._buffers = dict(self._buffers)
        bound._modules = dict(self._modules)
        bound._buffers["c"] = c
        bound.start = start
        bound.reads_input = False
        return bound

    def _unbound(self) -> ValueError:
        return ValueError(
            f"encoding {type(self).__name__}(gate='data') reads the layer input and is not "
            f"bound: call scheme.bind(x) with the attention layer's input x (batch, length, "
            f"model_dim={self.model_dim}) and pass the scheme it returns"
        )

    # --- the hooks --------------------------------------------------------------------------

    def _table(self, ctx: CallContext) -> tuple[torch.Tensor, torch.Tensor]:
        """``(c, s)``: the table in the working dtype, ``(B|1, heads, L)``, and ``B > 1`` as 0/1."""
        name = type(self).__name__
        if self.c is None:
            raise self._unbound()
        if ctx.heads != self.num_heads:
            raise ValueError(
                f"{name}({self.num_heads}) needs q of shape (..., num_heads={self.num_heads}, "
                f"q_len, d), got {ctx.heads} heads"
            )
        assert self.c is not None
        c = self.c
        if c.shape[0] not in (1, ctx.batch):
            raise ValueError(
                f"{name} was bound to an input of batch {c.shape[0]}; the call has batch "
                f"{ctx.batch}: bind the input of this call"
            )
        work = torch.promote_types(ctx.dtype, torch.float32)
        n = c.shape[-1]
        # padded to a bucket: a kernel that reads the table compiles once per bucket
        c = nn.functional.pad(c.to(device=ctx.device, dtype=work), (0, _min_bucket(n) - n))
        return c, torch.tensor(int(c.shape[0] > 1), device=ctx.device)

    def score_mod(self, ctx: CallContext) -> ScoreMod:
        """``score - |c[q_pos] - c[k_pos]|`` (``score + log f_h * |q_pos - k_pos|`` when fixed)."""
        if self.gate_kind == "fixed":
            if ctx.heads != self.num_heads:
                raise ValueError(
                    f"{type(self).__name__}({self.num_heads}) needs q of shape (..., "
                    f"num_heads={self.num_heads}, q_len, d), got {ctx.heads} heads"
                )
            work = torch.promote_types(ctx.dtype, torch.float32)
            log_f = nn.functional.logsigmoid(self.gate_logit.to(device=ctx.device, dtype=work))

            def fixed(
                score: torch.Tensor,
                b: torch.Tensor,
                h: torch.Tensor,
                q_pos: torch.Tensor,
                k_pos: torch.Tensor,
            ) -> torch.Tensor:
                return score + log_f[h] * (q_pos - k_pos).abs().to(work)

            return fixed
        c, batched = self._table(ctx)
        assert self.c is not None
        length, start = self.c.shape[-1], self.start
        if has_values(ctx.q_positions) and has_values(ctx.k_positions):
            for name, pos in (("q_positions", ctx.q_positions), ("k_positions", ctx.k_positions)):
                lo, hi = torch.stack(torch.aminmax(pos)).tolist()
                if lo < start or hi >= start + length:
                    raise ValueError(
                        f"{name} must lie within the positions of the bound input, "
                        f"{start} .. {start + length - 1}, got values from {lo} to {hi}"
                    )

            causal = _keys_never_after_queries(ctx)
            if causal and c.shape[0] == 1 and start == 0:
                # the common inference call: one table for the batch, positions from 0, every
                # visible key at or before its query (c_q - c_k <= 0, no abs). A flat table
                # indexed h * width + position compiles to plain loads in the CPU kernel
                # (measured: 2-D or 3-D indexing cost 0.1 of ALiBi's time more under AVX2)
                width = c.shape[-1]  # a bucket size: one kernel per bucket
                flat = c[0].reshape(-1)

                def shared_mod(
                    score: torch.Tensor,
                    b: torch.Tensor,
                    h: torch.Tensor,
                    q_pos: torch.Tensor,
                    k_pos: torch.Tensor,
                ) -> torch.Tensor:
                    # the difference first: c is large and negative, score + c_q loses digits
                    return score + (flat[h * width + q_pos] - flat[h * width + k_pos])

                return shared_mod

            if causal:
                # every visible key sits at or before its query, where c_q - c_k <= 0:
                # the term needs no abs (one operation less per score in the fused kernel)
                def causal_mod(
                    score: torch.Tensor,
                    b: torch.Tensor,
                    h: torch.Tensor,
                    q_pos: torch.Tensor,
                    k_pos: torch.Tensor,
                ) -> torch.Tensor:
                    bb = b * batched
                    # the difference first: c is large and negative, score + c_q would lose digits
                    return score + (c[bb, h, q_pos - start] - c[bb, h, k_pos - start])

                return causal_mod

            def mod(
                score: torch.Tensor,
                b: torch.Tensor,
                h: torch.Tensor,
                q_pos: torch.Tensor,
                k_pos: torch.Tensor,
            ) -> torch.Tensor:
                bb = b * batched
                return score - (c[bb, h, q_pos - start] - c[bb, h, k_pos - start]).abs()

            return mod
        # traced or symbolic: positions outside the table poison the score (NaN)
        lo_t, hi_t = start, start + length - 1

        def safe(
            score: torch.Tensor,
            b: torch.Tensor,
            h: torch.Tensor,
            q_pos: torch.Tensor,
            k_pos: torch.Tensor,
        ) -> torch.Tensor:
            outside = (q_pos < lo_t) | (q_pos > hi_t) | (k_pos < lo_t) | (k_pos > hi_t)
            qi = (q_pos - start).clamp(0, length - 1)
            ki = (k_pos - start).clamp(0, length - 1)
            term = (c[b * batched, h, qi] - c[b * batched, h, ki]).abs()
            return torch.where(outside, float("nan"), score - term)

        return safe

    # --- KV cache ---------------------------------------------------------------------------

    def cache_state(
        self, state: torch.Tensor | None, positions: torch.Tensor, length: int
    ) -> torch.Tensor | None:
        """The ``c`` of every cached key after an update, ``(batch, heads, length + n)``.

        Called by :meth:`posenc.KVCache.update` with ``state`` (``c`` of the
        ``length`` keys cached so far, or ``None``) and the new tokens'
        positions ``(n,)`` or ``(batch, n)``.  A scheme bound with ``start=0``
        is a table from position 0: the new tokens take its entries at their
        positions.  Bound with ``start == length`` (a decoding step), its ``n``
        gates continue the cache: ``c`` of the last cached key plus the
        cumulative sum of the step's log-gates, in token order.  A fixed gate
        needs no state (its term is a function of the positions): ``None``.
        """
        if self.gate_kind == "fixed":
            return None
        if self.c is None:
            raise self._unbound()
        c, n = self.c, positions.shape[-1]
        if self.start == 0:
            if has_values(positions):
                lo, hi = torch.stack(torch.aminmax(positions)).tolist()
                if lo < 0 or hi >= c.shape[-1]:
                    raise ValueError(
                        f"positions must lie within the positions of the bound input, "
                        f"0 .. {c.shape[-1] - 1}, got values from {lo} to {hi}"
                    )
            idx = positions if positions.dim() == 2 else positions[None]
            b = max(c.shape[0], idx.shape[0])
            idx = idx.clamp(0, c.shape[-1] - 1)[:, None, :].expand(b, c.shape[1], n)
            new = torch.gather(c.expand(b, -1, -1), 2, idx)
        else:
            if self.start != length:
                raise ValueError(
                    f"start must be the cache's length to continue it: the scheme was bound "
                    f"with start={self.start} but the cache holds {length} tokens (bind the "
                    f"step's input with start=cache.length)"
                )
            if c.shape[-1] != n:
                raise ValueError(
                    f"the scheme was bound to {c.shape[-1]} tokens but the update brings {n}: "
                    f"bind exactly the new tokens' input"
                )
            new = c if state is None else c + state[..., -1:].to(c.dtype)
        if state is None:
            return new
        batch = max(state.shape[0], new.shape[0])
        return torch.cat(
            (state.expand(batch, -1, -1), new.to(state.dtype).expand(batch, -1, -1)), dim=-1
        )

    def cached_scheme(self, state: torch.Tensor) -> ForgettingAttention:
        """The scheme :meth:`posenc.KVCache.attention` runs: ``state`` read by cache index."""
        return self._with_table(state, 0)

    def extra_repr(self) -> str:
        bound = "" if self.c is None else f", bound to {tuple(self.c.shape)}, start={self.start}"
        return f"num_heads={self.num_heads}, gate={self.gate_kind!r}, init={self.init!r}{bound}"


def forgetting_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    log_f: torch.Tensor,
    *,
    causal: bool = True,
    scale: float | None = None,
    window: int | None = None,
    backend: str = "auto",
) -> torch.Tensor:
    """Forgetting attention from the log forget gates: softmax(``scale * q k^T + c_i - c_j``) v.

    Parameters
    ----------
    q
        Queries ``(batch, heads, q_len, d)``: the last ``q_len`` of the ``k_len``
        tokens (query ``i`` is token ``k_len - q_len + i``), as in decoding.
    k, v
        Keys ``(batch, kv_heads, k_len, d)`` and values ``(batch, kv_heads,
        k_len, d_v)``; ``kv_heads`` divides ``heads`` (grouped-query attention).
    log_f
        Log forget gates ``(batch, heads, k_len)``, one per query head and token
        (every token, also those before the first query), finite and ``<= 0``.
        ``c = cumsum(log_f)`` is taken over the tokens, in float32 at least.
    causal
        Query ``i`` sees the keys up to its own token.  ``False`` lets it see
        every key, with the symmetric term ``-|c_i - c_j|``.
    scale
        Multiplier of ``q @ k.T``, default ``1 / sqrt(d)``; the gate term is
        added after it (as fla and the paper).
    window
        Sliding window, as fla's ``window_size``: query ``i`` sees keys
        ``i - window + 1 .. i`` only.  Needs ``causal=True``.
    backend
        As in :func:`posenc.attention`.

    Returns
    -------
    Tensor ``(batch, heads, q_len, d_v)`` in the dtype of ``q``.

    Examples
    --------
    >>> import torch, posenc
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = torch.randn(3, 1, 2, 5, 8, generator=g, dtype=torch.float64)
    >>> zero = torch.zeros(1, 2, 5, dtype=torch.float64)        # f = 1: nothing forgotten
    >>> torch.allclose(posenc.forgetting_attention(q, k, v, zero),
    ...                posenc.attention(q, k, v, causal=True))
    True
    >>> posenc.forgetting_attention(q, k, v, zero + 0.5)
    Traceback (most recent call last):
    ...
    ValueError: log_f must be finite and <= 0 (the log of a forget gate in (0, 1]), got 0.5
    """
    q = check_floating("q", q)
    k = check_floating("k", k)
    log_f = check_floating("log_f", log_f)
    if q.dim() != 4 or k.dim() != 4:
        raise ValueError(
            f"q and k must be 4-D (batch, heads, len, d), got {tuple(q.shape)} and {tuple(k.shape)}"
        )
    batch, heads, q_len = q.shape[:3]
    k_len = k.shape[-2]
    if log_f.shape != (batch, heads, k_len):
        raise ValueError(
            f"log_f must have shape (batch, heads, k_len) = {(batch, heads, k_len)}, one gate "
            f"per query head and key token, got {tuple(log_f.shape)}"
        )
    if q_len > k_len:
        raise ValueError(
            f"q_len must be <= k_len (the queries are the last q_len tokens), got q_len={q_len}, "
            f"k_len={k_len}"
        )
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {type(causal).__name__}")
    mask = None
    if window is not None:
        w = check_int("window", window, minimum=1)
        if not causal:
            raise ValueError("window needs causal=True (fla's window_size is causal)")
        qp = torch.arange(k_len - q_len, k_len, device=q.device)
        kp = torch.arange(k_len, device=q.device)
        mask = (qp[:, None] - kp[None, :]) < w
    scheme = ForgettingAttention.from_log_f(log_f)
    return attention(
        q, k, v, encoding=scheme, causal=causal, scale=scale, mask=mask, backend=backend
    )
