"""A tiny decoder-only transformer whose positional scheme is any posenc scheme.

The model never computes a position itself: the tables, biases and rotations
all come from :mod:`posenc`, so the lab measures the library's schemes.

===================  ===============================================  =================
scheme               what ``posenc`` supplies                         where it acts
===================  ===============================================  =================
``none``             nothing (NoPE: ``encoding=None``)                 -
``sinusoidal``       :class:`posenc.SinusoidalEmbedding`              added to the input
``learned``          :class:`posenc.LearnedEmbedding`, ``table_len``  added to the input
                     rows
``rope``             :class:`posenc.RotaryEmbedding` (optionally      q and k, every layer
                     with a :class:`posenc.RopeScaling`)
``alibi``            :class:`posenc.ALiBi`                            scores, every layer
``t5``               :class:`posenc.T5RelativeBias`, one module       scores, every layer
                     shared by the layers as in T5
``shaw``             :class:`posenc.ShawRelativeAttention` per layer  scores and values
``transformer_xl``   :class:`posenc.TransformerXLScheme` per layer    scores
``da``               :class:`posenc.DAAttention` per layer            attention weights
===================  ===============================================  =================

``inject="every"`` adds the sinusoidal or learned table to the input of every
layer instead of only the first (the learned variant has one table per layer).

Shapes: tokens ``(batch, seq)`` int64 -> logits ``(batch, seq, vocab)``;
attention runs on ``(batch, heads, seq, head_dim)`` with ``causal=True``.
Memory: beyond the ``(batch, heads, seq, seq)`` attention that every scheme
but RoPE and NoPE materialises anyway (see :mod:`posenc.attention`), the model
builds no O(seq^2) tensor.
"""

from __future__ import annotations

import torch
from torch import nn

import posenc

from .._checks import check_choice, check_int

__all__ = ["SCHEMES", "INJECTIONS", "TinyDecoder", "check_scheme"]

SCHEMES = (
    "none",
    "sinusoidal",
    "learned",
    "rope",
    "alibi",
    "t5",
    "shaw",
    "transformer_xl",
    "da",
)
INJECTIONS = ("input", "every")
_ADDITIVE = ("sinusoidal", "learned")  # schemes that add a table to the residual stream


def check_scheme(scheme) -> str:
    """Return ``scheme`` if it is one of :data:`SCHEMES`, else raise ``ValueError``."""
    if not isinstance(scheme, str):
        raise TypeError(f"scheme must be a str, got {type(scheme).__name__}")
    return check_choice("scheme", scheme, SCHEMES)


class _Block(nn.Module):
    """Pre-LayerNorm block: causal self-attention through ``posenc.attention``, then an MLP."""

    def __init__(self, d_model: int, heads: int, encoding):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model, bias=False)
        self.out = nn.Linear(d_model, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(
            nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model)
        )
        # a scheme that is an nn.Module and owned by this layer is registered here;
        # shared or parameter-free schemes are passed in at call time
        self.encoding = encoding if isinstance(encoding, nn.Module) else None

    def forward(self, x: torch.Tensor, encoding) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).unbind(2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # (batch, heads, seq, head_dim)
        a = posenc.attention(q, k, v, encoding=encoding, causal=True)
        x = x + self.out(a.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class TinyDecoder(nn.Module):
    """A small causal language model with a pluggable positional scheme.

    Parameters
    ----------
    vocab
        Number of token ids.
    scheme
        One of :data:`SCHEMES`.
    train_len
        Training length ``L`` (recorded; the experiments pass it to RoPE
        scalings as ``original_max_positions``).
    table_len
        Rows of the learned table (scheme ``learned`` only; default
        ``train_len``).  A table longer than ``train_len`` lets the model run
        on longer inputs, with rows that training never touched.
    d_model, layers, heads
        Width, depth and number of heads (``d_model`` divisible by ``heads``).
    inject
        ``"input"`` or ``"every"`` (sinusoidal and learned only).
    rope_base
        RoPE wavelength base.
    shaw_clip
        Shaw's clipping distance ``k``.
    t5_buckets, t5_max_distance
        T5's (unidirectional) bucketing.
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
    ):
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
        if inject == "every" and scheme not in _ADDITIVE:
            raise ValueError(
                f"inject='every' needs scheme 'sinusoidal' or 'learned', got {scheme!r}"
            )
        self.rope_base = rope_base
        head_dim = d_model // heads
        self.embed = nn.Embedding(vocab, d_model)
        n_tables = layers if inject == "every" else 1
        self.tables = None
        self.sinusoid = None
        if scheme == "learned":
            # init 1.0: the token embeddings are N(0, 1) as well
            self.tables = nn.ModuleList(
                posenc.LearnedEmbedding(self.table_len, d_model, init_std=1.0)
                for _ in range(n_tables)
            )
        elif scheme == "sinusoidal":
            self.sinusoid = posenc.SinusoidalEmbedding(d_model)

        def per_layer():
            if scheme == "shaw":
                return posenc.ShawRelativeAttention(head_dim, shaw_clip)
            if scheme == "transformer_xl":
                return posenc.TransformerXLScheme(heads, head_dim, d_model=d_model)
            if scheme == "da":
                return posenc.DAAttention(heads)
            return None

        self.blocks = nn.ModuleList(_Block(d_model, heads, per_layer()) for _ in range(layers))
        # schemes shared by every layer
        self.shared = None
        if scheme == "t5":
            self.shared = posenc.T5RelativeBias(
                heads,
                bidirectional=False,
                num_buckets=t5_buckets,
                max_distance=(
                    max(train_len, t5_buckets) if t5_max_distance is None else t5_max_distance
                ),
            )
        self._alibi = posenc.ALiBi(heads) if scheme == "alibi" else None
        self._rope = None
        self.set_rope_scaling(None)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)

    # ------------------------------------------------------------------ positions

    def set_rope_scaling(self, scaling) -> None:
        """Use RoPE with ``scaling`` (a :class:`posenc.RopeScaling` or ``None``) from now on."""
        if self.scheme != "rope":
            if scaling is not None:
                raise ValueError(f"scaling needs scheme 'rope', got scheme {self.scheme!r}")
            return
        self._rope = posenc.RotaryEmbedding(
            self.d_model // self.heads, base=self.rope_base, scaling=scaling
        )

    @property
    def max_len(self) -> int | None:
        """Longest input the model can run on: ``table_len`` for learned tables, else ``None``."""
        return self.table_len if self.scheme == "learned" else None

    def check_length(self, length, name: str = "length") -> int:
        """Return ``length`` if the model can run on it, else raise ``ValueError``."""
        length = check_int(name, length, minimum=1)
        if self.max_len is not None and length > self.max_len:
            raise ValueError(
                f"{name} must be at most {self.max_len} for scheme 'learned' (its table has "
                f"{self.max_len} rows, positions 0..{self.max_len - 1}), got {length}"
            )
        return length

    def _encoding(self, block: _Block):
        if block.encoding is not None:
            return block.encoding
        return {"rope": self._rope, "alibi": self._alibi, "t5": self.shared}.get(self.scheme)

    def _add_position(self, x: torch.Tensor, layer: int) -> torch.Tensor:
        if self.scheme == "sinusoidal":
            return self.sinusoid(x)
        table = self.tables[layer if self.inject == "every" else 0]
        return x + table(x.shape[1])

    # ------------------------------------------------------------------ forward

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``(batch, seq, vocab)`` for int64 ``tokens (batch, seq)``."""
        if not isinstance(tokens, torch.Tensor) or tokens.dim() != 2:
            raise TypeError("tokens must be an int64 tensor of shape (batch, seq)")
        self.check_length(tokens.shape[1], "seq")
        x = self.embed(tokens)
        for i, block in enumerate(self.blocks):
            if self.scheme in _ADDITIVE and (i == 0 or self.inject == "every"):
                x = self._add_position(x, i)
            x = block(x, self._encoding(block))
        return self.head(self.ln_f(x))

    def extra_repr(self) -> str:
        return f"scheme={self.scheme!r}, train_len={self.train_len}, inject={self.inject!r}"


def num_parameters(model: nn.Module) -> int:
    """Trainable parameter count."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
