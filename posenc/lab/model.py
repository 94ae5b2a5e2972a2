"""A tiny decoder-only transformer whose positional scheme is any registered posenc scheme.

The model never computes a position itself: the tables, biases and rotations
all come from :mod:`posenc`, so the lab measures the library's schemes.  It
builds them from the registry, :data:`posenc.SCHEMES`: every registered scheme
trains here, with ``cls.build(heads, head_dim, max_len=train_len, causal=True)``.

* A scheme that acts on the input (``acts_on = "input"``: ``sinusoidal``,
  ``learned``) adds ``encode(positions)`` to the token embeddings, of the first
  layer only or, with ``inject="every"``, of every layer (one table per layer).
* A scheme that acts on attention is passed to ``posenc.attention`` in every
  layer: one instance per layer, or one for all layers when its class says
  ``shared_across_layers`` (T5, as in T5).  ``none`` is :class:`posenc.NoPE`.

The lab's settings of the original schemes (``rope_base``, ``shaw_clip``,
``t5_buckets``, ``t5_max_distance``, ``table_len``) are options passed to
``build``; the stored results were made with them.

A per-layer pattern (``pattern=``, a :class:`~posenc.lab.LayerSpec` per layer, see
:mod:`posenc.lab.patterns`) gives each layer its own scheme, options, sliding window
or chunk, as Llama 4, Cohere2, SmolLM3 and Gemma 3 do; without one the model is
built exactly as before.

Shapes: tokens ``(batch, seq)`` int64 -> logits ``(batch, seq, vocab)``;
attention runs on ``(batch, heads, seq, head_dim)`` with ``causal=True``.
Memory: beyond what each scheme's eager path builds (``quadratic_memory`` in
:func:`posenc.scheme_table`), the model builds no O(seq^2) tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import torch
from torch import nn

import posenc

from .._checks import check_choice, check_float, check_int
from ..scheme import PositionalScheme
from ..temperature import TemperedNoPE
from .patterns import LayerSpec

__all__ = ["SCHEMES", "INJECTIONS", "TinyDecoder", "check_scheme"]

#: Names of the schemes the lab trains: every entry of :data:`posenc.SCHEMES`.
SCHEMES = tuple(posenc.SCHEMES)
#: Where a scheme that acts on the input adds its table (``TinyDecoder(inject=...)``):
#: ``"input"``, to the token embeddings before the first layer only, or ``"every"``, to
#: the input of every layer, one table per layer.
INJECTIONS = ("input", "every")


def check_scheme(scheme: object) -> str:
    """Return ``scheme`` if it is a name in :data:`posenc.SCHEMES`, else raise.

    Raises ``TypeError`` when ``scheme`` is not a ``str``, and ``ValueError``
    naming ``scheme`` and listing the registered names when it is not one of them.

    Parameters
    ----------
    scheme
        The value to check: a scheme's registered name, such as ``"rope"``.

    Returns
    -------
    ``scheme`` itself.

    Examples
    --------
    >>> from posenc.lab import check_scheme
    >>> check_scheme("rope")
    'rope'
    >>> check_scheme("rotary")
    Traceback (most recent call last):
    ...
    ValueError: scheme must be one of 'none', 'sinusoidal', ..., got 'rotary'
    """
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a str, got {type(scheme).__name__}")
    return check_choice("scheme", scheme, tuple(posenc.SCHEMES))


class _InputTable(Protocol):
    """A scheme that acts on the input (``sinusoidal``, ``learned``): a table of positions."""

    def encode(self, positions: torch.Tensor) -> torch.Tensor: ...


class _Block(nn.Module):
    """Pre-LayerNorm block: causal self-attention through ``posenc.attention``, then an MLP."""

    def __init__(self, d_model: int, heads: int, encoding: PositionalScheme | None) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        # this layer's own scheme (None: a shared scheme, or none on attention, is passed
        # in at call time)
        self.encoding = encoding

    def forward(
        self, x: torch.Tensor, encoding: PositionalScheme | None, mask: torch.Tensor | None = None
    ) -> torch.Tensor:
        b, n, d = x.shape
        h = self.ln1(x)
        qkv: torch.Tensor = self.qkv(h)  # (nn.Module.__call__ is untyped)
        q, k, v = qkv.view(b, n, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        if getattr(encoding, "reads_input", False):  # FoX's gate, PaTH: read this layer's input
            encoding = encoding.bind(h)  # type: ignore[union-attr,operator]
        a = posenc.attention(q, k, v, encoding=encoding, causal=True, mask=mask)
        attended: torch.Tensor = self.out(a.transpose(1, 2).reshape(b, n, d))
        x = x + attended
        mlp: torch.Tensor = self.mlp(self.ln2(x))
        return x + mlp


class TinyDecoder(nn.Module):
    """A small causal language model with a pluggable positional scheme.

    Parameters
    ----------
    vocab
        Number of token ids.
    scheme
        A name in :data:`posenc.SCHEMES`.
    train_len
        Training length ``L``: ``max_len`` of every scheme's ``build`` (the
        experiments also pass it to RoPE scalings as ``original_max_positions``).
    table_len
        Rows of the learned table (scheme ``learned`` only; default
        ``train_len``).  A table longer than ``train_len`` lets the model run
        on longer inputs, with rows that training never touched.
    d_model, layers, heads
        Width, depth and number of heads (``d_model`` divisible by ``heads``).
    inject
        ``"input"`` or ``"every"`` (schemes that act on the input only).
    rope_base
        RoPE wavelength base.
    shaw_clip
        Shaw's clipping distance ``k``.
    t5_buckets, t5_max_distance
        T5's (unidirectional) bucketing.
    alibi_slope_scale
        Multiplies every ALiBi slope (scheme ``alibi`` only; 1 keeps the
        paper's geometric slopes).
    options
        More keyword arguments for the scheme's ``build``, e.g. a new scheme's
        settings.
    pattern
        ``None`` (every layer the same scheme), or one :class:`~posenc.lab.LayerSpec`
        per layer (``len(pattern) == layers``): each layer builds its own scheme (the
        spec's, or ``scheme`` with the settings above where the spec's is ``None``;
        the spec's options override the settings), attends within its window or
        chunk, and on a NoPE layer with a ``temperature`` is
        :class:`posenc.TemperedNoPE`.  ``scheme`` must then act on attention, and no
        layer's scheme may be shared across layers (T5).  The layers are built in
        order, each scheme before its block, as without a pattern: a pattern whose
        specs are all ``LayerSpec()`` gives the same model.

    Attribute ``window`` (default ``None``): when set to an int ``w``, every
    query attends only to its last ``w`` keys (itself and the ``w - 1`` before
    it), through a keep-mask passed to ``posenc.attention``; the lab's
    window-of-``L`` control of the recall task sets it on a copy of a trained
    model.  It applies on top of every layer's own window or chunk.

    Examples
    --------
    >>> import torch
    >>> from posenc.lab import TinyDecoder, layer_pattern
    >>> _ = torch.manual_seed(0)
    >>> model = TinyDecoder(16, "rope", 8, layers=4, pattern=layer_pattern("irope", 4, 8))
    >>> model.layer_schemes
    ('rope', 'rope', 'rope', 'none')
    >>> [type(b.encoding).__name__ for b in model.blocks]
    ['RotaryEmbedding', 'RotaryEmbedding', 'RotaryEmbedding', 'TemperedNoPE']
    >>> model(torch.zeros(2, 8, dtype=torch.long)).shape
    torch.Size([2, 8, 16])
    """

    def __init__(
        self,
        vocab: int,
        scheme: str,
        train_len: int,
        *,
        d_model: int = 64,
        layers: int = 2,
        heads: int = 4,
        table_len: int | None = None,
        inject: str = "input",
        rope_base: float = 100.0,
        shaw_clip: int = 16,
        t5_buckets: int = 16,
        t5_max_distance: int | None = None,
        alibi_slope_scale: float = 1.0,
        options: dict[str, Any] | None = None,
        pattern: Sequence[LayerSpec] | None = None,
    ) -> None:
        super().__init__()
        self.vocab = check_int("vocab", vocab, minimum=1)
        self.scheme = check_scheme(scheme)
        self.train_len = check_int("train_len", train_len, minimum=1)
        if table_len is not None and scheme != "learned":
            raise ValueError(f"table_len needs scheme 'learned', got scheme {scheme!r}")
        self.table_len = (
            self.train_len if table_len is None else check_int("table_len", table_len, minimum=1)
        )
        self.d_model = check_int("d_model", d_model, minimum=1)
        self.heads = check_int("heads", heads, minimum=1)
        layers = check_int("layers", layers, minimum=1)
        if d_model % heads:
            raise ValueError(f"d_model must be divisible by heads={heads}, got {d_model}")
        self.inject = check_choice("inject", inject, INJECTIONS)
        cls = posenc.SCHEMES[scheme]
        self.on_input = cls.acts_on == "input"
        if inject == "every" and not self.on_input:
            inputs = [n for n, c in posenc.SCHEMES.items() if c.acts_on == "input"]
            raise ValueError(
                f"inject='every' needs a scheme that acts on the input ({', '.join(inputs)}), "
                f"got {scheme!r}"
            )
        self.rope_base = rope_base
        if alibi_slope_scale != 1.0 and scheme != "alibi":
            raise ValueError(f"alibi_slope_scale needs scheme 'alibi', got scheme {scheme!r}")
        self.alibi_slope_scale = check_float("alibi_slope_scale", alibi_slope_scale, positive=True)
        head_dim = d_model // heads
        # the lab's settings of the original schemes: the stored results use them
        settings: dict[str, dict[str, int | float | None]] = {
            "rope": {"base": rope_base},
            "shaw": {"max_distance": shaw_clip},
            "t5": {"num_buckets": t5_buckets, "max_distance": t5_max_distance},
            "learned": {"init_std": 1.0},  # the token embeddings are N(0, 1) as well
        }
        lab_options = settings.get(scheme, {})
        self._options = {
            k: v for k, v in {**lab_options, **(options or {})}.items() if v is not None
        }
        max_len = self.table_len if scheme == "learned" else self.train_len

        def build() -> nn.Module:  # every scheme of posenc.SCHEMES is a module
            scheme: nn.Module = cls.build(
                heads, head_dim, max_len=max_len, causal=True, **self._options
            )
            if self.alibi_slope_scale != 1.0:  # ALiBi's slopes: a float64 buffer, exact powers of 2
                cast(torch.Tensor, scheme.slopes).mul_(self.alibi_slope_scale)
            return scheme

        def on_attention() -> PositionalScheme:
            # one that acts on attention is a PositionalScheme (posenc.attention takes no other)
            return cast(PositionalScheme, build())

        self.pattern: tuple[LayerSpec, ...] | None = None
        self.layer_schemes: tuple[str, ...] = (scheme,) * layers
        if pattern is not None:
            self._build_pattern(pattern, layers, settings, build, vocab)
            return
        self.embed = nn.Embedding(vocab, d_model)
        self.tables: nn.ModuleList | None = None
        if self.on_input:
            self.tables = nn.ModuleList(build() for _ in range(layers if inject == "every" else 1))
        shared = self.on_input or cls.shared_across_layers
        self.blocks = nn.ModuleList(
            _Block(d_model, heads, None if shared else on_attention()) for _ in range(layers)
        )
        # a scheme shared by every layer, built after the blocks (the stored runs' draw order)
        self.shared = on_attention() if cls.shared_across_layers and not self.on_input else None
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.window: int | None = None

    def _build_pattern(
        self,
        pattern: Sequence[LayerSpec],
        layers: int,
        settings: dict[str, dict[str, int | float | None]],
        build: Callable[[], nn.Module],
        vocab: int,
    ) -> None:
        """The rest of ``__init__`` for a per-layer ``pattern``: one scheme per layer."""
        specs = tuple(pattern)
        if len(specs) != layers or not all(isinstance(s, LayerSpec) for s in specs):
            raise ValueError(
                f"pattern must hold one posenc.lab.LayerSpec per layer ({layers}), got {specs!r}"
            )
        if self.on_input:
            raise ValueError(f"pattern needs a scheme that acts on attention, got {self.scheme!r}")
        names = tuple(self.scheme if s.scheme is None else s.scheme for s in specs)
        for i, name in enumerate(names):
            if posenc.SCHEMES[name].shared_across_layers:
                raise ValueError(
                    f"pattern layer {i}: scheme {name!r} is shared across layers; a pattern "
                    "builds one scheme per layer"
                )
        self.pattern = specs
        self.layer_schemes = names
        head_dim = self.d_model // self.heads

        def layer_scheme(spec: LayerSpec, name: str) -> PositionalScheme:
            if spec.temperature is not None:  # Llama 4's NoPE layers
                scale, floor = spec.temperature
                return TemperedNoPE(attn_scale=scale, floor_scale=floor)
            if spec.scheme is None and not spec.options:  # the model's own, as without a pattern
                return cast(PositionalScheme, build())
            base = self._options if spec.scheme is None else settings.get(name, {})
            options = {k: v for k, v in {**base, **spec.options}.items() if v is not None}
            made: nn.Module = posenc.SCHEMES[name].build(
                self.heads, head_dim, max_len=self.train_len, causal=True, **options
            )
            if name == "alibi" and self.alibi_slope_scale != 1.0:
                cast(torch.Tensor, made.slopes).mul_(self.alibi_slope_scale)
            return cast(PositionalScheme, made)  # it acts on attention (LayerSpec checks)

        self.embed = nn.Embedding(vocab, self.d_model)
        self.tables = None
        self.blocks = nn.ModuleList(
            _Block(self.d_model, self.heads, layer_scheme(spec, name))
            for spec, name in zip(specs, names, strict=True)
        )
        self.shared = None
        self.ln_f = nn.LayerNorm(self.d_model)
        self.head = nn.Linear(self.d_model, vocab, bias=False)
        self.window = None

    # ------------------------------------------------------------------ positions

    def set_rope_scaling(self, scaling: posenc.RopeScaling | None) -> None:
        """Use RoPE with ``scaling`` (a :class:`posenc.RopeScaling` or ``None``) from now on.

        With a pattern: on every RoPE layer, each keeping its own base and layout."""
        if self.pattern is not None:
            if "rope" not in self.layer_schemes:
                raise ValueError("scaling needs a layer with scheme 'rope', the pattern has none")
            for name, block in zip(self.layer_schemes, self.blocks, strict=True):
                if name == "rope":
                    old = cast(posenc.RotaryEmbedding, block.encoding)
                    block.encoding = posenc.RotaryEmbedding(
                        old.dim, base=old.base, layout=old.layout, scaling=scaling
                    )
            return
        if self.scheme != "rope":
            raise ValueError(f"scaling needs scheme 'rope', got scheme {self.scheme!r}")
        rope = posenc.RotaryEmbedding(
            self.d_model // self.heads, base=self.rope_base, scaling=scaling
        )
        for block in self.blocks:
            block.encoding = rope

    @property
    def max_len(self) -> int | None:
        """Longest input the model can run on: the rows of an input table, else ``None``."""
        if self.tables is None:  # a scheme on attention (self.on_input is false)
            return None
        rows: int | None = getattr(self.tables[0], "max_positions", None)
        return rows

    def check_length(self, length: int, name: str = "length") -> int:
        """Return ``length`` if the model can run on it, else raise ``ValueError``."""
        length = check_int(name, length, minimum=1)
        if self.max_len is not None and length > self.max_len:
            raise ValueError(
                f"{name} must be at most {self.max_len} for scheme {self.scheme!r} (its table "
                f"has {self.max_len} rows, positions 0..{self.max_len - 1}), got {length}"
            )
        return length

    # ------------------------------------------------------------------ forward

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)`` for int64 ``tokens (batch, seq)``."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise TypeError("tokens must be an int64 tensor of shape (batch, seq)")
        self.check_length(tokens.shape[1], "seq")
        x = self.embed(tokens)
        positions = torch.arange(tokens.shape[1], device=tokens.device)
        mask = None
        if self.window is not None:
            window = check_int("window", self.window, minimum=1)
            mask = positions[:, None] - positions[None, :] < window  # keys i - w < j (<= i)
        if self.pattern is not None:
            return self._forward_pattern(x, positions, mask)
        for i, block in enumerate(self.blocks):
            # self.tables is set exactly when self.on_input
            if self.tables is not None and (i == 0 or self.inject == "every"):
                table = cast(_InputTable, self.tables[i if self.inject == "every" else 0])
                x = x + table.encode(positions).to(x.dtype)
            x = block(x, self.shared if block.encoding is None else block.encoding, mask)
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits

    def _forward_pattern(
        self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """The layers of a pattern, each with the model's mask and its own window or chunk."""
        assert self.pattern is not None
        masks: dict[tuple[int | None, int | None], torch.Tensor | None] = {}
        for spec, block in zip(self.pattern, self.blocks, strict=True):
            key = (spec.window, spec.chunk)
            if key not in masks:
                keep = mask
                if spec.window is not None:  # keys i - w < j (<= i), transformers' overlay
                    near = positions[:, None] - positions[None, :] < spec.window
                    keep = near if keep is None else keep & near
                if spec.chunk is not None:  # keys in the query's chunk (Llama 4)
                    same = positions[:, None] // spec.chunk == positions[None, :] // spec.chunk
                    keep = same if keep is None else keep & same
                masks[key] = keep
            x = block(x, block.encoding, masks[key])
        logits: torch.Tensor = self.head(self.ln_f(x))
        return logits

    def extra_repr(self) -> str:
        window = "" if self.window is None else f", window={self.window}"
        pattern = "" if self.pattern is None else f", layer_schemes={self.layer_schemes}"
        return (
            f"scheme={self.scheme!r}, train_len={self.train_len}, inject={self.inject!r}"
            f"{pattern}{window}"
        )


def num_parameters(model: nn.Module) -> int:
    """Trainable parameter count."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
